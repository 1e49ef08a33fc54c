//! The `vlm` binary and issue 14 items 2, 4, 5, 6: `--prefill-tail` (and its alias
//! `--pad-tail`) on generate against the HF goldens for packages built for either pad layout,
//! `--no-prefill-graph`, `vlm check --report [--json]` over the simulator's package variants,
//! and `vlm bench --prompt-tokens N` under a timing model.
#![allow(clippy::unwrap_used)]

use vlm_testkit as common;

use std::path::Path;
use std::process::{Command, Output};

use bpu_sim::package::{PackageOptions, PrefillIn};
use bpu_sim::{LogitsType, PadLayout};
use common::{
    assert_logits_close, f32_rows, golden_case, golden_step_logits, ids, sim_package, GoldenCase,
    LOGIT_TOL,
};

const MODEL: &str = "tiny-sym";

/// Runs `vlm` with a private tail cache in `cache`.
fn vlm(args: &[String], cache: &Path, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vlm"));
    cmd.args(args)
        .env_remove("VLM_BPU_LOCK")
        .env_remove("BPU_SIM_POOL_MB")
        .env_remove("BPU_SIM_FAULTS")
        .env_remove("BPU_SIM_TIMING")
        .env("VLM_BPU_CACHE_DIR", cache);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn pads_package(dir: &Path, layout: PadLayout) {
    sim_package(MODEL, dir, |o| {
        o.prefill_pads = true;
        o.prefill_min_tail = Some(4);
        o.pad_layout = layout;
    });
}

/// `vlm generate --package dir` of golden case `c` with `extra` flags; tokens and logits.
fn generate(dir: &Path, c: &GoldenCase, extra: &[&str], cache: &Path) -> (Vec<u32>, Vec<Vec<f32>>) {
    let prompt: Vec<String> = c.ids.iter().map(u32::to_string).collect();
    let mut args = strings(&["generate", "--package"]);
    args.push(dir.display().to_string());
    args.extend(strings(&["--prompt-ids", &prompt.join(","), "--json"]));
    args.extend(strings(&["--max-new", &c.greedy.len().to_string()]));
    args.extend(strings(extra));
    for i in &c.images {
        args.push("--image".into());
        args.push(i.display().to_string());
    }
    let text = ok(&vlm(&args, cache, &[]), &format!("{} {extra:?}", c.name));
    let j: serde_json::Value = serde_json::from_str(&text).unwrap();
    (ids(&j["tokens"]), f32_rows(&j["logits"]))
}

#[test]
fn generate_matches_the_goldens_with_every_tail_mode_on_both_layouts() {
    for layout in [PadLayout::First, PadLayout::Last] {
        let d = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        pads_package(d.path(), layout);
        let right = match layout {
            PadLayout::First => "pads_first",
            PadLayout::Last => "pads_last",
        };
        let modes: [&[&str]; 5] = [
            &[],
            &["--pad-tail"],
            &["--prefill-tail", "stepped"],
            &["--prefill-tail", right],
            &["--no-prefill-graph"],
        ];
        for name in ["text_short", "image_one"] {
            let c = golden_case(MODEL, name);
            let want = golden_step_logits(MODEL, &c);
            for extra in modes {
                let what = format!("{layout:?} / {name} / {extra:?}");
                let (tokens, logits) = generate(d.path(), &c, extra, cache.path());
                assert_eq!(tokens, c.greedy, "{what}: tokens");
                assert_logits_close(&logits, &want, LOGIT_TOL, &what);
            }
        }
        // `auto` calibrated once; the decision is in the cache.
        let cached = std::fs::read_to_string(cache.path().join("prefill_tail.json")).unwrap();
        assert!(cached.contains(right), "{cached}");
    }
}

#[test]
fn the_alias_and_an_explicit_mode_conflict() {
    let d = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    pads_package(d.path(), PadLayout::First);
    let mut args = strings(&["generate", "--package"]);
    args.push(d.path().display().to_string());
    args.extend(strings(&["--prompt-ids", "1,2,3", "--max-new", "1"]));
    args.extend(strings(&["--pad-tail", "--prefill-tail", "stepped"]));
    let out = vlm(&args, cache.path(), &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
    args.truncate(args.len() - 3);
    args.extend(strings(&["--prefill-tail", "sideways"]));
    let out = vlm(&args, cache.path(), &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("pads_first") && err.contains("stepped"),
        "{err}"
    );
}

type Tweak = fn(&mut PackageOptions);

/// `vlm check --report` on `dir` (text and JSON); (success, text, json).
fn report(dir: &Path, extra: &[&str], cache: &Path) -> (bool, String, serde_json::Value) {
    let mut args = strings(&["check"]);
    args.push(dir.display().to_string());
    args.push("--report".into());
    args.extend(strings(extra));
    let text = vlm(&args, cache, &[]);
    args.push("--json".into());
    let json = vlm(&args, cache, &[]);
    assert_eq!(text.status.success(), json.status.success());
    let j = serde_json::from_slice(&json.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&json.stdout),
            String::from_utf8_lossy(&json.stderr)
        )
    });
    (
        text.status.success(),
        String::from_utf8_lossy(&text.stdout).into_owned(),
        j,
    )
}

