//! `vlm bench --host-overhead --json-schema FILE`: host time per decode step with a JSON schema
//! active, median and p95, next to free text with the same sampling.
//!
//! Each step is timed at the graph-call boundary: a [`Timed`] backend notes the wall clock and
//! the simulator's graph time at every decode graph call, so a step's host time is the time
//! from one call to the next minus the graph time between them — the sampler (and the mask
//! with a schema), detokenisation, embedding row, rope, mask, input writes, logits read. A
//! timing wrapper around the constraint gives its own share (mask + accept) per step.
//!
//! A bounded schema ends its value after some tokens; answers are repeated (reset, prefill,
//! decode) until `steps × repeats` steps are timed (an answer may run to `8 × steps` tokens).
//! No eos: a value ends when nothing can follow it, free text at the step limit.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{json, Value};
use vlm::chat::{Pos3, SystemOptions, UserTurn};
use vlm::engine::{
    Backend, BackendInfo, ConstraintOutcome, DecodeOptions, Engine, EngineError, StateBlob,
};
use vlm::sampler::{ConstraintError, Sampler, SamplingParams, TokenConstraint, TokenMask};
use vlm::stream::StreamConfig;
use vlm::structured::JsonSchemas;
use vlm::vision::PixelValues;
use vlm_bpu::BpuBackend;

use super::Setup;

/// A backend that notes (wall clock, graph time) before each graph call.
struct Timed<'a> {
    inner: &'a mut BpuBackend,
    marks: Vec<(Instant, Duration)>,
}

impl Timed<'_> {
    fn mark(&mut self) {
        self.marks.push((Instant::now(), self.inner.graph_time()));
    }

    /// Host time of each interval between two marks (ms): wall − graph.
    fn host_ms(&self) -> Vec<f64> {
        self.marks
            .windows(2)
            .map(|w| {
                let wall = w[1].0 - w[0].0;
                let graph = w[1].1.saturating_sub(w[0].1);
                wall.saturating_sub(graph).as_secs_f64() * 1e3
            })
            .collect()
    }
}

impl Backend for Timed<'_> {
    fn info(&self) -> &BackendInfo {
        self.inner.info()
    }
    fn embed(&self, ids: &[u32], out: &mut Vec<f32>) -> Result<(), EngineError> {
        self.inner.embed(ids, out)
    }
    fn encode_image(&mut self, pixels: &PixelValues) -> Result<Vec<f32>, EngineError> {
        self.inner.encode_image(pixels)
    }
    fn run_rows(&mut self, rows: &[f32], positions: &[Pos3]) -> Result<(), EngineError> {
        self.mark();
        self.inner.run_rows(rows, positions)
    }
    fn consumed(&self) -> usize {
        self.inner.consumed()
    }
    fn max_pos(&self) -> Option<u32> {
        self.inner.max_pos()
    }
    fn last_logits(&self) -> Option<&[f32]> {
        self.inner.last_logits()
    }
    fn reset(&mut self) -> Result<(), EngineError> {
        self.inner.reset()
    }
    fn snapshot(&mut self) -> Result<StateBlob, EngineError> {
        self.inner.snapshot()
    }
    fn restore(&mut self, blob: &StateBlob) -> Result<(), EngineError> {
        self.inner.restore(blob)
    }
    fn step_interruptible(
        &mut self,
        rows: &[f32],
        positions: &[Pos3],
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<bool, EngineError> {
        self.mark();
        self.inner.step_interruptible(rows, positions, interrupt)
    }
}

/// The constraint's own time per step (mask + accept), in ms.
struct TimedConstraint<'a> {
    inner: &'a mut dyn TokenConstraint,
    step: Duration,
    per_step: Vec<f64>,
}

impl TokenConstraint for TimedConstraint<'_> {
    fn next_mask(&mut self, mask: &mut TokenMask) -> Result<(), ConstraintError> {
        let t = Instant::now();
        let r = self.inner.next_mask(mask);
        self.step = t.elapsed();
        r
    }
    fn accept(&mut self, id: u32) -> Result<(), ConstraintError> {
        let t = Instant::now();
        let r = self.inner.accept(id);
        self.per_step
            .push((self.step + t.elapsed()).as_secs_f64() * 1e3);
        r
    }
    fn is_finished(&self) -> bool {
        self.inner.is_finished()
    }
    fn is_complete(&mut self) -> bool {
        self.inner.is_complete()
    }
}

/// Median and 95th percentile (nearest rank) of `v`.
fn median_p95(v: &[f64]) -> Value {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let at = |q: f64| -> Option<f64> {
        if s.is_empty() {
            return None;
        }
        let i = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1;
        Some(s[i])
    };
    json!({"median": super::median(&s), "p95": at(0.95), "n": s.len()})
}

