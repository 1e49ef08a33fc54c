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
        // The sizes come from the graphs: a product that does not fit is a broken package,
        // not a wrapped (or panicking) size.
        let want = hidden
            .checked_mul(2)
            .and_then(|row| vocab.checked_mul(row))
            .and_then(|x| u64::try_from(x).ok())
            .ok_or_else(|| {
                err(format!(
                    "vocab {vocab} × hidden {hidden} × 2 bytes overflows"
                ))
            })?;
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
        // `open` checked that `hidden × 2` fits; the row buffer is allocated for the first
        // id in the vocabulary, so an empty table never allocates a row.
        let mut raw = Vec::new();
        let values = ids
            .len()
            .checked_mul(self.hidden)
            .ok_or_else(|| EngineError::Config {
                reason: format!("{} rows of {} values overflow", ids.len(), self.hidden),
            })?;
        out.reserve(values);
        for &id in ids {
            if id as usize >= self.vocab {
                return Err(EngineError::TokenId {
                    id,
                    vocab: self.vocab,
                });
            }
            raw.resize(self.hidden * 2, 0);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Graph sizes whose table would not fit a `usize` are an error naming the file, not an
    /// overflow; sizes that fit still read their rows.
    #[test]
    fn overflowing_table_sizes_are_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("embed_tokens.bin");
        let rows: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect();
        std::fs::write(&path, &rows).unwrap();
        for (vocab, hidden) in [
            (usize::MAX / 2, 4),
            (2, usize::MAX / 2 + 1),
            (0, usize::MAX),
        ] {
            match EmbedTable::open(&path, vocab, hidden) {
                Err(BpuError::Embed { reason, .. }) => {
                    assert!(reason.contains("overflows"), "{reason}")
                }
                other => panic!("vocab {vocab} hidden {hidden}: {other:?}"),
            }
        }
        let t = EmbedTable::open(&path, 2, 2).unwrap();
        let mut out = Vec::new();
        t.rows(&[1, 0], &mut out).unwrap();
        assert_eq!(out, [3.0, 4.0, 1.0, 2.0]);
        assert!(matches!(
            t.rows(&[2], &mut out),
            Err(EngineError::TokenId { id: 2, vocab: 2 })
        ));
    }
}
