//! `vlm check <PACKAGE> [--no-vision]`: prints the package, its graphs and their I/O, and every
//! contract violation (each naming the file and the reason); exits non-zero on any.
//! `--report [--json]` prints the fuller report of [`super::report`] instead.

use std::io::Write;
use std::path::PathBuf;

use anyhow::bail;
use clap::Args;

use super::bpu_flags::BpuFlags;
use hbdnn::TensorSpec;
use vlm_bpu::check::check_package;
use vlm_bpu::BpuOptions;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Package folder (model.json).
    #[arg(value_name = "PACKAGE")]
    pub package: PathBuf,
    /// Text only: `visual.hbm` is neither required nor loaded.
    #[arg(long)]
    pub no_vision: bool,
    /// Board library folder (default: the system search).
    #[arg(long, value_name = "DIR")]
    pub lib_dir: Option<PathBuf>,
    #[command(flatten)]
    pub bpu: BpuFlags,
    /// Everything a board user needs to see: libraries and versions, SoC, every graph's
    /// tensors (names, types, strides, sizes, quantisation) and its file, reserved memory and
    /// the pool preflight, the prompt-tail decision (calibrating it when needed), violations.
    #[arg(long)]
    pub report: bool,
    /// With --report: one JSON object instead of text.
    #[arg(long, requires = "report")]
    pub json: bool,
}

fn tensor(t: &TensorSpec) -> String {
    let mut s = format!(
        "{:?} {:?} strides {:?} ({} bytes)",
        t.shape, t.dtype, t.strides, t.byte_size
    );
    match t.scale.len() {
        0 => {}
        1 => s.push_str(&format!(" scale {}", t.scale0())),
        n => s.push_str(&format!(
            " per-axis scales: scaleLen {n} quantizeAxis {}",
            t.quantize_axis
        )),
    }
    s
}

pub fn run(args: &CheckArgs) -> anyhow::Result<()> {
    let mut opts = BpuOptions {
        no_vision: args.no_vision,
        lib_dir: args.lib_dir.clone(),
        ..BpuOptions::default()
    };
    args.bpu.apply(&mut opts);
    if args.report {
        return super::report::run(&args.package, &opts, args.json);
    }
    let r = check_package(&args.package, &opts);
    let mut out = std::io::stdout().lock();
    writeln!(out, "package {}", args.package.display())?;
    if let Some(c) = &r.config {
        writeln!(
            out,
            "  name {:?}  arch {:?}  backend {:?}  cache_len {}  bpu_cores {}  graph {:?} / {:?}",
            c.name,
            c.arch,
            c.backend,
            c.cache_len,
            c.bpu_cores,
            c.graph,
            c.prefill_graph()
        )?;
        writeln!(
            out,
            "  eos {:?}  image_token_id {:?}  prefill_pads {}  prefill_min_tail {:?}  dialect {:?}  vision {}",
            c.eos,
            c.image_token_id,
            c.prefill_pads,
            c.prefill_min_tail,
            c.dialect,
            c.visual.is_some()
        )?;
        writeln!(out, "  tokenizer {}", c.tokenizer.display())?;
        if let Some(e) = &c.embed {
            writeln!(out, "  embed {}", e.display())?;
        }
    }
    if let Some(i) = r.implementation {
        writeln!(out, "implementation: {i}")?;
    }
    for (f, n) in &r.files {
        writeln!(out, "file {} ({n} bytes)", f.display())?;
    }
    if let Some(p) = &r.pool {
        match p.available {
            Some(a) => writeln!(out, "ION pool: {a} bytes free ({})", p.source)?,
            None if p.unlimited => writeln!(out, "ION pool: {}", p.source)?,
            None => writeln!(out, "ION pool: unknown, not checked ({})", p.source)?,
        }
        if !p.nodes.is_empty() || (p.available.is_none() && !p.unlimited) {
            writeln!(out, "reserved memory: {}", p.found())?;
        }
    }
    for g in &r.graphs {
        writeln!(out, "graph `{}` in {}", g.name, g.file.display())?;
        for (i, t) in g.inputs.iter().enumerate() {
            writeln!(out, "  in  {i}: {}", tensor(t))?;
        }
        for (i, t) in g.outputs.iter().enumerate() {
            writeln!(out, "  out {i}: {}", tensor(t))?;
        }
    }
    if let Some(d) = &r.decode {
        writeln!(
            out,
            "decode: hidden {}  vocab {}  window {}  mask planes {}  rot {}  caches {}  logits {:?}",
            d.hidden, d.vocab, d.context, d.mask_heads, d.rot, d.n_cache, d.logits
        )?;
        match r.prefill_chunk {
            Some(n) => writeln!(out, "prefill: {n} rows per chunk")?,
            None => writeln!(out, "prefill: none (every row is stepped)")?,
        }
    }
    for w in &r.warnings {
        writeln!(out, "WARNING {w}")?;
    }
    for v in &r.violations {
        writeln!(out, "VIOLATION {v}")?;
    }
    if r.violations.is_empty() {
        writeln!(out, "OK: no contract violations")?;
        Ok(())
    } else {
        out.flush()?;
        for v in &r.violations {
            tracing::error!("{v}");
        }
        bail!(
            "{} contract violation(s); first: {}",
            r.violations.len(),
            r.violations[0]
        )
    }
}
