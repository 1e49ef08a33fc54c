//! The prompt tail (docs/package-contract.md §4.4): rows left over after the whole prefill chunks are either
//! stepped through the decode graph one by one (correct with every package) or run as one
//! chunk padded to `N` rows, when the package says its prefill graph takes pads
//! (`"prefill_pads": true`) and the tail has at least `prefill_min_tail` rows.
//!
//! Where the pads go and how they are marked is not published: a graph compiled for pads in
//! front ([`TailMode::PadsFirst`]) gives wrong state, K/V and logits to a runtime that puts
//! them after the real rows, and the other way round, and one that recognises its pads by
//! their rope or mask row ([`PadMarking`]) takes pads marked otherwise for real rows.
//! [`PrefillTail::Auto`] therefore measures all eight combinations once per package
//! ([`crate::calibrate`]) and caches the answer ([`crate::tail_cache`]); [`plan`] decides
//! everything that needs no graph run. A forced `pads_first` / `pads_last` uses the default
//! marking (cos 1 / sin 0, fully masked).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use vlm::package::ModelConfig;

pub use crate::pad_marking::{PadMarking, PadMask, PadRope};

/// How a prompt tail is run ([`crate::BpuOptions::prefill_tail`]; parses `auto`, `stepped`,
/// `pads_first`, `pads_last`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefillTail {
    /// Padded when the package sets `prefill_pads` and a calibration at open finds the
    /// layout (cached per package), else stepped.
    #[default]
    Auto,
    /// Always stepped row by row through the decode graph.
    Stepped,
    /// Padded, pads in front of the real rows (when the package sets `prefill_pads`).
    PadsFirst,
    /// Padded, pads after the real rows (when the package sets `prefill_pads`).
    PadsLast,
}

impl PrefillTail {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Stepped => "stepped",
            Self::PadsFirst => "pads_first",
            Self::PadsLast => "pads_last",
        }
    }
}

impl fmt::Display for PrefillTail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PrefillTail {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "stepped" => Ok(Self::Stepped),
            "pads_first" => Ok(Self::PadsFirst),
            "pads_last" => Ok(Self::PadsLast),
            other => Err(format!(
                "prefill tail {other:?}: expected auto, stepped, pads_first or pads_last"
            )),
        }
    }
}

/// What the backend does with a tail (the `prefill_tail` of `vlm check --report --json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TailMode {
    Stepped,
    PadsFirst,
    PadsLast,
}

impl TailMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stepped => "stepped",
            Self::PadsFirst => "pads_first",
            Self::PadsLast => "pads_last",
        }
    }

    /// Where the pads go, `None` when stepped.
    pub fn layout(self) -> Option<PadLayout> {
        match self {
            Self::Stepped => None,
            Self::PadsFirst => Some(PadLayout::First),
            Self::PadsLast => Some(PadLayout::Last),
        }
    }
}

impl fmt::Display for TailMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the `N − t` pad rows of a padded chunk with `t` real rows go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PadLayout {
    /// Rows `0..N−t` are pads, the real rows last.
    First,
    /// Rows `0..t` are real, the pads after them.
    Last,
}

impl PadLayout {
    pub fn mode(self) -> TailMode {
        match self {
            Self::First => TailMode::PadsFirst,
            Self::Last => TailMode::PadsLast,
        }
    }
}

/// The tail decision of an open backend, with how it was reached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TailDecision {
    pub mode: TailMode,
    /// Rope values of the pad rows (`None` when stepped).
    #[serde(default)]
    pub pad_rope: Option<PadRope>,
    /// Mask row of the pad rows (`None` when stepped).
    #[serde(default)]
    pub pad_mask: Option<PadMask>,
    /// What was asked for.
    pub requested: PrefillTail,
    /// Shortest tail that is padded (`prefill_min_tail`, at least 2); `None` when stepped.
    pub min_tail: Option<usize>,
    /// Rows per prefill chunk (0 without a prefill graph).
    pub chunk: usize,
    /// One sentence: why this mode.
    pub reason: String,
    /// The calibration that chose it (`auto` on a package with `prefill_pads`).
    pub calibration: Option<Calibration>,
    /// The calibration was read from the cache, not run at this start.
    pub cached: bool,
}

