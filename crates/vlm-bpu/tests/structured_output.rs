//! Structured output on the BPU backend over the simulator: sim packages of the fixture
//! models run the body `vlm` runs on the CPU backend (`vlm/tests/structured/mod.rs`).
#![allow(clippy::unwrap_used)]

use vlm_testkit as common;

include!("../../vlm/tests/structured/mod.rs");

use vlm_bpu::{open_assistant, ModelSource, OpenOptions};

/// A sim package of fixture model `model` (fixture tokenizer, 512-row window) in `dir`.
fn open(model: &str, dir: &tempfile::TempDir) -> Assistant {
    let pkg = dir.path().join(model);
    common::sim_package(model, &pkg, |o| o.cache_len = 512);
    open_assistant(&ModelSource::Package(pkg), &OpenOptions::default()).unwrap()
}

#[test]
fn random_models_answer_valid_json() {
    let dir = tempfile::tempdir().unwrap();
    let mut seen = Seen::default();
    for model in ["tiny-4b", "tiny-untied"] {
        seen.merge(answers_validate(&mut open(model, &dir), 100..140));
    }
    seen.assert_varied();
}

#[test]
fn thinking_is_free_and_the_value_follows() {
    let dir = tempfile::tempdir().unwrap();
    thinking_then_value(&mut open("tiny-sym", &dir), 0..6);
}

#[test]
fn an_answer_cut_by_max_new_tokens_is_incomplete() {
    let dir = tempfile::tempdir().unwrap();
    cut_answer_is_incomplete(&mut open("tiny-untied", &dir));
}

#[test]
fn each_turn_of_a_conversation_has_its_own_schema() {
    let dir = tempfile::tempdir().unwrap();
    schema_per_turn(&mut open("tiny-4b", &dir));
}

#[test]
fn unenforceable_schemas_and_conflicts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    refusals(&mut open("tiny-sym", &dir));
}
