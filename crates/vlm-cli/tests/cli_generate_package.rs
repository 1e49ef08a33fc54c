//! `vlm generate --package` (the real binary; BPU backend + engine through the simulator) on
//! sim packages of the committed fixtures, against the HF goldens (tokens identical, logits
//! ≤ 1e-4; S16 within half a quantisation step) and against `vlm generate --hf`, over the
//! simulator's variant matrix, with and without images, prompts shorter than, equal to and
//! longer than one prefill chunk. Also the engine lock across processes and the pool preflight.
#![allow(clippy::unwrap_used)]

use vlm_testkit as common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use bpu_sim::package::{PackageOptions, PrefillIn};
use bpu_sim::LogitsType;
use common::{
    assert_logits_close, f32_rows, golden_case, golden_step_logits, ids, model_dir, sim_package,
    GoldenCase, LOGIT_TOL,
};

/// The S16 scale `make_sim_package` writes by default.
fn s16_scale() -> f32 {
    PackageOptions::new(Path::new("."), Path::new(".")).s16_scale
}

struct Run {
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

fn vlm(args: &[&str], extra: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vlm"));
    cmd.args(args)
        .env_remove("VLM_BPU_LOCK")
        .env_remove("BPU_SIM_POOL_MB")
        .env_remove("BPU_SIM_FAULTS");
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn generate(source: &str, dir: &Path, c: &GoldenCase, env: &[(&str, &str)]) -> Output {
    generate_with(source, dir, c, env, &[])
}

fn generate_with(
    source: &str,
    dir: &Path,
    c: &GoldenCase,
    env: &[(&str, &str)],
    extra: &[&str],
) -> Output {
    let ids: Vec<String> = c.ids.iter().map(u32::to_string).collect();
    let mut args: Vec<String> = vec![
        "generate".into(),
        source.into(),
        dir.display().to_string(),
        "--prompt-ids".into(),
        ids.join(","),
        "--max-new".into(),
        c.greedy.len().to_string(),
        "--json".into(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    for i in &c.images {
        args.push("--image".into());
        args.push(i.display().to_string());
    }
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    vlm(&a, env)
}

fn parse(out: &Output, what: &str) -> Run {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    Run {
        tokens: ids(&j["tokens"]),
        logits: f32_rows(&j["logits"]),
    }
}

fn assert_matches(got: &Run, want_tokens: &[u32], want_logits: &[Vec<f32>], tol: f32, what: &str) {
    assert_eq!(got.tokens, want_tokens, "{what}: tokens");
    assert_logits_close(&got.logits, want_logits, tol, what);
}

type Tweak = fn(&mut PackageOptions);

/// The simulator's variant matrix: mask planes, prefill logits rows, prefill graph placement
/// or absence, logits type. Each row: name, options, whether the logits are S16.
fn variants() -> Vec<(&'static str, Tweak, bool)> {
    vec![
        ("default (separate, last, H, f32)", |_| {}, false),
        (
            "mask 1, prefill in model.hbm, all-row logits",
            |o| {
                o.mask_heads_one = true;
                o.prefill_in = PrefillIn::Model;
                o.prefill_logits_all = true;
            },
            false,
        ),
        (
            "prefill in both files",
            |o| o.prefill_in = PrefillIn::Both,
            false,
        ),
        (
            "no prefill graph",
            |o| o.prefill_in = PrefillIn::None,
            false,
        ),
        ("S16 logits", |o| o.logits = LogitsType::S16, true),
    ]
}

#[test]
fn generate_package_matches_goldens_and_generate_hf_over_the_variant_matrix() {
    let model = "tiny-sym";
    // Shorter than, equal to and longer than one 32-row chunk; one image (119 rows).
    let cases: Vec<GoldenCase> = ["text_short", "text_32", "text_long", "image_one"]
        .iter()
        .map(|n| golden_case(model, n))
        .collect();
    assert_eq!(
        cases.iter().map(|c| c.ids.len()).collect::<Vec<_>>()[..3],
        [9, 32, 45]
    );
    let goldens: Vec<Vec<Vec<f32>>> = cases.iter().map(|c| golden_step_logits(model, c)).collect();
    for (name, tweak, s16) in variants() {
        let d = tempfile::tempdir().unwrap();
        sim_package(model, d.path(), tweak);
        let tol = if s16 {
            s16_scale() / 2.0 + LOGIT_TOL
        } else {
            LOGIT_TOL
        };
        for (c, want) in cases.iter().zip(&goldens) {
            let what = format!("{name} / {}", c.name);
            let got = parse(&generate("--package", d.path(), c, &[]), &what);
            if s16 && !c.images.is_empty() {
                // The S16 package quantises the tower's output too (same scale); that error
                // goes through every layer, so only the tokens are held to the goldens.
                assert_eq!(got.tokens, c.greedy, "{what}: tokens");
                continue;
            }
            assert_matches(&got, &c.greedy, want, tol, &what);
        }
    }
}

#[test]
fn generate_package_equals_generate_hf_with_two_images_and_on_the_untied_model() {
    for model in ["tiny-sym", "tiny-untied"] {
        let d = tempfile::tempdir().unwrap();
        sim_package(model, d.path(), |_| {});
        for name in ["image_two", "text_long"] {
            let c = golden_case(model, name);
            let hf = parse(&generate("--hf", &model_dir(model), &c, &[]), "hf");
            let pkg = parse(&generate("--package", d.path(), &c, &[]), "package");
            let what = format!("{model} / {name}: --package vs --hf");
            assert_matches(&pkg, &hf.tokens, &hf.logits, LOGIT_TOL, &what);
            assert_eq!(pkg.tokens, c.greedy, "{what}: goldens");
        }
    }
}

#[test]
fn generate_package_image_slot_rules() {
    let d = tempfile::tempdir().unwrap();
    sim_package("tiny-sym", d.path(), |_| {});
    let mut c = golden_case("tiny-sym", "image_two");
    c.images.truncate(1);
    let out = generate("--package", d.path(), &c, &[]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("image slot 1"), "{err}");
    // An image with no slot is refused as well.
    let mut t = golden_case("tiny-sym", "text_short");
    t.images = vec![c.images[0].clone()];
    let out = generate("--package", d.path(), &t, &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("only 0 image slots"), "{err}");
}

#[test]
fn a_second_engine_in_another_process_fails_fast() {
    let d = tempfile::tempdir().unwrap();
    sim_package("tiny-sym", d.path(), |_| {});
    let lock: PathBuf = d.path().join("engine.lock");
    let held = vlm_bpu::EngineLock::acquire(&lock).unwrap();
    let c = golden_case("tiny-sym", "text_short");
    let env = [("VLM_BPU_LOCK", lock.to_str().unwrap())];
    let t = std::time::Instant::now();
    let out = generate("--package", d.path(), &c, &env);
    assert!(!out.status.success());
    assert!(t.elapsed().as_secs() < 20, "must not wait for the lock");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("another BPU engine") && err.contains("engine.lock"),
        "{err}"
    );
    drop(held);
    parse(&generate("--package", d.path(), &c, &env), "after release");
}

#[test]
fn a_pool_too_small_is_refused_with_the_fix() {
    let d = tempfile::tempdir().unwrap();
    sim_package("tiny-sym", d.path(), |_| {});
    let c = golden_case("tiny-sym", "text_short");
    let out = generate("--package", d.path(), &c, &[("BPU_SIM_POOL_MB", "1")]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("model.hbm")
            && err.contains("ION pool")
            && err.contains("BPU_SIM_POOL_MB")
            && err.contains("hb_switch_ion.sh bpu_first"),
        "{err}"
    );
    // Enough room: the same request runs.
    parse(
        &generate("--package", d.path(), &c, &[("BPU_SIM_POOL_MB", "64")]),
        "64 MiB pool",
    );
}

#[test]
fn generate_package_with_a_padded_tail_matches_the_goldens() {
    let model = "tiny-sym";
    let d = tempfile::tempdir().unwrap();
    sim_package(model, d.path(), |o| {
        o.prefill_pads = true;
        o.prefill_min_tail = Some(4);
    });
    for name in ["text_short", "text_long", "image_one"] {
        let c = golden_case(model, name);
        let want = golden_step_logits(model, &c);
        let what = format!("--pad-tail / {name}");
        let got = parse(
            &generate_with("--package", d.path(), &c, &[], &["--pad-tail"]),
            &what,
        );
        assert_matches(&got, &c.greedy, &want, LOGIT_TOL, &what);
    }
}

/// Issue 22: on a simulated library that refuses flushes of part of an allocation
/// (`BPU_SIM_FLUSH=whole`) `vlm generate --package` still reproduces the HF goldens, with
/// padded prompt tails too (their K/V fix-up flushes part of each cache), and the report says
/// `"flush": "whole"`; on the default library it says `"range"`. A forced `--flush range`
/// on the refusing library fails naming the option; an unknown `BPU_SIM_FLUSH` is an error.
#[test]
fn whole_allocation_flushes_reproduce_the_goldens_and_the_report_says_so() {
    let model = "tiny-sym";
    let d = tempfile::tempdir().unwrap();
    sim_package(model, d.path(), |o| {
        o.prefill_pads = true;
        o.prefill_min_tail = Some(4);
    });
    let cache = tempfile::tempdir().unwrap();
    let cache_env = ("VLM_BPU_CACHE_DIR", cache.path().to_str().unwrap());
    let dir = d.path().to_str().unwrap();
    for (policy, found) in [("range", "range"), ("whole", "whole")] {
        let env = [("BPU_SIM_FLUSH", policy), cache_env];
        for name in ["text_long", "image_one"] {
            let c = golden_case(model, name);
            let what = format!("BPU_SIM_FLUSH={policy} {name}");
            let got = parse(&generate("--package", d.path(), &c, &env), &what);
            assert_matches(
                &got,
                &c.greedy,
                &golden_step_logits(model, &c),
                LOGIT_TOL,
                &what,
            );
        }
        let out = vlm(&["check", dir, "--report", "--json"], &env);
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(j["flush"], found, "{j}");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let c = golden_case(model, "text_short");
    let env = [("BPU_SIM_FLUSH", "whole"), cache_env];
    let out = generate_with("--package", d.path(), &c, &env, &["--flush", "range"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--flush range") && err.contains("refuses"),
        "{err}"
    );
    let got = generate_with("--package", d.path(), &c, &env, &["--flush", "whole"]);
    assert_eq!(parse(&got, "--flush whole").tokens, c.greedy);
    let out = generate(
        "--package",
        d.path(),
        &c,
        &[("BPU_SIM_FLUSH", "partial"), cache_env],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("BPU_SIM_FLUSH") && err.contains("partial"),
        "{err}"
    );
}