impl TailDecision {
    /// A stepped decision (no pads, no calibration).
    pub(crate) fn stepped(requested: PrefillTail, chunk: usize, reason: String) -> Self {
        Self {
            mode: TailMode::Stepped,
            pad_rope: None,
            pad_mask: None,
            requested,
            min_tail: None,
            chunk,
            reason,
            calibration: None,
            cached: false,
        }
    }

    /// Padded with `m`.
    pub(crate) fn set_padded(&mut self, m: PadMarking, min_tail: usize) {
        self.mode = m.layout.mode();
        self.pad_rope = Some(m.rope);
        self.pad_mask = Some(m.mask);
        self.min_tail = Some(min_tail);
    }

    /// How pads are laid out and marked; `None` when stepped.
    pub fn marking(&self) -> Option<PadMarking> {
        Some(PadMarking {
            layout: self.mode.layout()?,
            rope: self.pad_rope.unwrap_or_default(),
            mask: self.pad_mask.unwrap_or_default(),
        })
    }
}

/// The figures of one calibration: a fixed prompt run stepped and as one padded chunk with
/// each [`PadMarking`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Rows of the calibration prompt that go into the padded chunk (its real rows).
    pub prompt_rows: usize,
    /// Rows stepped before that chunk in every run, so that the chunk meets a non-empty
    /// window, as a tail after whole chunks does.
    pub prefix_rows: usize,
    /// Stepped run: the next token and its lead over the runner-up, in logits.
    pub top1: u32,
    pub margin: f32,
    /// Stepped run: the top-1 token one decode step later.
    pub top1_step: u32,
    /// A marking is kept when both cosines are at least this and both top-1 tokens agree.
    pub threshold: f32,
    /// One per [`PadMarking::all`], in that order: every trial runs.
    pub trials: Vec<PadTrial>,
    /// Wall time of the calibration runs.
    pub seconds: f64,
}

/// One padded marking against stepping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PadTrial {
    pub marking: PadMarking,
    /// Cosine of the centred next-token logits, padded vs stepped.
    pub cos_next: Option<f32>,
    /// The same after one further decode step (which reads the K/V window the runtime fixed
    /// up after the padded chunk, and the GDN state the pads may have touched).
    pub cos_step: Option<f32>,
    pub top1_next: Option<u32>,
    pub top1_step: Option<u32>,
    /// Both top-1 tokens are the stepped run's.
    pub top1_agree: bool,
    /// The runs failed (the marking is not kept).
    pub error: Option<String>,
}

impl PadTrial {
    /// The smaller of the two cosines (the trial's figure of merit); `None` after an error.
    pub fn score(&self) -> Option<f32> {
        match (self.cos_next, self.cos_step, &self.error) {
            (Some(a), Some(b), None) => Some(a.min(b)),
            _ => None,
        }
    }

    /// Whether the trial may be kept: no error, top-1 agreement at both steps and both
    /// cosines at least [`COSINE_MIN`].
    pub fn passes(&self) -> bool {
        self.top1_agree && self.score().is_some_and(|s| s >= COSINE_MIN)
    }

    /// One line for logs and reports.
    pub fn summary(&self) -> String {
        let m = self.marking;
        match (&self.error, self.cos_next, self.cos_step) {
            (Some(e), ..) => format!("{m}: no figures ({e})"),
            (None, Some(a), Some(b)) => format!(
                "{m}: cosine {a:.4} next token, {b:.4} one step later (top-1 {} / {}, {})",
                self.top1_next.map_or("-".into(), |t| t.to_string()),
                self.top1_step.map_or("-".into(), |t| t.to_string()),
                if self.top1_agree { "agrees" } else { "differs" },
            ),
            _ => format!("{m}: no figures"),
        }
    }
}

/// Cosine both steps must reach for a padded layout to be kept (int8 prefill and decode
/// graphs differ slightly, so identical top-1 is not demanded).
pub const COSINE_MIN: f32 = 0.99;

/// What to do before the first request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Plan {
    /// Nothing to run: the decision is known.
    Decided(TailDecision),
    /// `auto` on a package with padded prefill: calibrate (or read the cache).
    Calibrate { min_tail: usize, chunk: usize },
}

