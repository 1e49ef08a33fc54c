//! `vlm bench <PACKAGE>`: load time, text TTFT, image TTFT and decode tok/s, medians over
//! `--repeats` runs (`--json` for one JSON object). On a sim package the graph latencies come
//! from the simulator's timing model (`BPU_SIM_TIMING=s100p` predicts the S100P).
//!
//! The text request is the chat template around `--prompt`, or with `--prompt-tokens N` a
//! prompt of exactly `N` rows (token ids, no template); its TTFT is then the time to the
//! first token's logits (the prompt's prefill), as the seed package's card measures it.
//!
//! `--host-overhead` (sim packages): graph time forced to zero, the per-token cost of
//! everything but the graph — embedding row, rope tables, mask, input writes and CLEAN, logits
//! INVALIDATE and dequantisation, sampling, detokenisation — for greedy and for the model
//! card's non-thinking sampling. With `--json-schema FILE` it adds the host time per decode
//! step with that schema active, median and p95, next to free text (`steps`).

mod state_copy;
mod steps;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use bpu_sim::Implementation;
use clap::Args;

use super::bpu_flags::{BpuFlags, RunFlags};
use serde_json::json;
use vlm::chat::{ChatTemplate, ImageSlot, SystemOptions, UserTurn};
use vlm::engine::{prompt_from_ids, Backend, DecodeOptions, Engine, ImageInput};
use vlm::sampler::{Sampler, SamplingParams};
use vlm::stream::StreamConfig;
use vlm::vision::RgbImage;
use vlm_bpu::{BpuBackend, BpuOptions};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Package folder (model.json).
    #[arg(value_name = "PACKAGE")]
    pub package: PathBuf,
    /// Runs per measurement; medians are reported.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub repeats: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// The user question.
    #[arg(
        long,
        default_value = "What is in this picture? Answer in one sentence."
    )]
    pub prompt: String,
    /// Image for the image TTFT (default: a synthetic 640x480 gradient).
    #[arg(long, value_name = "PNG")]
    pub image: Option<PathBuf>,
    /// Tokens generated per run (decode tok/s is measured over them).
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub max_new: usize,
    /// Text request of exactly N prompt rows (token ids, no chat template); its TTFT is the
    /// time to the first token's logits.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub prompt_tokens: Option<u32>,
    #[command(flatten)]
    pub bpu: BpuFlags,
    #[command(flatten)]
    pub run: RunFlags,
    /// Measure the host overhead per decode step instead (sim packages, graph time zero).
    #[arg(long)]
    pub host_overhead: bool,
    /// Decode steps per host-overhead run.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub steps: usize,
    /// With --host-overhead: also time each decode step with this JSON schema active
    /// (structured output), next to free text. Use the package's real tokenizer: the mask
    /// cost grows with the vocabulary.
    #[arg(long, value_name = "FILE", requires = "host_overhead")]
    pub json_schema: Option<PathBuf>,
}

fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    Some(if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    })
}

fn synthetic_image() -> RgbImage {
    let (w, h) = (640usize, 480usize);
    let mut px = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            px.extend_from_slice(&[
                (x * 255 / w) as u8,
                (y * 255 / h) as u8,
                ((x + y) % 256) as u8,
            ]);
        }
    }
    RgbImage::new(w, h, px).expect("640x480x3 bytes")
}

fn load_image(p: &Path) -> anyhow::Result<RgbImage> {
    let img = image::open(p)
        .with_context(|| format!("decoding image {}", p.display()))?
        .to_rgb8();
    let (w, h) = (img.width() as usize, img.height() as usize);
    RgbImage::new(w, h, img.into_raw()).with_context(|| format!("image {}", p.display()))
}

struct Setup {
    engine: Engine<BpuBackend>,
    template: ChatTemplate,
    load_s: Vec<f64>,
}