/// Timed decode steps: (host ms per step, constraint ms per step, answers, complete ones).
struct Measured {
    host: Vec<f64>,
    constraint: Vec<f64>,
    answers: usize,
    complete: usize,
    tokens: usize,
}

fn measure(
    s: &mut Setup,
    schema: Option<&vlm::structured::JsonSchema>,
    params: &SamplingParams,
    want: usize,
    max_new: usize,
) -> anyhow::Result<Measured> {
    let prompt = s.template.render(
        Some(&SystemOptions::default()),
        &UserTurn {
            text: "List the objects you see as JSON.",
            images: Vec::new(),
            thinking: false,
        },
    )?;
    let tokenizer = s.engine.tokenizer().clone();
    let mut m = Measured {
        host: Vec::new(),
        constraint: Vec::new(),
        answers: 0,
        complete: 0,
        tokens: 0,
    };
    while m.host.len() < want {
        let backend = s.engine.backend_mut();
        backend.reset()?;
        let mut engine = Engine::new(
            Timed {
                inner: backend,
                marks: Vec::new(),
            },
            tokenizer.clone(),
        );
        engine.prefill(&prompt, &[], &mut || false)?;
        let mut sampler = Sampler::new(params.clone())?;
        let stream = StreamConfig::new(Vec::new(), max_new);
        engine.backend_mut().marks.clear();
        engine.backend_mut().mark();
        let g = match schema {
            Some(schema) => {
                let mut c = schema.constraint(&[]);
                let mut timed = TimedConstraint {
                    inner: &mut c,
                    step: Duration::ZERO,
                    per_step: Vec::new(),
                };
                let g = engine.decode_constrained(&mut sampler, &mut timed, stream, &mut |_| {})?;
                m.constraint.extend(timed.per_step);
                g
            }
            None => engine.decode(&mut sampler, stream, DecodeOptions::default(), &mut |_| {})?,
        };
        engine.backend_mut().mark();
        m.answers += 1;
        m.complete += usize::from(g.constraint == Some(ConstraintOutcome::Complete));
        m.tokens += g.completion.tokens.len();
        // One interval per sampled token; a value's last token is fed before decoding
        // stops, which leaves one more (empty) interval.
        let mut host = engine.backend().host_ms();
        host.truncate(g.completion.tokens.len());
        m.host.extend(host);
    }
    Ok(m)
}

/// The `json_schema` object of the host-overhead report.
pub(super) fn schema_overhead(
    s: &mut Setup,
    file: &Path,
    steps: usize,
    repeats: usize,
) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading the JSON schema {}", file.display()))?;
    let vocab = s.engine.backend().info().vocab;
    let schemas = JsonSchemas::new(s.engine.tokenizer().clone(), vocab);
    let t = Instant::now();
    schemas.prepare()?;
    let table_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let schema = schemas
        .compile(&text)
        .with_context(|| format!("JSON schema {}", file.display()))?;
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    schemas.compile(&text)?;
    let cached_us = t.elapsed().as_secs_f64() * 1e6;
    let want = steps * repeats;
    let mut rows = Vec::new();
    for (name, params) in [
        ("greedy", SamplingParams::default()),
        (
            "non_thinking",
            SamplingParams {
                seed: Some(7),
                // The penalties a schema turns off (front ends' default).
                presence_penalty: 0.0,
                ..SamplingParams::qwen35_non_thinking()
            },
        ),
    ] {
        // Warm-up: page cache, allocator, the lexer states of the first masks.
        measure(s, Some(&schema), &params, 8, steps)?;
        measure(s, None, &params, 8, steps)?;
        let free = measure(s, None, &params, want, steps)?;
        // A value may need more than `steps` tokens: room to complete it.
        let constrained = measure(s, Some(&schema), &params, want, 8 * steps)?;
        rows.push(json!({
            "sampling": name,
            "free_text_host_ms_per_step": median_p95(&free.host),
            "json_schema_host_ms_per_step": median_p95(&constrained.host),
            "json_schema_constraint_ms_per_step": median_p95(&constrained.constraint),
            "json_schema_answers": constrained.answers,
            "json_schema_complete": constrained.complete,
            "json_schema_tokens_per_answer": constrained.tokens as f64 / constrained.answers.max(1) as f64,
        }));
    }
    Ok(json!({
        "file": file,
        "bytes": text.len(),
        "token_table_ms": table_ms,
        "compile_ms": compile_ms,
        "compile_cached_us": cached_us,
        "results": rows,
    }))
}