/// What a package, a request and the loaded graphs decide without any graph run.
/// `chunk` is 0 without a usable prefill graph; `no_prefill_graph` says it was turned off;
/// `has_weights` is `Some(false)` for a simulator package without weights.
pub(crate) fn plan(
    requested: PrefillTail,
    cfg: &ModelConfig,
    chunk: usize,
    no_prefill_graph: bool,
    has_weights: Option<bool>,
) -> Plan {
    let stepped =
        |reason: &str| Plan::Decided(TailDecision::stepped(requested, chunk, reason.to_owned()));
    if no_prefill_graph {
        return stepped("the prefill graph is turned off: every row is stepped");
    }
    if chunk < 2 {
        return stepped("no usable prefill graph: every row is stepped");
    }
    if requested == PrefillTail::Stepped {
        return stepped("stepped as requested");
    }
    if !cfg.prefill_pads {
        return stepped("the package does not set `prefill_pads`: the tail is stepped");
    }
    let min_tail = cfg.prefill_min_tail.map_or(chunk, |m| m as usize).max(2);
    if min_tail >= chunk {
        return stepped(&format!(
            "`prefill_min_tail` {min_tail} is not below the chunk of {chunk}: every tail is stepped"
        ));
    }
    match requested {
        PrefillTail::PadsFirst | PrefillTail::PadsLast => {
            let layout = if requested == PrefillTail::PadsFirst {
                PadLayout::First
            } else {
                PadLayout::Last
            };
            // Forced: the default marking (only a calibration picks another).
            let m = PadMarking::default_for(layout);
            let mut d = TailDecision::stepped(
                requested,
                chunk,
                format!(
                    "{} as requested ({m}; tails of {min_tail}..{chunk} rows)",
                    layout.mode()
                ),
            );
            d.set_padded(m, min_tail);
            Plan::Decided(d)
        }
        _ if has_weights == Some(false) => stepped(
            "the package has no weights (synthetic logits), so the pad layout cannot be \
             calibrated: the tail is stepped (pass pads_first or pads_last to time a padded tail)",
        ),
        _ => Plan::Calibrate { min_tail, chunk },
    }
}

/// Picks the marking from calibration trials: among those that pass ([`PadTrial::passes`]),
/// the one closest to stepping by its worse cosine; a tie goes to the earlier trial.
pub(crate) fn choose(trials: &[PadTrial]) -> Option<PadMarking> {
    let mut best: Option<(PadMarking, f32)> = None;
    for t in trials.iter().filter(|t| t.passes()) {
        let s = t.score().unwrap_or(f32::NEG_INFINITY);
        if best.is_none_or(|(_, b)| s > b) {
            best = Some((t.marking, s));
        }
    }
    best.map(|(m, _)| m)
}

/// Cosine of two logits rows after subtracting each row's mean: a language model's logits
/// share a large common offset that would make any two rows look alike.
pub(crate) fn centred_cosine(a: &[f32], b: &[f32]) -> Option<f32> {
    if a.len() != b.len() || a.is_empty() {
        return None;
    }
    let n = a.len() as f64;
    let ma = a.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let mb = b.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let (mut ab, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x) - ma, f64::from(y) - mb);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    let c = ab / (aa.sqrt() * bb.sqrt());
    c.is_finite().then_some(c as f32)
}