#[test]
fn check_report_lists_what_the_board_would_show_on_every_variant() {
    let variants: Vec<(&str, Tweak, &str)> = vec![
        ("plain", |_| {}, "stepped"),
        (
            "pads first",
            |o| {
                o.prefill_pads = true;
                o.prefill_min_tail = Some(4);
                o.pad_layout = PadLayout::First;
            },
            "pads_first",
        ),
        (
            "pads last, all-row logits, mask 1",
            |o| {
                o.prefill_pads = true;
                o.prefill_min_tail = Some(4);
                o.prefill_logits_all = true;
                o.mask_heads_one = true;
            },
            "pads_last",
        ),
        ("dynamic strides", |o| o.dynamic_strides = true, "stepped"),
        ("tower rank 3", |o| o.tower_rank = 3, "stepped"),
        (
            "prefill in model.hbm, S16 logits",
            |o| {
                o.prefill_in = PrefillIn::Model;
                o.logits = LogitsType::S16;
            },
            "stepped",
        ),
        (
            "no weights, pads first",
            |o| {
                o.no_weights = true;
                o.prefill_pads = true;
                o.pad_layout = PadLayout::First;
            },
            "stepped",
        ),
    ];
    for (name, tweak, tail) in variants {
        let d = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        sim_package(MODEL, d.path(), tweak);
        let (good, text, j) = report(d.path(), &[], cache.path());
        assert!(good, "{name}:\n{text}");
        assert_eq!(
            j["prefill_tail"], tail,
            "{name}: {}",
            j["prefill_tail_decision"]
        );
        let graphs = j["graphs"].as_array().unwrap();
        let names: Vec<&str> = graphs.iter().map(|g| g["name"].as_str().unwrap()).collect();
        assert!(
            names.contains(&"qwen35") && names.contains(&"visual"),
            "{name}: {names:?}"
        );
        for g in graphs {
            assert!(g["file"].as_str().unwrap().ends_with(".hbm"));
            for t in g["inputs"]
                .as_array()
                .unwrap()
                .iter()
                .chain(g["outputs"].as_array().unwrap())
            {
                for key in [
                    "name",
                    "role",
                    "shape",
                    "tensor_type",
                    "strides_reported",
                    "strides",
                    "aligned_byte_size",
                    "quanti_type",
                    "scale_len",
                    "quantize_axis",
                ] {
                    assert!(!t[key].is_null(), "{name}: {} lacks {key}: {t}", g["name"]);
                }
            }
        }
        for key in ["dnn_version", "ucp_version", "soc", "source"] {
            assert!(j["runtime"][key].is_string(), "{name}: runtime.{key}");
        }
        assert!(j["memory"]["hbm_bytes"].as_u64().unwrap() > 0);
        assert!(j["memory"]["reserved_memory"].is_array());
        // The board fields are there under the simulator too (no board library mapped).
        assert!(j["runtime"]["mapped_libraries"].is_array(), "{name}");
        assert_eq!(j["memory"]["cache_sets"], 2, "{name}");
        assert_eq!(j["memory"]["pool_check"], "warn", "{name}");
        assert!(j["warnings"].is_array(), "{name}");
        for section in [
            "runtime",
            "hbDNN version",
            "SoC",
            "files",
            "memory (ION pool)",
            "prompt tail",
            "graphs (",
            "from ",
            "alignedByteSize",
            "OK: no contract violations",
        ] {
            assert!(text.contains(section), "{name}: no {section:?} in\n{text}");
        }
        if tail != "stepped" {
            assert!(
                text.contains("cosine"),
                "{name}: calibration figures\n{text}"
            );
        }
    }
    // Per-axis scales: refused, the report still lists the tensor as the board reports it.
    let d = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    sim_package(MODEL, d.path(), |o| {
        o.quant_axis = true;
        o.logits = LogitsType::S16;
    });
    let (good, text, j) = report(d.path(), &[], cache.path());
    assert!(!good);
    assert_eq!(j["prefill_tail"], "stepped");
    assert!(
        text.contains("PER-AXIS") && text.contains("VIOLATION"),
        "{text}"
    );
    assert!(!j["violations"].as_array().unwrap().is_empty());
    // Without weights an explicit layout is reported as asked.
    let d = tempfile::tempdir().unwrap();
    sim_package(MODEL, d.path(), |o| {
        o.no_weights = true;
        o.prefill_pads = true;
        o.prefill_min_tail = Some(4);
    });
    let (_, text, j) = report(d.path(), &["--prefill-tail", "pads_first"], cache.path());
    assert_eq!(j["prefill_tail"], "pads_first", "{text}");
}

