//! Shared helpers of the vlm integration tests.
#![allow(clippy::unwrap_used, dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use tokenizers::Tokenizer;

/// The committed tiny fixture tokenizer (Qwen3.5 pre-tokeniser and the real special-token
/// names, ids 600..=632).
pub fn tokenizer() -> Arc<Tokenizer> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/fixtures/tokenizer.json");
    Arc::new(Tokenizer::from_file(path).unwrap())
}

pub fn encode(tok: &Tokenizer, text: &str) -> Vec<u32> {
    tok.encode(text, false).unwrap().get_ids().to_vec()
}
