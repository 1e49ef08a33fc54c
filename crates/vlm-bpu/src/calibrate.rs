//! Deciding the prompt tail at open ([`crate::tail`]): what needs no graph run is decided by
//! [`crate::tail::plan`]; `auto` on a package with `prefill_pads` reads the cache, else
//! calibrates. The calibration steps one prefix row through the decode graph (so that the
//! padded chunk meets a non-empty window and GDN state, as a tail after whole chunks does,
//! and so that no real row sits at position 0 with nothing before it), then runs the next
//! `t` rows (`prefill_min_tail ≤ t < N`) stepped and, from a snapshot of the prefix state,
//! as one padded chunk with each of the eight [`PadMarking`]s (layout × pad rope × pad mask
//! row), each followed by one decode step (which reads the K/V window the runtime fixed up
//! after the chunk and the GDN state the pads may have touched). All eight always run, so
//! the report shows every figure even when none passes. It keeps the passing marking closest
//! to stepping ([`crate::tail::choose`]). Cost, once per package: `t + 2` decode runs for
//! the stepped reference, then 8 × (one padded chunk + one decode step + a state restore);
//! the state is cleared afterwards.

use std::path::Path;
use std::time::Instant;

use vlm::chat::Pos3;
use vlm::engine::{Backend, EngineError, StateBlob};

use crate::tail::{
    centred_cosine, choose, plan, top1, Calibration, PadMarking, PadTrial, Plan, TailDecision,
    TailMode, COSINE_MIN,
};
use crate::{tail_cache, BpuBackend, BpuError, BpuOptions};

/// The calibration prompt: a sequence a language model continues with one obvious token
/// (" August"), so the stepped run has a large top-1 margin. Its last `t` tokens are used.
const PROMPT: &str = "January February March April May June July";

/// Rows of the padded chunk unless `prefill_min_tail` asks for more.
const CAL_ROWS: usize = 8;

/// Rows stepped before the padded chunk.
const PREFIX: usize = 1;

/// The stepped reference of a calibration: the state after the prefix, next-token logits,
/// the token fed next, and the logits and top-1 after that decode step.
struct Reference {
    prefix: StateBlob,
    next: Vec<f32>,
    token: u32,
    margin: f32,
    step: Vec<f32>,
    top1_step: u32,
}

impl BpuBackend {
    /// Sets [`BpuBackend::tail_decision`] for `opts` (state must be empty; it is cleared
    /// again after a calibration). `has_weights` is `Some(false)` for a simulator package
    /// without weights.
    pub(crate) fn decide_tail(
        &mut self,
        dir: &Path,
        opts: &BpuOptions,
        has_weights: Option<bool>,
    ) -> Result<(), BpuError> {
        let chunk = self.info.prefill_chunk;
        let decision = match plan(
            opts.prefill_tail,
            &self.cfg,
            chunk,
            opts.no_prefill_graph,
            has_weights,
        ) {
            Plan::Decided(d) => d,
            Plan::Calibrate { min_tail, chunk } => self.calibrated(dir, opts, min_tail, chunk)?,
        };
        log(&decision);
        self.tail = decision;
        Ok(())
    }

    /// The cached decision for this package and runtime, else a fresh calibration (cached
    /// when it ran to the end).
    fn calibrated(
        &mut self,
        dir: &Path,
        opts: &BpuOptions,
        min_tail: usize,
        chunk: usize,
    ) -> Result<TailDecision, BpuError> {
        let cache = tail_cache::cache_dir(opts.cache_dir.as_deref());
        let key = tail_cache::CacheKey::new(&self.cfg, &self.runtime.versions());
        if let (Some(c), Some(k)) = (&cache, &key) {
            if let Some(mut d) = tail_cache::lookup(c, dir, k) {
                d.cached = true;
                d.requested = opts.prefill_tail;
                return Ok(d);
            }
        }
        let mut d = TailDecision::stepped(opts.prefill_tail, chunk, String::new());
        tracing::info!(
            min_tail,
            chunk,
            "calibrating the padded prompt tail (once per package; the result is cached)"
        );
        let cal = match self.calibrate(min_tail, chunk, opts) {
            Ok(c) => c,
            Err(CalError::Interrupted) => {
                return Err(BpuError::Interrupted {
                    step: "calibrating the prompt tail",
                })
            }
            Err(CalError::Failed(reason)) => {
                // Not cached: the next start tries again.
                d.reason = format!("calibration failed ({reason}): the tail is stepped");
                return Ok(d);
            }
        };
        match choose(&cal.trials) {
            Some(m) => {
                d.set_padded(m, min_tail);
                d.reason = format!(
                    "calibrated: {m} reproduces stepping (top-1 agrees and cosine ≥ \
                     {COSINE_MIN} at both steps; the closest of the passing markings)"
                );
            }
            None => {
                d.reason = format!(
                    "calibrated: none of the {} pad markings reproduces stepping (top-1 \
                     agreement and cosine ≥ {COSINE_MIN} at both steps): the tail is stepped",
                    cal.trials.len()
                );
            }
        }
        d.calibration = Some(cal);
        if let (Some(c), Some(k)) = (&cache, &key) {
            tail_cache::store(c, dir, k, &d);
        } else {
            tracing::info!(
                "no cache folder (set VLM_BPU_CACHE_DIR or HOME): the next start calibrates again"
            );
        }
        Ok(d)
    }