/// Issue 22 part 4: a package built by `vlm make-sim-package` for each pad layout × pad rope
/// × pad mask row is reported with the variant it was built with (the calibration decides
/// from the graphs' outputs only: `model.json` does not say), every trial listed, also when
/// the decision comes from the cache; a package without `prefill_pads` stays stepped.
#[test]
fn check_report_names_each_of_the_eight_pad_variants() {
    let cache = tempfile::tempdir().unwrap();
    for layout in ["first", "last"] {
        for rope in ["identity", "zero"] {
            for mask in ["masked", "self"] {
                let what = format!("{layout}/{rope}/{mask}");
                let tmp = tempfile::tempdir().unwrap();
                let d = tmp.path().join("pkg");
                let mut args = strings(&["make-sim-package", "--hf"]);
                args.push(common::model_dir(MODEL).display().to_string());
                args.push("--out".into());
                args.push(d.display().to_string());
                args.extend(strings(&["--prefill-pads", "--prefill-min-tail", "4"]));
                args.extend(strings(&["--pad-layout", layout, "--pad-rope", rope]));
                args.extend(strings(&["--pad-mask", mask]));
                ok(&vlm(&args, cache.path(), &[]), &what);
                let manifest = std::fs::read_to_string(d.join("model.json")).unwrap();
                assert!(
                    !manifest.contains(rope) && !manifest.contains("\"self\""),
                    "{what}: model.json names the marking"
                );
                // First the calibration (the text report; its JSON twin reads the cache),
                // then only cached decisions: the same answer, with every trial.
                for round in ["calibrated", "cached"] {
                    let (good, text, j) = report(&d, &[], cache.path());
                    assert!(good, "{what} {round}:\n{text}");
                    let want_tail = format!("pads_{layout}");
                    assert_eq!(j["prefill_tail"], want_tail.as_str(), "{what} {round}: {j}");
                    assert_eq!(j["pad_rope"], rope, "{what} {round}");
                    assert_eq!(j["pad_mask"], mask, "{what} {round}");
                    assert_eq!(j["prefill_tail_decision"]["cached"], true, "{what} {round}");
                    assert_eq!(
                        text.contains("from the cache"),
                        round == "cached",
                        "{what} {round}:\n{text}"
                    );
                    let trials = j["calibration_trials"].as_array().unwrap();
                    assert_eq!(trials.len(), 8, "{what} {round}: every trial listed");
                    let mut seen = Vec::new();
                    for t in trials {
                        let key = (
                            t["layout"].as_str().unwrap().to_owned(),
                            t["rope"].as_str().unwrap().to_owned(),
                            t["mask"].as_str().unwrap().to_owned(),
                        );
                        let built = key == (layout.into(), rope.into(), mask.into());
                        assert_eq!(t["chosen"], built, "{what} {round}: {t}");
                        assert_eq!(t["top1_agree"], built, "{what} {round}: {t}");
                        let cosine = t["cosine"].as_array().unwrap();
                        assert_eq!(cosine.len(), 2, "{what}: {t}");
                        if built {
                            for c in cosine {
                                assert!(c.as_f64().unwrap() >= 0.9999, "{what}: {t}");
                            }
                        }
                        seen.push(key);
                    }
                    seen.sort();
                    seen.dedup();
                    assert_eq!(seen.len(), 8, "{what}: eight distinct trials");
                    assert!(
                        text.contains(&format!("pad rope {rope}, pad mask {mask}")),
                        "{what} {round}:\n{text}"
                    );
                }
            }
        }
    }
    // No `prefill_pads`: stepped, no marking, no trial.
    let d = tempfile::tempdir().unwrap();
    sim_package(MODEL, d.path(), |_| {});
    let (_, _, j) = report(d.path(), &[], cache.path());
    assert_eq!(j["prefill_tail"], "stepped");
    assert!(j["pad_rope"].is_null() && j["pad_mask"].is_null(), "{j}");
    assert_eq!(j["calibration_trials"], serde_json::json!([]));
    // A forced layout: the default marking, no calibration.
    let d = tempfile::tempdir().unwrap();
    pads_package(d.path(), PadLayout::Last);
    let (_, _, j) = report(d.path(), &["--prefill-tail", "pads_first"], cache.path());
    assert_eq!(
        (&j["prefill_tail"], &j["pad_rope"], &j["pad_mask"]),
        (
            &serde_json::json!("pads_first"),
            &serde_json::json!("identity"),
            &serde_json::json!("masked")
        )
    );
    assert_eq!(j["calibration_trials"], serde_json::json!([]));
}