fn open(args: &BenchArgs, vision: bool) -> anyhow::Result<Setup> {
    let mut opts = BpuOptions {
        no_vision: !vision,
        ..BpuOptions::default()
    };
    args.bpu.apply(&mut opts);
    args.run.apply(&mut opts);
    let mut load_s = Vec::new();
    let mut last: Option<BpuBackend> = None;
    for _ in 0..args.repeats.max(1) {
        // Drop the previous instance first: one engine per board.
        drop(last.take());
        let t = Instant::now();
        let b = BpuBackend::open(&args.package, &opts)
            .with_context(|| format!("opening {}", args.package.display()))?;
        load_s.push(t.elapsed().as_secs_f64());
        last = Some(b);
    }
    let backend = last.context("no repeat ran")?;
    let cfg = backend.config();
    let tok = tokenizers::Tokenizer::from_file(&cfg.tokenizer)
        .map_err(|e| anyhow::anyhow!("{}: {e}", cfg.tokenizer.display()))?;
    let tok = Arc::new(tok);
    let template = ChatTemplate::new(tok.clone(), &cfg.chat, cfg.dialect.clone())?;
    Ok(Setup {
        engine: Engine::new(backend, tok),
        template,
        load_s,
    })
}

/// One request from an empty state: (TTFT s, decode tok/s, prompt rows).
fn request(
    s: &mut Setup,
    args: &BenchArgs,
    image: Option<&RgbImage>,
) -> anyhow::Result<(f64, Option<f64>, usize)> {
    s.engine.backend_mut().reset()?;
    let slots = match (image, s.engine.backend().info().vision) {
        (Some(_), Some(v)) => vec![ImageSlot::square(v.geometry.merged_side() as u32)],
        (Some(_), None) => bail!("the package has no vision tower"),
        _ => Vec::new(),
    };
    let prompt = s.template.render(
        Some(&SystemOptions::default()),
        &UserTurn {
            text: &args.prompt,
            images: slots,
            thinking: false,
        },
    )?;
    let images: Vec<ImageInput> = image
        .map(|i| ImageInput::Rgb(i.clone()))
        .into_iter()
        .collect();
    let mut sampler = Sampler::new(SamplingParams::default())?;
    // No eos: every run decodes `max_new` tokens, whatever the (possibly weightless) model says.
    let stream = StreamConfig::new(Vec::new(), args.max_new.max(1));
    let g = s.engine.generate(
        &prompt,
        &images,
        &mut sampler,
        stream,
        DecodeOptions::default(),
        &mut |_| {},
    )?;
    let t = g.completion.timings;
    let ttft = t.ttft.context("no token was generated")?.as_secs_f64();
    Ok((ttft, t.decode_tokens_per_s, prompt.rows()))
}

/// `n` token ids of a fixed English passage (repeated as needed): a text prompt of exactly
/// `n` rows.
fn prompt_ids(s: &Setup, n: usize) -> anyhow::Result<Vec<u32>> {
    const PASSAGE: &str = "The quick brown fox jumps over the lazy dog while the camera \
        watches the yard, and the robot waits for its next instruction. ";
    let enc = s
        .engine
        .tokenizer()
        .encode(PASSAGE, false)
        .map_err(|e| anyhow::anyhow!("encoding the bench passage: {e}"))?;
    let ids = enc.get_ids();
    if ids.is_empty() {
        bail!("the tokenizer encodes the bench passage to no token");
    }
    Ok(ids.iter().copied().cycle().take(n).collect())
}

