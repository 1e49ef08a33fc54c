//! `vlm make-sim-package` (issue 4 item 4): the pinned flags reach the package, and the
//! package it writes opens through the BPU path on the simulator with the requested variant.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use bpu_sim::{Sim, SimConfig};
use vlm::engine::Backend;
use vlm_bpu::{BpuBackend, BpuOptions};

fn make(out: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vlm"))
        .args(["make-sim-package", "--hf"])
        .arg(vlm_testkit::model_dir("tiny-sym"))
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn defaults_write_the_published_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("pkg");
    let o = make(&out, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for f in [
        "model.json",
        "model.hbm",
        "model_prefill.hbm",
        "visual.hbm",
        "embed_tokens.bin",
        "tokenizer.json",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    // Every contract key is checked on the writer (hbdnn's sim_graphs); here the CLI's
    // defaults, and that the strict loader below accepts what it wrote.
    let j: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("model.json")).unwrap()).unwrap();
    assert_eq!(j["prefill_pads"], false);

    let _sim = {
        let s = Sim::new(SimConfig::default());
        s.install();
        s
    };
    let b = BpuBackend::open(&out, &BpuOptions::default()).unwrap();
    let heads = vlm_testkit::config("tiny-sym").text.num_attention_heads;
    assert_eq!(b.info().prefill_chunk, 32);
    assert_eq!(b.info().mask_heads, heads);
    assert_eq!(b.logits_format().0, hbdnn::DType::F32);
}

#[test]
fn variant_flags_change_the_graphs() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("pkg");
    let o = make(
        &out,
        &[
            "--cache-len",
            "128",
            "--prefill-chunk",
            "16",
            "--mask-heads",
            "1",
            "--logits",
            "s16",
            "--prefill-in",
            "none",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!out.join("model_prefill.hbm").exists());
    let _sim = {
        let s = Sim::new(SimConfig::default());
        s.install();
        s
    };
    let b = BpuBackend::open(&out, &BpuOptions::default()).unwrap();
    assert_eq!(b.info().context, 128);
    assert_eq!(b.info().mask_heads, 1);
    assert_eq!(b.info().prefill_chunk, 0, "no prefill graph → stepping");
    assert_eq!(b.logits_format().0, hbdnn::DType::S16);
}

#[test]
fn bad_flags_fail_with_a_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let o = make(&tmp.path().join("a"), &["--mask-heads", "3"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--mask-heads"));
    let o = Command::new(env!("CARGO_BIN_EXE_vlm"))
        .args(["make-sim-package", "--hf"])
        .arg(tmp.path().join("no-such-checkpoint"))
        .arg("--out")
        .arg(tmp.path().join("b"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no-such-checkpoint"));
}