/// `vlm bench` JSON on `dir` under the timing model `timing`.
fn bench(dir: &Path, extra: &[&str], timing: &str, cache: &Path) -> serde_json::Value {
    let mut args = strings(&["bench"]);
    args.push(dir.display().to_string());
    args.extend(strings(&["--repeats", "1", "--max-new", "2", "--json"]));
    args.extend(strings(extra));
    let out = vlm(&args, cache, &[("BPU_SIM_TIMING", timing)]);
    serde_json::from_str(&ok(&out, &format!("bench {extra:?}"))).unwrap()
}

#[test]
fn bench_prompt_tokens_times_exactly_n_rows_to_the_first_logits() {
    let d = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    sim_package(MODEL, d.path(), |o| {
        o.no_weights = true;
        o.prefill_pads = true;
        o.prefill_min_tail = Some(5);
        o.pad_layout = PadLayout::First;
    });
    let timing = "decode=40,prefill=150,visual=0";
    let padded = bench(
        d.path(),
        &["--prompt-tokens", "31", "--prefill-tail", "pads_first"],
        timing,
        cache.path(),
    );
    assert_eq!(padded["text_prompt_rows"], 31);
    assert_eq!(padded["text_prompt"], "token ids");
    assert_eq!(padded["prefill_tail"], "pads_first");
    let stepped = bench(d.path(), &["--prompt-tokens", "31"], timing, cache.path());
    assert_eq!(stepped["prefill_tail"], "stepped", "no weights: auto steps");
    let (p, s) = (
        padded["text_ttft_s"].as_f64().unwrap(),
        stepped["text_ttft_s"].as_f64().unwrap(),
    );
    // One 150 ms chunk against 31 steps of 40 ms (host time on top).
    assert!((0.15..0.6).contains(&p), "padded 31-row TTFT {p}");
    assert!(s >= 31.0 * 0.04, "stepped 31-row TTFT {s}");
    // Without the prefill graph, 40 rows are 40 decode steps.
    let none = bench(
        d.path(),
        &["--prompt-tokens", "40", "--no-prefill-graph"],
        timing,
        cache.path(),
    );
    assert_eq!(
        (
            none["prefill_chunk"].as_u64(),
            none["text_prompt_rows"].as_u64()
        ),
        (Some(0), Some(40))
    );
    assert!(none["text_ttft_s"].as_f64().unwrap() >= 40.0 * 0.04);
}
