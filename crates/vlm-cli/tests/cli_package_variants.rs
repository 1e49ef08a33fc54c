//! Issue 14 items 1 and 3 through the real binary: sim packages shaped as a real board may
//! report them (a rank-3 tower, one mask plane, `-1` strides and `alignedByteSize`, cache
//! outputs with other strides, an oversized embedding table, a tower file with several graphs)
//! reproduce the HF goldens through `vlm generate --package` and pass `vlm check`, under the
//! simulator's libdnn checks; what cannot be run right (per-axis scales, a non-F32 tower
//! input, a tower file without a recognisable graph) is refused clearly by `vlm check` and by
//! every command that opens the package.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use bpu_sim::package::{PackageOptions, PrefillIn};
use bpu_sim::{Container, LogitsType};
use vlm_testkit::{golden_case, golden_step_logits, ids, max_abs_diff, sim_package, GoldenCase};

/// f32 logits vs the HF goldens.
const TOL: f32 = 1e-4;

fn vlm(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vlm"));
    cmd.args(args)
        .env_remove("VLM_BPU_LOCK")
        .env_remove("BPU_SIM_POOL_MB")
        .env_remove("BPU_SIM_FAULTS")
        .env_remove("BPU_SIM_VIRADDR_ALIGN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// stdout (cut short: it may hold logits) and stderr.
fn text(o: &Output) -> String {
    let out = String::from_utf8_lossy(&o.stdout);
    let cut: String = out.chars().take(400).collect();
    format!("{cut}\n{}", String::from_utf8_lossy(&o.stderr))
}

fn generate(dir: &Path, c: &GoldenCase, env: &[(&str, &str)]) -> Output {
    let prompt: Vec<String> = c.ids.iter().map(u32::to_string).collect();
    let mut args: Vec<String> = vec![
        "generate".into(),
        "--package".into(),
        dir.display().to_string(),
        "--prompt-ids".into(),
        prompt.join(","),
        "--max-new".into(),
        c.greedy.len().to_string(),
        "--json".into(),
    ];
    for i in &c.images {
        args.push("--image".into());
        args.push(i.display().to_string());
    }
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    vlm(&a, env)
}

/// `vlm generate --package` reproduces the goldens of `c` (tokens exactly, logits within
/// [`TOL`]).
fn assert_goldens(model: &str, dir: &Path, c: &GoldenCase, what: &str) {
    let out = generate(dir, c, &[]);
    assert!(out.status.success(), "{what}: {}", text(&out));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ids(&j["tokens"]), c.greedy, "{what}: tokens");
    let want = golden_step_logits(model, c);
    let got = vlm_testkit::f32_rows(&j["logits"]);
    assert_eq!(got.len(), want.len(), "{what}: steps");
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        let d = max_abs_diff(a, b);
        assert!(d <= TOL, "{what}: step {i}: max |Δ| {d} > {TOL}");
    }
}

fn check(dir: &Path, extra: &[&str]) -> (bool, String) {
    let mut a = vec!["check", dir.to_str().unwrap()];
    a.extend(extra);
    let out = vlm(&a, &[]);
    let all = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), all)
}

type Tweak = fn(&mut PackageOptions);

#[test]
fn real_shape_variants_reproduce_the_goldens_and_pass_check() {
    let variants: Vec<(&str, &str, Tweak)> = vec![
        ("tower rank 3", "tiny-sym", |o| o.tower_rank = 3),
        ("dynamic strides", "tiny-sym", |o| o.dynamic_strides = true),
        ("mask heads 1", "tiny-sym", |o| o.mask_heads_one = true),
        ("rank 3 + dynamic + mask 1", "tiny-sym", |o| {
            o.tower_rank = 3;
            o.dynamic_strides = true;
            o.mask_heads_one = true;
        }),
        (
            "dynamic, prefill in model.hbm, all-row logits",
            "tiny-sym",
            |o| {
                o.dynamic_strides = true;
                o.prefill_in = PrefillIn::Model;
                o.prefill_logits_all = true;
            },
        ),
        ("cache outputs with other strides", "tiny-4b", |o| {
            o.cache_out_strides = true;
            o.tower_rank = 3;
        }),
    ];
    for (name, model, tweak) in variants {
        let d = tempfile::tempdir().unwrap();
        sim_package(model, d.path(), tweak);
        let (ok, report) = check(d.path(), &[]);
        assert!(ok, "{name}: vlm check:\n{report}");
        for case in ["text_short", "text_long", "image_one"] {
            let c = golden_case(model, case);
            assert_goldens(model, d.path(), &c, &format!("{name} / {case}"));
        }
    }
}

