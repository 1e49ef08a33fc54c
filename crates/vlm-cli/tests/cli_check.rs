//! `vlm check` (the real binary) on a good sim package and on malformed ones: every failure
//! exits non-zero and names the file and the reason.
#![allow(clippy::unwrap_used)]

use vlm_testkit as common;

use std::path::Path;
use std::process::{Command, Output};

use bpu_sim::container::{Container, GraphDesc, GraphKind, Header, TensorDesc};
use common::sim_package;

fn check(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vlm"));
    cmd.arg("check").arg(dir).args(extra);
    cmd.env_remove("VLM_BPU_LOCK").env_remove("BPU_SIM_POOL_MB");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    );
    (status.success(), text)
}

fn package() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    sim_package("tiny-sym", d.path(), |o| o.cache_len = 64);
    d
}

/// Expects a failure whose output names `file` and contains every one of `reason`.
fn fails(dir: &Path, file: &str, reason: &[&str]) -> String {
    fails_with(dir, file, reason, &[], &[])
}

fn fails_with(
    dir: &Path,
    file: &str,
    reason: &[&str],
    extra: &[&str],
    env: &[(&str, &str)],
) -> String {
    let (ok, text) = check(dir, extra, env);
    assert!(!ok, "expected a failure:\n{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("VIOLATION"))
        .unwrap_or_else(|| panic!("no VIOLATION line:\n{text}"));
    assert!(line.contains(file), "{file} not named:\n{text}");
    for r in reason {
        assert!(line.contains(r), "{r:?} not in {line:?}\n{text}");
    }
    text
}

fn edit_manifest(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("model.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

#[test]
fn a_good_package_prints_its_graphs_and_passes() {
    let d = package();
    let (ok, text) = check(d.path(), &[], &[]);
    assert!(ok, "{text}");
    for want in [
        "implementation: simulator",
        "graph `qwen35` in",
        "graph `qwen35_prefill` in",
        "graph `visual` in",
        "in  3: [4, 64] F32",
        "decode: hidden 64  vocab 640  window 64  mask planes 4",
        "prefill: 32 rows per chunk",
        "OK: no contract violations",
    ] {
        assert!(text.contains(want), "{want:?} missing:\n{text}");
    }
}

#[test]
fn manifest_failures_name_the_file_and_the_reason() {
    // Missing file.
    let d = package();
    std::fs::remove_file(d.path().join("embed_tokens.bin")).unwrap();
    fails(
        d.path(),
        "model.json",
        &["missing file", "embed_tokens.bin"],
    );
    // Bad JSON.
    let d = package();
    std::fs::write(d.path().join("model.json"), b"{\"hbm\": ").unwrap();
    fails(d.path(), "model.json", &["invalid JSON"]);
    // A known key of the wrong type, cache_len included.
    let d = package();
    edit_manifest(d.path(), |v| v["cache_len"] = "64".into());
    fails(d.path(), "model.json", &["cache_len", "must be"]);
    let d = package();
    edit_manifest(d.path(), |v| v["prefill_pads"] = 1.into());
    fails(d.path(), "model.json", &["prefill_pads"]);
    // cache_len that contradicts the graphs.
    let d = package();
    edit_manifest(d.path(), |v| v["cache_len"] = 4096.into());
    fails(d.path(), "model.json", &["cache_len", "4096", "window 64"]);
}

#[test]
fn graph_failures_name_the_file_and_the_reason() {
    // Embedding table of the wrong size.
    let d = package();
    let emb = d.path().join("embed_tokens.bin");
    let bytes = std::fs::read(&emb).unwrap();
    std::fs::write(&emb, &bytes[..bytes.len() - 128]).unwrap();
    fails(d.path(), "embed_tokens.bin", &["size mismatch"]);
    // A decode graph that breaks the contract (one input, one output).
    let d = package();
    let t = TensorDesc {
        shape: vec![1, 64],
        dtype: 7,
        strides: vec![-1, -1],
        scale: vec![],
    };
    let c = Container {
        header: Header {
            graphs: vec![GraphDesc {
                name: "qwen35".into(),
                kind: GraphKind::Affine { mul: 1.0, add: 0.0 },
                inputs: vec![t.clone()],
                outputs: vec![t],
                compile_cores: 1,
            }],
            config: None,
            has_weights: true,
            march: Some("nash-m".into()),
        },
        payload: vec![],
    };
    c.write(&d.path().join("model.hbm")).unwrap();
    fails(
        d.path(),
        "model.hbm",
        &["graph contract mismatch", "inputs"],
    );
    // Compiled for another BPU.
    let d = tempfile::tempdir().unwrap();
    sim_package("tiny-sym", d.path(), |o| {
        o.cache_len = 64;
        o.march = "nash-p".into();
    });
    fails(d.path(), "model.hbm", &["another BPU", "nash-p", "nash-m"]);
    // The pool cannot hold the graphs.
    let d = package();
    fails_with(
        d.path(),
        "model.hbm",
        &["ION pool", "hb_switch_ion.sh bpu_first"],
        &[],
        &[("BPU_SIM_POOL_MB", "1")],
    );
}

#[test]
fn a_board_package_without_libraries_names_the_library_folder() {
    let d = package();
    // Real-looking .hbm files (binary, large enough): the board libraries are needed.
    let blob: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
    for f in ["model.hbm", "model_prefill.hbm", "visual.hbm"] {
        std::fs::write(d.path().join(f), &blob).unwrap();
    }
    let libs = d.path().join("no-libs-here");
    let lock = d.path().join("engine.lock");
    let text = fails_with(
        d.path(),
        "no-libs-here",
        &["libraries not found"],
        &["--lib-dir", libs.to_str().unwrap()],
        &[
            ("VLM_BPU_LOCK", lock.to_str().unwrap()),
            ("VLM_DT_RESERVED_MEMORY", d.path().to_str().unwrap()),
        ],
    );
    assert!(text.contains("implementation: board libraries"), "{text}");
}