/// One request of exactly `ids.len()` prompt rows from an empty state: (time to the first
/// token's logits s, decode tok/s, rows).
fn ids_request(
    s: &mut Setup,
    args: &BenchArgs,
    ids: &[u32],
) -> anyhow::Result<(f64, Option<f64>, usize)> {
    s.engine.backend_mut().reset()?;
    let prompt = prompt_from_ids(ids, u32::MAX, 1)?;
    let t0 = Instant::now();
    s.engine.prefill(&prompt, &[], &mut || false)?;
    let ttft = t0.elapsed().as_secs_f64();
    let mut sampler = Sampler::new(SamplingParams::default())?;
    let g = s.engine.decode(
        &mut sampler,
        StreamConfig::new(Vec::new(), args.max_new.max(1)),
        DecodeOptions::default(),
        &mut |_| {},
    )?;
    Ok((ttft, g.completion.timings.decode_tokens_per_s, ids.len()))
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    if args.host_overhead {
        return host_overhead(args);
    }
    let image = match &args.image {
        Some(p) => load_image(p)?,
        None => synthetic_image(),
    };
    let mut s = open(args, true)?;
    let has_vision = s.engine.backend().info().vision.is_some();
    let implementation = s.engine.backend().implementation();
    let (mut text_ttft, mut img_ttft, mut tps) = (Vec::new(), Vec::new(), Vec::new());
    let (mut text_rows, mut img_rows) = (0, 0);
    let ids = match args.prompt_tokens {
        Some(n) => Some(prompt_ids(&s, n as usize)?),
        None => None,
    };
    for _ in 0..args.repeats.max(1) {
        let (t, d, rows) = match &ids {
            Some(ids) => ids_request(&mut s, args, ids)?,
            None => request(&mut s, args, None)?,
        };
        text_ttft.push(t);
        tps.extend(d);
        text_rows = rows;
        if has_vision {
            let (t, _, rows) = request(&mut s, args, Some(&image))?;
            img_ttft.push(t);
            img_rows = rows;
        }
    }
    let timing = std::env::var(bpu_sim::config::TIMING_ENV).ok();
    let tail = s.engine.backend().tail_decision().clone();
    let r = json!({
        "package": args.package,
        "implementation": implementation.to_string(),
        "sim_timing": if implementation == Implementation::Sim { timing.clone() } else { None },
        "repeats": args.repeats.max(1),
        "prefill_chunk": s.engine.backend().info().prefill_chunk,
        "prefill_tail": tail.mode,
        "prefill_tail_reason": tail.reason,
        "text_prompt": if ids.is_some() { "token ids" } else { "chat template" },
        "text_prompt_rows": text_rows,
        "image_prompt_rows": if has_vision { Some(img_rows) } else { None },
        "load_s": median(&s.load_s),
        "text_ttft_s": median(&text_ttft),
        "image_ttft_s": median(&img_ttft),
        "decode_tok_s": median(&tps),
        "runs": {"load_s": s.load_s, "text_ttft_s": text_ttft, "image_ttft_s": img_ttft, "decode_tok_s": tps},
    });
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut out, &r)?;
        writeln!(out)?;
        return Ok(());
    }
    let f = |k: &str| {
        r[k].as_f64()
            .map_or("n/a".to_owned(), |v| format!("{v:.3}"))
    };
    writeln!(
        out,
        "package {} ({implementation}{})",
        args.package.display(),
        timing
            .map(|t| format!(", BPU_SIM_TIMING={t}"))
            .unwrap_or_default()
    )?;
    writeln!(out, "medians over {} runs", args.repeats.max(1))?;
    writeln!(out, "  prompt tail   {} ({})", tail.mode, tail.reason)?;
    writeln!(out, "  load          {} s", f("load_s"))?;
    writeln!(
        out,
        "  text TTFT     {} s  ({text_rows} prompt rows)",
        f("text_ttft_s")
    )?;
    writeln!(
        out,
        "  image TTFT    {} s  ({img_rows} prompt rows)",
        f("image_ttft_s")
    )?;
    writeln!(out, "  decode        {} tok/s", f("decode_tok_s"))?;
    Ok(())
}

/// Per-token host time of `steps` decode steps after a short prompt: (wall − graph) / steps.
fn overhead_run(
    s: &mut Setup,
    params: &SamplingParams,
    steps: usize,
) -> anyhow::Result<(f64, f64)> {
    let prompt = s.template.render(
        Some(&SystemOptions::default()),
        &UserTurn {
            text: "Hello",
            images: Vec::new(),
            thinking: false,
        },
    )?;
    s.engine.backend_mut().reset()?;
    s.engine.prefill(&prompt, &[], &mut || false)?;
    let mut sampler = Sampler::new(params.clone())?;
    let g0 = s.engine.backend().graph_time();
    let t0 = Instant::now();
    let g = s.engine.decode(
        &mut sampler,
        StreamConfig::new(Vec::new(), steps),
        DecodeOptions::default(),
        &mut |_| {},
    )?;
    let wall = t0.elapsed();
    let graph = s.engine.backend().graph_time().saturating_sub(g0);
    let n = g.completion.tokens.len().max(1) as f64;
    let host = wall.saturating_sub(graph);
    Ok((host.as_secs_f64() * 1e3 / n, graph.as_secs_f64() * 1e3 / n))
}

