//! Checks no stricter than BLLM (issue #22): prefill caches are compared with decode's by
//! `stride[0] × dim[0]` (a different `alignedByteSize` is a warning, and the shared cache
//! buffers are allocated for the larger one); the report counts the optional third cache set
//! and lists the mapped board libraries.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use bpu_sim::{Container, GraphKind, Sim, SimConfig};
use vlm::engine::Backend;
use vlm_bpu::check::check_package;
use vlm_bpu::{BpuBackend, BpuOptions};
use vlm_testkit::{feed_text, golden_case, max_abs_diff, sim_package};

const CHUNK: usize = 32;

fn text_only() -> BpuOptions {
    BpuOptions {
        no_vision: true,
        ..BpuOptions::default()
    }
}

/// Rewrites the prefill graph of `model_prefill.hbm` in `dir` with `edit`.
fn edit_prefill(dir: &Path, edit: impl FnOnce(&mut bpu_sim::container::GraphDesc)) {
    let path = dir.join("model_prefill.hbm");
    let mut c = Container::read(&path).unwrap();
    let g = c
        .header
        .graphs
        .iter_mut()
        .find(|g| g.name == "qwen35_prefill")
        .unwrap();
    edit(g);
    c.write(&path).unwrap();
}

fn package(dir: &Path) {
    package_of("tiny-sym", dir);
}

fn package_of(model: &str, dir: &Path) {
    sim_package(model, dir, |o| {
        o.cache_len = 64;
        o.prefill_chunk = CHUNK;
    });
}

#[test]
fn a_prefill_cache_differing_only_in_aligned_byte_size_is_used_with_a_warning() {
    let plain = tempfile::tempdir().unwrap();
    package(plain.path());
    let padded = tempfile::tempdir().unwrap();
    package(padded.path());
    edit_prefill(padded.path(), |g| {
        let GraphKind::Qwen35Text(p) = &mut g.kind else {
            panic!("not a text graph")
        };
        p.cache_aligned_extra = 96;
    });
    let sim = Sim::new(SimConfig::default());
    sim.install();

    let r = check_package(padded.path(), &text_only());
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert_eq!(r.prefill_chunk, Some(CHUNK));
    assert!(!r.warnings.is_empty());
    let w = r.warnings[0].to_string();
    assert!(
        w.contains("model_prefill.hbm") && w.contains("alignedByteSize") && w.contains("cache 0"),
        "{w}"
    );

    // The prefill graph is used, its larger caches are bound to buffers big enough for them
    // (the simulated hbDNNInferV2 refuses a buffer smaller than alignedByteSize), and the
    // logits are the plain package's.
    let k = golden_case("tiny-sym", "text_long");
    assert!(k.ids.len() > CHUNK);
    let logits = |dir: &Path| {
        let mut b = BpuBackend::open(dir, &text_only()).unwrap();
        assert_eq!(b.info().prefill_chunk, CHUNK);
        let used_before = sim.stats().pool_used;
        let l = feed_text(&mut b, &k.ids);
        (l, used_before)
    };
    let (want, plain_used) = logits(plain.path());
    let (got, padded_used) = logits(padded.path());
    assert!(max_abs_diff(&got, &want) < 1e-4);
    assert!(
        padded_used > plain_used,
        "larger cache buffers: {padded_used} vs {plain_used}"
    );
}

#[test]
fn a_prefill_cache_spanning_other_bytes_is_still_refused() {
    let d = tempfile::tempdir().unwrap();
    // One K/V head per window (`[CL, 1, D]`), the layout `cache_out_strides` pads.
    package_of("tiny-4b", d.path());
    // The prefill graph's K/V windows get a pitch of two rows (a layout the simulator runs),
    // the decode graph's stay dense: the same shapes spanning twice the bytes.
    let cfg = qwen35::Config::from_json_str(
        &std::fs::read_to_string(vlm_testkit::model_dir("tiny-4b").join("config.json")).unwrap(),
    )
    .unwrap();
    edit_prefill(d.path(), |g| {
        let GraphKind::Qwen35Text(p) = &g.kind else {
            panic!("not a text graph")
        };
        let p = bpu_sim::TextParams {
            cache_out_strides: true,
            ..p.clone()
        };
        *g = bpu_sim::graphs::text_graph_desc(&g.name, &cfg.text, &p);
    });
    let sim = Sim::new(SimConfig::default());
    sim.install();
    let r = check_package(d.path(), &text_only());
    assert_eq!(r.prefill_chunk, None);
    let v = r
        .violations
        .iter()
        .map(ToString::to_string)
        .find(|v| v.contains("prefill graph"))
        .unwrap_or_else(|| panic!("{:?}", r.violations));
    assert!(
        v.contains("model_prefill.hbm") && v.contains("stride[0] × dim[0]"),
        "{v}"
    );
    // Opening steps every row instead.
    let b = BpuBackend::open(d.path(), &text_only()).unwrap();
    assert_eq!(b.info().prefill_chunk, 0);
}

#[test]
fn the_report_counts_the_third_cache_set_and_lists_mapped_libraries() {
    let d = tempfile::tempdir().unwrap();
    package(d.path());
    let sim = Sim::new(SimConfig::default());
    sim.install();
    let report = |keep_set: bool| {
        vlm_bpu::report::package_report(
            d.path(),
            &BpuOptions {
                keep_set,
                prefill_tail: vlm_bpu::PrefillTail::Stepped,
                ..text_only()
            },
        )
    };
    let (two, three) = (report(false), report(true));
    let (m2, m3) = (two.memory.unwrap(), three.memory.unwrap());
    assert_eq!((m2.cache_sets, m3.cache_sets), (2, 3));
    assert_eq!(m2.pool_check, "warn");
    let set = m3.buffer_bytes.unwrap() - m2.buffer_bytes.unwrap();
    let decode = two.graphs.iter().find(|g| g.name == "qwen35").unwrap();
    let cache_set: usize = decode.inputs[4..].iter().map(|t| t.buffer_bytes).sum();
    assert!(cache_set > 0);
    assert_eq!(set, cache_set as u64);
    // Under the simulator no board library is mapped on this machine (or, where one is, the
    // list shows it): the field is there either way.
    let rt = two.runtime.unwrap();
    let json = serde_json::to_value(&rt).unwrap();
    assert!(json.get("mapped_libraries").is_some(), "{json}");
    assert!(rt
        .mapped_libraries
        .iter()
        .all(|l| l.path.to_string_lossy().contains(&l.library)));
    assert!(two.warnings.is_empty(), "{:?}", two.warnings);
}
