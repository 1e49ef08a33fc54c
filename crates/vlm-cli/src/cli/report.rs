//! `vlm check <PACKAGE> --report [--json]`: prints [`vlm_bpu::report::PackageReport`] as text
//! for someone holding a board (sections: runtime, manifest, files, memory, prompt tail,
//! graphs, violations) or as one JSON object; exits non-zero on any violation.

use std::io::Write;
use std::path::Path;

use anyhow::bail;
use vlm_bpu::report::{package_report, PackageReport, TensorEntry};
use vlm_bpu::BpuOptions;

pub fn run(package: &Path, opts: &BpuOptions, json: bool) -> anyhow::Result<()> {
    let r = package_report(package, opts);
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, &r)?;
        writeln!(out)?;
    } else {
        write_text(&mut out, &r)?;
    }
    out.flush()?;
    if let Some(first) = r.violations.first() {
        bail!(
            "{} contract violation(s); first: {first}",
            r.violations.len()
        );
    }
    Ok(())
}

/// Bytes, with KiB / MiB / GiB.
fn size(n: u64) -> String {
    let f = n as f64;
    match n {
        _ if n >= 1 << 30 => format!("{n} B ({:.2} GiB)", f / (1u64 << 30) as f64),
        _ if n >= 1 << 20 => format!("{n} B ({:.1} MiB)", f / (1u64 << 20) as f64),
        _ if n >= 1 << 10 => format!("{n} B ({:.1} KiB)", f / 1024.0),
        _ => format!("{n} B"),
    }
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    )
}

fn tensor(side: &str, t: &TensorEntry) -> String {
    let quant = match (t.quanti_type.as_str(), t.scale_len, t.scale) {
        (q, 0, _) => q.to_owned(),
        (q, 1, Some(s)) => format!("{q} (scale {s})"),
        (q, n, _) => format!(
            "{q} PER-AXIS (scaleLen {n}, quantizeAxis {})",
            t.quantize_axis
        ),
    };
    let zp = if t.zero_point_len > 0 {
        format!(", zero points {}", t.zero_point_len)
    } else {
        String::new()
    };
    let reported = t
        .strides
        .iter()
        .zip(&t.strides_reported)
        .any(|(&s, &r)| i64::try_from(s).ok() != Some(r));
    let strides = if reported {
        format!("{:?} (reported {:?})", t.strides, t.strides_reported)
    } else {
        format!("{:?}", t.strides)
    };
    format!(
        "    {side} {:>2}  {:<12} {:<14} {:?} {}  strides {strides}  alignedByteSize {}  buffer {} B  quant {quant}{zp}",
        t.index,
        t.role.as_deref().unwrap_or("-"),
        t.name.as_deref().unwrap_or("(no name)"),
        t.shape,
        t.tensor_type,
        t.aligned_byte_size,
        t.buffer_bytes,
    )
}

fn write_text(out: &mut impl Write, r: &PackageReport) -> std::io::Result<()> {
    writeln!(out, "package report: {}", r.package.display())?;
    write_runtime(out, r)?;
    write_manifest(out, r)?;
    write_files(out, r)?;
    write_memory(out, r)?;
    write_prompt_tail(out, r)?;
    write_graphs(out, r)?;
    write_verdict(out, r)
}

/// Libraries, versions, flush mode; or why the runtime cannot be opened.
fn write_runtime(out: &mut impl Write, r: &PackageReport) -> std::io::Result<()> {
    writeln!(out, "runtime")?;
    writeln!(
        out,
        "  implementation    {}",
        r.implementation.as_deref().unwrap_or("unknown")
    )?;
    if let Some(rt) = &r.runtime {
        writeln!(out, "  libraries         {}", rt.source)?;
        for l in &rt.libraries {
            writeln!(out, "                    {}", l.display())?;
        }
        for l in &rt.mapped_libraries {
            writeln!(
                out,
                "  mapped            {:<10} {}",
                l.library,
                l.path.display()
            )?;
        }
        writeln!(out, "  hbDNN version     {}", rt.dnn_version)?;
        writeln!(out, "  hbUCP version     {}", rt.ucp_version)?;
        writeln!(out, "  SoC               {}", rt.soc)?;
        if rt.missing_entry_points.is_empty() {
            writeln!(out, "  optional symbols  all present")?;
        } else {
            writeln!(
                out,
                "  optional symbols  missing {} (fallbacks in use)",
                rt.missing_entry_points.join(", ")
            )?;
        }
    }
    if let Some(f) = &r.flush {
        let why = if f == "range" {
            "the runtime accepts a flush of part of a buffer"
        } else {
            "the runtime refuses a flush of part of a buffer: whole buffers are flushed"
        };
        writeln!(out, "  flush             {f} ({why})")?;
    }
    if let Some(e) = &r.runtime_error {
        writeln!(out, "  runtime           cannot be opened: {e}")?;
    }
    Ok(())
}