#[test]
fn make_sim_package_flags_write_the_variants_vlm_then_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("pkg");
    let model = vlm_testkit::model_dir("tiny-sym");
    let tok = vlm_testkit::fixtures().join("tokenizer.json");
    let o = vlm(
        &[
            "make-sim-package",
            "--hf",
            model.to_str().unwrap(),
            "--tokenizer",
            tok.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--tower-rank",
            "3",
            "--dynamic-strides",
            "--mask-heads",
            "1",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", text(&o));
    let visual = Container::read(&out.join("visual.hbm")).unwrap();
    let g = &visual.header.graphs[0];
    assert_eq!(g.inputs[0].shape.len(), 3);
    assert_eq!(g.outputs[0].shape[0], 1);
    assert!(g.kind.dynamic_strides());
    let (ok, report) = check(&out, &[]);
    assert!(ok, "{report}");
    assert!(report.contains("mask planes 1"), "{report}");
    assert_goldens(
        "tiny-sym",
        &out,
        &golden_case("tiny-sym", "image_one"),
        "CLI flags",
    );
}

/// Runs `vlm check`, `vlm generate` (golden case `case`: an image case opens the tower) and
/// `vlm chat --prompt` on `dir`; each must fail naming `file` and every one of `reasons`.
fn refused_everywhere(dir: &Path, case: &str, file: &str, reasons: &[&str]) {
    let (ok, report) = check(dir, &[]);
    assert!(!ok, "vlm check passed:\n{report}");
    let line = report
        .lines()
        .find(|l| l.starts_with("VIOLATION"))
        .unwrap_or_else(|| panic!("no VIOLATION:\n{report}"));
    for want in std::iter::once(file).chain(reasons.iter().copied()) {
        assert!(line.contains(want), "check: {want:?} not in {line:?}");
    }
    let c = golden_case("tiny-sym", case);
    let pkg = dir.to_str().unwrap();
    for (what, out) in [
        ("generate", generate(dir, &c, &[])),
        (
            "chat",
            vlm(
                &["chat", pkg, "--prompt", "hi", "--max-new-tokens", "2"],
                &[],
            ),
        ),
    ] {
        assert!(!out.status.success(), "{what} ran:\n{}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        for want in std::iter::once(file).chain(reasons.iter().copied()) {
            assert!(err.contains(want), "{what}: {want:?} not in:\n{err}");
        }
    }
}

#[test]
fn per_axis_scales_are_refused_naming_graph_tensor_and_values() {
    let d = tempfile::tempdir().unwrap();
    sim_package("tiny-sym", d.path(), |o| {
        o.quant_axis = true;
        o.logits = LogitsType::S16;
    });
    refused_everywhere(
        d.path(),
        "text_short",
        "model.hbm",
        &[
            "per-axis quantisation",
            "graph `qwen35` output 0",
            "scaleLen 640",
            "quantizeAxis 1",
        ],
    );
}

#[test]
fn a_tower_input_other_than_f32_is_refused_at_open() {
    let d = tempfile::tempdir().unwrap();
    sim_package("tiny-sym", d.path(), |_| {});
    let p = d.path().join("visual.hbm");
    let mut c = Container::read(&p).unwrap();
    c.header.graphs[0].inputs[0].dtype = 4; // HB_DNN_TENSOR_TYPE_F16
    c.write(&p).unwrap();
    // Refused when the tower is opened, before any image is encoded.
    refused_everywhere(
        d.path(),
        "image_one",
        "visual.hbm",
        &["tower `visual` input 0", "F16", "F32"],
    );
}

#[test]
fn the_tower_graph_is_the_one_named_visual_else_the_only_one() {
    let model = "tiny-sym";
    let c = golden_case(model, "image_one");
    // A second graph in front of `visual`: `visual` is taken.
    let d = tempfile::tempdir().unwrap();
    sim_package(model, d.path(), |_| {});
    let p = d.path().join("visual.hbm");
    let mut cont = Container::read(&p).unwrap();
    let mut other = cont.header.graphs[0].clone();
    other.name = "visual_448".into();
    cont.header.graphs.insert(0, other);
    cont.write(&p).unwrap();
    assert_goldens(model, d.path(), &c, "`visual` among two graphs");
    // The only graph, under another name.
    cont.header.graphs.remove(1);
    cont.write(&p).unwrap();
    assert_goldens(model, d.path(), &c, "one graph named visual_448");
    // Two graphs, neither named `visual`: an error naming both.
    let mut third = cont.header.graphs[0].clone();
    third.name = "tower".into();
    cont.header.graphs.push(third);
    cont.write(&p).unwrap();
    refused_everywhere(
        d.path(),
        "image_one",
        "visual.hbm",
        &["no graph `visual`", "visual_448", "tower"],
    );
}

#[test]
fn a_larger_embedding_table_is_used_and_a_smaller_one_refused() {
    let model = "tiny-sym";
    let d = tempfile::tempdir().unwrap();
    sim_package(model, d.path(), |_| {});
    let emb = d.path().join("embed_tokens.bin");
    let bytes = std::fs::read(&emb).unwrap();
    let mut longer = bytes.clone();
    longer.extend(std::iter::repeat_n(0x55u8, 4096));
    std::fs::write(&emb, &longer).unwrap();
    let (ok, report) = check(d.path(), &[]);
    assert!(ok, "{report}");
    assert_goldens(
        model,
        d.path(),
        &golden_case(model, "text_short"),
        "longer embed table",
    );
    let out = generate(d.path(), &golden_case(model, "text_short"), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("embed_tokens.bin") && err.contains("larger than"),
        "no warning:\n{err}"
    );
    std::fs::write(&emb, &bytes[..bytes.len() - 2]).unwrap();
    refused_everywhere(d.path(), "text_short", "embed_tokens.bin", &["too small"]);
}

#[test]
fn the_log_names_the_file_behind_every_graph() {
    let d = tempfile::tempdir().unwrap();
    sim_package("tiny-sym", d.path(), |_| {});
    let c = golden_case("tiny-sym", "image_one");
    let out = generate(d.path(), &c, &[("RUST_LOG", "vlm_bpu=info")]);
    assert!(out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    for (graph, file) in [
        ("qwen35", "model.hbm"),
        ("qwen35_prefill", "model_prefill.hbm"),
        ("visual", "visual.hbm"),
    ] {
        assert!(
            err.lines()
                .any(|l| l.contains("graph") && l.contains(graph) && l.contains(file)),
            "no line names graph {graph} and {file}:\n{err}"
        );
    }
}

fn dt_node(dt: &Path, name: &str, size: u32) {
    let n = dt.join(name);
    std::fs::create_dir_all(&n).unwrap();
    let cells: Vec<u8> = [0u32, 0x8000_0000, 0, size]
        .iter()
        .flat_map(|c| c.to_be_bytes())
        .collect();
    std::fs::write(n.join("reg"), cells).unwrap();
}

#[test]
fn pool_check_modes_on_a_board_package() {
    let d = tempfile::tempdir().unwrap();
    sim_package("tiny-sym", d.path(), |o| o.cache_len = 64);
    // Real-looking .hbm files: a board package, checked before any library is loaded.
    let blob: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
    for f in ["model.hbm", "model_prefill.hbm", "visual.hbm"] {
        std::fs::write(d.path().join(f), &blob).unwrap();
    }
    let dt = d.path().join("reserved-memory");
    dt_node(&dt, "ion_reserved@80000000", 1 << 30);
    let lock = d.path().join("engine.lock");
    let libs = d.path().join("no-libs-here");
    let env = [
        ("VLM_BPU_LOCK", lock.to_str().unwrap()),
        ("VLM_DT_RESERVED_MEMORY", dt.to_str().unwrap()),
    ];
    let pkg = d.path().to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut a = vec!["check", pkg, "--lib-dir", libs.to_str().unwrap()];
        a.extend(extra);
        let o = vlm(&a, &env);
        assert!(!o.status.success());
        let all = format!(
            "{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        let first = all
            .lines()
            .find(|l| l.starts_with("VIOLATION"))
            .unwrap_or_default()
            .to_owned();
        (first, all)
    };
    // No ion_carveout node: `warn` (the default) warns, names what it found, and goes on (to
    // the missing libraries).
    let (v, all) = run(&[]);
    assert!(v.contains("libraries not found"), "{all}");
    assert!(
        all.contains("not identified") && all.contains("ion_reserved@80000000"),
        "{all}"
    );
    assert!(
        all.contains("reserved memory: ion_reserved@80000000 1073741824 bytes"),
        "{all}"
    );
    // `strict` refuses before loading anything, naming what it found.
    let (v, all) = run(&["--pool-check", "strict"]);
    assert!(
        v.contains("cannot be identified") && v.contains("ion_reserved@80000000"),
        "{all}"
    );
    let c = golden_case("tiny-sym", "text_short");
    let prompt: Vec<String> = c.ids.iter().map(u32::to_string).collect();
    let o = vlm(
        &[
            "generate",
            "--package",
            pkg,
            "--prompt-ids",
            &prompt.join(","),
            "--max-new",
            "1",
            "--pool-check",
            "strict",
        ],
        &env,
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot be identified"), "{err}");
    // One carveout, too small: `warn` warns naming the fix and goes on (the reading may be
    // wrong: its node names are not confirmed on every SoC); `strict` refuses; `off` lets
    // it through.
    dt_node(&dt, "ion_carveout@a0000000", 4096);
    let (v, all) = run(&[]);
    assert!(v.contains("libraries not found"), "{all}");
    let w = all
        .lines()
        .find(|l| l.starts_with("WARNING") && l.contains("ION pool"))
        .unwrap_or_else(|| panic!("{all}"));
    assert!(
        w.contains("hb_switch_ion.sh bpu_first") && w.contains("loading anyway"),
        "{all}"
    );
    let (v, all) = run(&["--pool-check", "strict"]);
    assert!(
        v.contains("ION pool") && v.contains("hb_switch_ion.sh bpu_first"),
        "{all}"
    );
    let (v, all) = run(&["--pool-check", "off"]);
    assert!(v.contains("libraries not found"), "{all}");
    let o = vlm(&["check", pkg, "--pool-check", "loose"], &env);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("strict, warn or off"));
}