fn host_overhead(args: &BenchArgs) -> anyhow::Result<()> {
    let mut s = open(args, false)?;
    if s.engine.backend().implementation() != Implementation::Sim {
        bail!(
            "--host-overhead needs a sim package (the graph time is set to zero in the simulator)"
        );
    }
    bpu_sim::Sim::current().set_timing(None);
    let info = s.engine.backend().info().clone();
    let seeded = SamplingParams {
        seed: Some(7),
        ..SamplingParams::qwen35_non_thinking()
    };
    let rows = sampling_overheads(args, &mut s, seeded)?;
    let structured = match &args.json_schema {
        Some(file) => Some(steps::schema_overhead(
            &mut s,
            file,
            args.steps,
            args.repeats.max(1),
        )?),
        None => None,
    };
    let state = state_copy::state_copies(&mut s.engine, args.repeats)?;
    let mut r = json!({
        "package": args.package,
        "vocab": info.vocab,
        "hidden": info.hidden,
        "context": info.context,
        "mask_heads": info.mask_heads,
        "steps": args.steps,
        "repeats": args.repeats.max(1),
        "results": rows,
        "state_copy": state,
    });
    if let Some(j) = &structured {
        r["json_schema"] = j.clone();
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut out, &r)?;
        writeln!(out)?;
        return Ok(());
    }
    write_overhead_text(&mut out, args, &r)?;
    if let Some(j) = &structured {
        write_schema_overhead(&mut out, args, j)?;
    }
    Ok(())
}

/// Host time per token of greedy and of seeded non-thinking sampling: one row each.
fn sampling_overheads(
    args: &BenchArgs,
    s: &mut Setup,
    seeded: SamplingParams,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut rows = Vec::new();
    for (name, params) in [
        ("greedy", SamplingParams::default()),
        ("non_thinking", seeded),
    ] {
        let mut host = Vec::new();
        let mut graph = Vec::new();
        // One warm-up run (page cache, allocator), then the measured repeats.
        overhead_run(s, &params, args.steps.min(8))?;
        for _ in 0..args.repeats.max(1) {
            let (h, g) = overhead_run(s, &params, args.steps)?;
            host.push(h);
            graph.push(g);
        }
        rows.push(json!({
            "sampling": name,
            "host_ms_per_token": median(&host),
            "graph_call_ms_per_token": median(&graph),
            "runs_host_ms": host,
        }));
    }
    Ok(rows)
}

/// The text form of `--host-overhead`'s result `r` (without the JSON schema part).
fn write_overhead_text(
    out: &mut impl Write,
    args: &BenchArgs,
    r: &serde_json::Value,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "host overhead per decode step, {} (vocab {}, hidden {}, window {}), {} steps, median of {}",
        args.package.display(),
        r["vocab"],
        r["hidden"],
        r["context"],
        args.steps,
        args.repeats.max(1)
    )?;
    let state = &r["state_copy"];
    for row in r["results"].as_array().into_iter().flatten() {
        writeln!(
            out,
            "  {:<13} host {:.4} ms/token   (simulator graph call {:.4} ms/token, excluded)",
            row["sampling"].as_str().unwrap_or(""),
            row["host_ms_per_token"].as_f64().unwrap_or(f64::NAN),
            row["graph_call_ms_per_token"].as_f64().unwrap_or(f64::NAN)
        )?;
    }
    writeln!(
        out,
        "decode state of {} rows ({} bytes), median ms: snapshot {:.1}, into a kept snapshot's memory {:.1}, restore {:.1}",
        state["rows"],
        state["bytes"],
        state["snapshot_ms"].as_f64().unwrap_or(f64::NAN),
        state["snapshot_reusing_ms"].as_f64().unwrap_or(f64::NAN),
        state["restore_ms"].as_f64().unwrap_or(f64::NAN)
    )?;
    Ok(())
}

/// The text form of `--json-schema`'s per-step cost `j`.
fn write_schema_overhead(
    out: &mut impl Write,
    args: &BenchArgs,
    j: &serde_json::Value,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "per decode step with JSON schema {} ({} bytes; token table {:.0} ms, compile {:.1} ms), median / p95 ms",
        args.json_schema.as_deref().unwrap_or(Path::new("")).display(),
        j["bytes"],
        j["token_table_ms"].as_f64().unwrap_or(f64::NAN),
        j["compile_ms"].as_f64().unwrap_or(f64::NAN)
    )?;
    let f = |v: &serde_json::Value| {
        format!(
            "{:.4} / {:.4}",
            v["median"].as_f64().unwrap_or(f64::NAN),
            v["p95"].as_f64().unwrap_or(f64::NAN)
        )
    };
    for row in j["results"].as_array().into_iter().flatten() {
        writeln!(
            out,
            "  {:<13} free text {}   schema {}   (constraint alone {})",
            row["sampling"].as_str().unwrap_or(""),
            f(&row["free_text_host_ms_per_step"]),
            f(&row["json_schema_host_ms_per_step"]),
            f(&row["json_schema_constraint_ms_per_step"])
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }
}