/// The top id of a logits row and its lead over the runner-up.
pub(crate) fn top1(l: &[f32]) -> Option<(u32, f32)> {
    let (mut best, mut second) = (None::<(usize, f32)>, f32::NEG_INFINITY);
    for (i, &v) in l.iter().enumerate() {
        match best {
            Some((_, b)) if v <= b => second = second.max(v),
            _ => {
                if let Some((_, b)) = best {
                    second = second.max(b);
                }
                best = Some((i, v));
            }
        }
    }
    best.and_then(|(i, b)| Some((u32::try_from(i).ok()?, b - second)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trial(m: PadMarking, a: f32, b: f32) -> PadTrial {
        PadTrial {
            marking: m,
            cos_next: Some(a),
            cos_step: Some(b),
            top1_next: Some(1),
            top1_step: Some(2),
            top1_agree: true,
            error: None,
        }
    }

    #[test]
    fn parses_and_prints_every_mode() {
        for m in ["auto", "stepped", "pads_first", "pads_last"] {
            assert_eq!(m.parse::<PrefillTail>().unwrap().to_string(), m);
        }
        assert!("padded".parse::<PrefillTail>().is_err());
    }

    #[test]
    fn the_closest_passing_marking_is_kept() {
        let all = PadMarking::all();
        let f = trial(all[0], 0.999, 0.995);
        let l = trial(all[4], 0.3, 0.1);
        assert_eq!(choose(&[f.clone(), l.clone()]), Some(all[0]));
        // Both above: the closer one (by the worse of its two steps); one step below the
        // threshold disqualifies.
        let l2 = trial(all[7], 0.9995, 0.9991);
        assert_eq!(choose(&[f.clone(), l2.clone()]), Some(all[7]));
        let low = trial(all[0], 0.999, 0.98);
        assert_eq!(choose(&[low, l.clone()]), None);
        let failed = PadTrial {
            error: Some("device".into()),
            ..f.clone()
        };
        assert_eq!(choose(&[failed]), None);
        // A top-1 disagreement disqualifies even a high cosine.
        let disagree = PadTrial {
            top1_agree: false,
            ..l2.clone()
        };
        assert_eq!(choose(&[f.clone(), disagree]), Some(all[0]));
        // A tie goes to the earlier trial.
        let tie = trial(all[5], 0.999, 0.995);
        assert_eq!(choose(&[f.clone(), tie.clone()]), Some(all[0]));
        assert_eq!(choose(&[tie, f]), Some(all[5]));
    }

    #[test]
    fn a_forced_layout_uses_the_default_marking() {
        let text = r#"{
            "name": "t", "arch": "hybrid", "backend": "native", "hbm": "model.hbm",
            "hbm_prefill": "model_prefill.hbm", "tokenizer": "tokenizer.json",
            "embed": "embed_tokens.bin", "eos": [2], "cache_len": 512, "graph": "qwen35",
            "chat": {"format": "chatml", "im_start": 1, "im_end": 2, "system": "s"},
            "rope_theta": 10000000, "mrope_section": [11, 11, 10], "mrope_interleaved": true,
            "prefill_pads": true, "prefill_min_tail": 4, "dialect": "qwen3.5"
        }"#;
        let cfg = ModelConfig::parse(
            text,
            std::path::Path::new("/pkg"),
            std::path::Path::new("/pkg/model.json"),
            vlm::package::LoadOptions::default(),
        )
        .unwrap();
        for (req, layout) in [
            (PrefillTail::PadsFirst, PadLayout::First),
            (PrefillTail::PadsLast, PadLayout::Last),
        ] {
            let Plan::Decided(d) = plan(req, &cfg, 32, false, None) else {
                panic!("{req}: not decided");
            };
            assert_eq!(d.marking(), Some(PadMarking::default_for(layout)));
            assert_eq!(d.pad_rope, Some(PadRope::Identity));
            assert_eq!(d.pad_mask, Some(PadMask::Masked));
        }
        let Plan::Decided(d) = plan(PrefillTail::Stepped, &cfg, 32, false, None) else {
            panic!("stepped: not decided");
        };
        assert_eq!((d.marking(), d.pad_rope, d.pad_mask), (None, None, None));
    }

    #[test]
    fn centred_cosine_ignores_a_common_offset() {
        let a = [1.0, 2.0, 3.0, 4.0];
        let b = [11.0, 12.0, 13.0, 14.0];
        assert!((centred_cosine(&a, &b).unwrap() - 1.0).abs() < 1e-6);
        let c = [4.0, 3.0, 2.0, 1.0];
        assert!((centred_cosine(&a, &c).unwrap() + 1.0).abs() < 1e-6);
        assert_eq!(centred_cosine(&[1.0, 1.0], &[1.0, 2.0]), None);
    }

    #[test]
    fn top1_and_margin() {
        assert_eq!(top1(&[0.5, 3.0, 1.0]), Some((1, 2.0)));
        assert_eq!(top1(&[3.0, 0.5, 1.0]), Some((0, 2.0)));
        assert_eq!(top1(&[]), None);
    }
}