fn write_manifest(out: &mut impl Write, r: &PackageReport) -> std::io::Result<()> {
    if let Some(m) = &r.manifest {
        writeln!(out, "manifest (model.json)")?;
        writeln!(
            out,
            "  name {:?}  graphs `{}` / `{}`  cache_len {}  bpu_cores {}  vision {}",
            m.name, m.graph, m.prefill_graph, m.cache_len, m.bpu_cores, m.vision
        )?;
        writeln!(
            out,
            "  prefill_pads {}  prefill_min_tail {}  eos {:?}",
            m.prefill_pads,
            m.prefill_min_tail
                .map_or("(unset)".to_owned(), |v| v.to_string()),
            m.eos
        )?;
    }
    Ok(())
}

fn write_files(out: &mut impl Write, r: &PackageReport) -> std::io::Result<()> {
    writeln!(out, "files")?;
    for f in &r.files {
        let graphs = if f.graphs.is_empty() {
            "no graph loaded".to_owned()
        } else {
            format!("graphs {}", f.graphs.join(", "))
        };
        writeln!(
            out,
            "  {:<20} {:<28} {graphs}",
            file_name(&f.path),
            size(f.bytes)
        )?;
    }
    Ok(())
}

/// The ION pool: reserved, free, needed and the verdict.
fn write_memory(out: &mut impl Write, r: &PackageReport) -> std::io::Result<()> {
    let Some(m) = &r.memory else {
        return Ok(());
    };
    writeln!(out, "memory (ION pool)")?;
    if m.reserved_memory.is_empty() {
        writeln!(out, "  reserved-memory   no ion* node")?;
    }
    for n in &m.reserved_memory {
        match (n.bytes, &n.error) {
            (Some(b), _) => writeln!(out, "  reserved-memory   {} {}", n.name, size(b))?,
            (None, e) => writeln!(
                out,
                "  reserved-memory   {} (size unreadable: {})",
                n.name,
                e.as_deref().unwrap_or("?")
            )?,
        }
    }
    let free = match m.available {
        Some(a) => size(a),
        None if m.unlimited => "no limit".to_owned(),
        None => "unknown".to_owned(),
    };
    writeln!(out, "  free              {free} ({})", m.source)?;
    let buffers = m.buffer_bytes.unwrap_or(0);
    writeln!(
        out,
        "  needed            .hbm loads {} + {} cache sets and I/O {} = {} → {} (--pool-check {})",
        size(m.hbm_bytes),
        m.cache_sets,
        size(buffers),
        size(m.hbm_bytes + buffers),
        m.verdict,
        m.pool_check
    )?;
    if m.verdict != "fits" && !m.fix.is_empty() {
        writeln!(out, "  fix               {}", m.fix)?;
    }
    Ok(())
}

/// How prompt tails are prefilled, why, and the calibration trials behind it.
fn write_prompt_tail(out: &mut impl Write, r: &PackageReport) -> std::io::Result<()> {
    let d = &r.prefill_tail_decision;
    writeln!(out, "prompt tail")?;
    let range = d.min_tail.map_or(String::new(), |m| {
        format!(", tails of {m}..{} rows", d.chunk)
    });
    let marking = d.marking().map_or(String::new(), |m| {
        format!(
            ", pad rope {}, pad mask {}",
            m.rope.as_str(),
            m.mask.as_str()
        )
    });
    writeln!(
        out,
        "  decision          {}{marking} (asked: {}{range}{})",
        d.mode,
        d.requested,
        if d.cached { ", from the cache" } else { "" }
    )?;
    writeln!(out, "  why               {}", d.reason)?;
    if let Some(c) = &d.calibration {
        writeln!(
            out,
            "  calibration       {}-row chunk after {} stepped row(s), stepped next token {} leads by {:.2}; keep at top-1 agreement and cosine ≥ {}; {:.2} s",
            c.prompt_rows, c.prefix_rows, c.top1, c.margin, c.threshold, c.seconds
        )?;
        let chosen = d.marking();
        for t in &c.trials {
            let mark = if chosen == Some(t.marking) {
                "→"
            } else {
                " "
            };
            writeln!(out, "   {mark}{}", t.summary())?;
        }
    }
    Ok(())
}

fn write_graphs(out: &mut impl Write, r: &PackageReport) -> std::io::Result<()> {
    writeln!(out, "graphs ({})", r.graphs.len())?;
    for g in &r.graphs {
        writeln!(out, "  `{}` from {}", g.name, g.file.display())?;
        for t in &g.inputs {
            writeln!(out, "{}", tensor("in ", t))?;
        }
        for t in &g.outputs {
            writeln!(out, "{}", tensor("out", t))?;
        }
    }
    if let Some(n) = r.prefill_chunk {
        writeln!(out, "prefill: {n} rows per chunk")?;
    }
    Ok(())
}

/// Warnings, then the violations (or that there are none).
fn write_verdict(out: &mut impl Write, r: &PackageReport) -> std::io::Result<()> {
    for w in &r.warnings {
        writeln!(out, "WARNING {w}")?;
    }
    if r.violations.is_empty() {
        writeln!(out, "OK: no contract violations")?;
    }
    for v in &r.violations {
        writeln!(out, "VIOLATION {v}")?;
    }
    Ok(())
}