    /// The calibration runs; the state is cleared before the first and after the last.
    fn calibrate(
        &mut self,
        min_tail: usize,
        chunk: usize,
        opts: &BpuOptions,
    ) -> Result<Calibration, CalError> {
        let t0 = Instant::now();
        let ids = self.prompt_ids(min_tail, chunk)?;
        let t = ids.len() - PREFIX;
        // The padded chunk needs N free slots after the prefix, and a decode step follows.
        if self.info.context < PREFIX + chunk + 2 {
            return Err(CalError::Failed(format!(
                "the window of {} rows is too small for a {chunk}-row chunk",
                self.info.context
            )));
        }
        let mut rows = Vec::new();
        self.embed(&ids, &mut rows).map_err(failed)?;
        let positions: Vec<Pos3> = (0..ids.len() as u32).map(Pos3::text).collect();
        let interrupted = || opts.interrupt.is_raised();
        let reference = self.stepped_reference(&rows, &positions, &interrupted);
        let reference = self.cleared(reference)?;
        let h = self.info.hidden;
        let (rows, positions) = (&rows[PREFIX * h..], &positions[PREFIX..]);
        let mut trials = Vec::new();
        for m in PadMarking::all() {
            if interrupted() {
                self.cleared(Ok(()))?;
                return Err(CalError::Interrupted);
            }
            let trial = self.padded_trial(m, rows, positions, &reference);
            tracing::info!("tail calibration: {}", trial.summary());
            trials.push(trial);
        }
        self.cleared(Ok(()))?;
        Ok(Calibration {
            prompt_rows: t,
            prefix_rows: PREFIX,
            top1: reference.token,
            margin: reference.margin,
            top1_step: reference.top1_step,
            threshold: COSINE_MIN,
            trials,
            seconds: t0.elapsed().as_secs_f64(),
        })
    }

    /// The last `PREFIX + t` token ids of the calibration prompt, `t = max(min_tail, 8)` (`t <
    /// chunk`; the prompt repeated in front when the tokenizer makes it shorter). Few real
    /// rows and many pads tell the markings apart best, and each real row is a decode run of
    /// the reference.
    fn prompt_ids(&self, min_tail: usize, chunk: usize) -> Result<Vec<u32>, CalError> {
        let tok = tokenizers::Tokenizer::from_file(&self.cfg.tokenizer)
            .map_err(|e| CalError::Failed(format!("{}: {e}", self.cfg.tokenizer.display())))?;
        let enc = tok
            .encode(PROMPT, false)
            .map_err(|e| CalError::Failed(format!("encoding the prompt: {e}")))?;
        let mut ids = enc.get_ids().to_vec();
        if ids.is_empty() {
            return Err(CalError::Failed("the prompt encodes to no token".into()));
        }
        let want = PREFIX + min_tail.max(CAL_ROWS).min(chunk - 1);
        while ids.len() < want {
            ids.splice(0..0, enc.get_ids().iter().copied());
        }
        Ok(ids.split_off(ids.len() - want))
    }

    /// The prompt stepped row by row (a snapshot taken after the prefix), then one decode
    /// step with its greedy token.
    fn stepped_reference(
        &mut self,
        rows: &[f32],
        positions: &[Pos3],
        interrupted: &dyn Fn() -> bool,
    ) -> Result<Reference, CalError> {
        let h = self.info.hidden;
        let mut prefix = None;
        for (i, p) in positions.iter().enumerate() {
            if interrupted() {
                return Err(CalError::Interrupted);
            }
            if i == PREFIX {
                prefix = Some(self.save_state(None).map_err(failed)?);
            }
            self.run_chunk(&rows[i * h..(i + 1) * h], std::slice::from_ref(p), None)
                .map_err(failed)?;
        }
        let prefix = prefix.ok_or_else(|| CalError::Failed("no row after the prefix".into()))?;
        let next = self.logits_now()?;
        let (token, margin) = top1(&next).ok_or_else(|| CalError::Failed("no logits".into()))?;
        let step = self.decode_one(token)?;
        if step == next {
            // Graphs whose logits do not depend on their input (no weights) cannot tell the
            // markings apart.
            return Err(CalError::Failed(
                "the logits do not depend on the input (a package without weights?)".into(),
            ));
        }
        let (top1_step, _) = top1(&step).ok_or_else(|| CalError::Failed("no logits".into()))?;
        Ok(Reference {
            prefix,
            next,
            token,
            margin,
            step,
            top1_step,
        })
    }

