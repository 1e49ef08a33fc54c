//! `embed_tokens.bin`: the fp16 `[vocab, hidden]` embedding table, read row by row with
//! positional reads (the page cache does the mapping; no `unsafe` memory map is needed).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use vlm::engine::EngineError;

use super::BpuError;

/// The package's fp16 embedding table.
#[derive(Debug)]
pub struct EmbedTable {
    file: File,
    path: PathBuf,
    vocab: usize,
    hidden: usize,
}

impl EmbedTable {
    /// Opens the table: at least `vocab × hidden × 2` bytes (larger is a warning).
    pub fn open(path: &Path, vocab: usize, hidden: usize) -> Result<Self, BpuError> {
        let err = |reason: String| BpuError::Embed {
            path: path.to_owned(),
            reason,
        };
        let file = File::open(path).map_err(|e| err(format!("cannot open: {e}")))?;
        let len = file
            .metadata()
            .map_err(|e| err(format!("cannot stat: {e}")))?
            .len();
        // As BLLM: at least vocab × hidden fp16 values; a longer file is read up to them.
        let want = (vocab * hidden * 2) as u64;
        if len < want {
            return Err(err(format!(
                "size mismatch: {len} bytes, too small for vocab {vocab} × hidden {hidden} × 2 = {want} (embed table too small)"
            )));
        }
        if len > want {
            tracing::warn!(
                file = %path.display(),
                "{len} bytes, larger than vocab {vocab} × hidden {hidden} × 2 = {want}: the \
                 rows past the vocabulary are ignored"
            );
        }
        Ok(Self {
            file,
            path: path.to_owned(),
            vocab,
            hidden,
        })
    }

    /// Appends the f32 rows of `ids` to `out`.
    pub fn rows(&self, ids: &[u32], out: &mut Vec<f32>) -> Result<(), EngineError> {
        let mut raw = vec![0u8; self.hidden * 2];
        out.reserve(ids.len() * self.hidden);
        for &id in ids {
            if id as usize >= self.vocab {
                return Err(EngineError::TokenId {
                    id,
                    vocab: self.vocab,
                });
            }
            let at = id as u64 * raw.len() as u64;
            self.file
                .read_exact_at(&mut raw, at)
                .map_err(|e| EngineError::Config {
                    reason: format!("{}: read of row {id} failed: {e}", self.path.display()),
                })?;
            out.extend(
                raw.chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
            );
        }
        Ok(())
    }
}