    /// From the prefix state: the rest of the prompt as one chunk padded as `m` says, then
    /// the reference's decode step.
    fn padded_trial(
        &mut self,
        m: PadMarking,
        rows: &[f32],
        positions: &[Pos3],
        r: &Reference,
    ) -> PadTrial {
        let mut trial = PadTrial {
            marking: m,
            cos_next: None,
            cos_step: None,
            top1_next: None,
            top1_step: None,
            top1_agree: false,
            error: None,
        };
        let run = (|| -> Result<(Vec<f32>, Vec<f32>), CalError> {
            self.load_state(&r.prefix).map_err(failed)?;
            self.run_chunk(rows, positions, Some(m)).map_err(failed)?;
            let next = self.logits_now()?;
            let step = self.decode_one(r.token)?;
            Ok((next, step))
        })();
        match run {
            Ok((next, step)) => {
                trial.cos_next = centred_cosine(&r.next, &next);
                trial.cos_step = centred_cosine(&r.step, &step);
                trial.top1_next = top1(&next).map(|(i, _)| i);
                trial.top1_step = top1(&step).map(|(i, _)| i);
                trial.top1_agree =
                    trial.top1_next == Some(r.token) && trial.top1_step == Some(r.top1_step);
                if trial.cos_next.is_none() || trial.cos_step.is_none() {
                    let bad = next.iter().chain(&step).filter(|v| !v.is_finite()).count();
                    let at = if trial.cos_next.is_none() {
                        "next-token"
                    } else {
                        "one-step-later"
                    };
                    trial.error = Some(if bad > 0 {
                        format!("{bad} logits are not finite")
                    } else {
                        format!("the padded run's {at} logits are constant")
                    });
                }
            }
            Err(e) => trial.error = Some(e.to_string()),
        }
        trial
    }

    /// One decode step of `token` at the next position; its logits.
    fn decode_one(&mut self, token: u32) -> Result<Vec<f32>, CalError> {
        let mut row = Vec::new();
        self.embed(&[token], &mut row).map_err(failed)?;
        let p = Pos3::text(self.next_position());
        self.run_chunk(&row, &[p], None).map_err(failed)?;
        self.logits_now()
    }

    fn logits_now(&self) -> Result<Vec<f32>, CalError> {
        self.read_logits()
            .map(<[f32]>::to_vec)
            .ok_or_else(|| CalError::Failed("no logits after the run".into()))
    }

    /// `result`, after clearing the state (a clearing failure wins).
    fn cleared<T>(&mut self, result: Result<T, CalError>) -> Result<T, CalError> {
        self.clear_state().map_err(failed)?;
        result
    }
}

/// Why a calibration did not finish.
#[derive(Debug)]
enum CalError {
    Interrupted,
    Failed(String),
}

impl std::fmt::Display for CalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Interrupted => f.write_str("interrupted"),
            Self::Failed(r) => f.write_str(r),
        }
    }
}

fn failed(e: EngineError) -> CalError {
    CalError::Failed(e.to_string())
}

/// Logs a decision: INFO when it is what was asked or the package allows no better, WARN
/// when `auto` had a padded prefill graph and still steps.
fn log(d: &TailDecision) {
    let figures: Vec<String> = d
        .calibration
        .iter()
        .flat_map(|c| c.trials.iter().map(PadTrial::summary))
        .collect();
    let auto_stepped = d.mode == TailMode::Stepped
        && d.requested == crate::PrefillTail::Auto
        && d.reason.contains("calibrat");
    let no_weights = d.reason.contains("no weights");
    if auto_stepped || no_weights {
        tracing::warn!(
            tail = %d.mode, cached = d.cached, figures = ?figures,
            "prompt tail: {}", d.reason
        );
    } else {
        tracing::info!(
            tail = %d.mode, min_tail = ?d.min_tail, cached = d.cached, figures = ?figures,
            "prompt tail: {}", d.reason
        );
    }
}
