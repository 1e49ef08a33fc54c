//! Decode-state snapshots in the format of docs/package-contract.md §10.2: an int32 header
//! `{magic "BLKJ", nCache, vocab, P, logitBytes, CL, maxPos}`, the nCache full cache sizes,
//! then each cache — a window-indexed K/V cache only as its last `D = min(P, CL)` occupied
//! rows, any other cache whole — then the raw decode-logits buffer. Little-endian (the host
//! order on every target we run on).

use super::error::EngineError;

/// `"BLKJ"` as bllm writes it (`0x424C4B4A`).
pub const STATE_MAGIC: u32 = 0x424C_4B4A;
const HEADER_WORDS: usize = 7;

/// One cache buffer of a backend's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLayout {
    /// Full buffer size in bytes.
    pub bytes: usize,
    /// `Some(stride0)` for a window-indexed K/V cache (`dim[0] == CL`, `stride0 · CL == bytes`):
    /// bytes per window row. `None` = saved whole (GDN state, conv).
    pub window_row_bytes: Option<usize>,
}

impl CacheLayout {
    /// Byte range of the buffer a state with `consumed` rows occupies (right-aligned rows
    /// for window caches, everything otherwise).
    pub fn occupied(&self, consumed: usize, context: usize) -> std::ops::Range<usize> {
        match self.window_row_bytes {
            Some(row) => {
                let d = consumed.min(context);
                (context - d) * row..context * row
            }
            None => 0..self.bytes,
        }
    }
}

/// What a backend's state looks like; a blob is accepted only when it matches exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateShape {
    pub vocab: usize,
    pub context: usize,
    pub logit_bytes: usize,
    pub caches: Vec<CacheLayout>,
}

/// A parked decode state (bytes in the contract's format).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateBlob {
    bytes: Vec<u8>,
}

/// A blob read against a [`StateShape`]: scalars and borrowed payloads.
#[derive(Debug)]
pub struct StateView<'a> {
    pub consumed: usize,
    pub max_pos: Option<u32>,
    /// Per cache: the occupied byte range inside the full buffer and its bytes.
    pub caches: Vec<(std::ops::Range<usize>, &'a [u8])>,
    pub logits: &'a [u8],
}

fn word(v: usize, what: &str) -> Result<i32, EngineError> {
    i32::try_from(v).map_err(|_| EngineError::State {
        reason: format!("{what} {v} does not fit the format's int32"),
    })
}

impl StateBlob {
    /// Serialises a state. `caches[i]` holds the full bytes of cache `i`; `logits` the raw
    /// decode-logits buffer (`shape.logit_bytes` long).
    pub fn build(
        shape: &StateShape,
        consumed: usize,
        max_pos: Option<u32>,
        caches: &[&[u8]],
        logits: &[u8],
    ) -> Result<Self, EngineError> {
        Self::build_reusing(None, shape, consumed, max_pos, caches, logits)
    }

    /// [`StateBlob::build`] into the allocation of `spare`, a snapshot no longer needed: a
    /// fresh one of some 60 MB is paid in page faults, on an ask's path when a stopped
    /// priming is parked.
    pub fn build_reusing(
        spare: Option<StateBlob>,
        shape: &StateShape,
        consumed: usize,
        max_pos: Option<u32>,
        caches: &[&[u8]],
        logits: &[u8],
    ) -> Result<Self, EngineError> {
        if caches.len() != shape.caches.len() || logits.len() != shape.logit_bytes {
            return Err(EngineError::State {
                reason: format!(
                    "{} caches / {} logit bytes given, the state has {} / {}",
                    caches.len(),
                    logits.len(),
                    shape.caches.len(),
                    shape.logit_bytes
                ),
            });
        }
        let max_pos = match max_pos {
            Some(m) => word(m as usize, "maxPos")?,
            None => -1,
        };
        let header = [
            STATE_MAGIC as i32,
            word(shape.caches.len(), "nCache")?,
            word(shape.vocab, "vocab")?,
            word(consumed, "P")?,
            word(shape.logit_bytes, "logitBytes")?,
            word(shape.context, "CL")?,
            max_pos,
        ];
        let payload: usize = shape
            .caches
            .iter()
            .map(|c| c.occupied(consumed, shape.context).len())
            .sum();
        // One allocation at most: growing a 60 MB snapshot by doubling copies it twice over.
        let mut bytes = spare.map(Self::into_bytes).unwrap_or_default();
        bytes.clear();
        bytes.reserve((header.len() + shape.caches.len()) * 4 + payload + logits.len());
        for w in header {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        for c in &shape.caches {
            bytes.extend_from_slice(&word(c.bytes, "cache size")?.to_le_bytes());
        }
        for (layout, data) in shape.caches.iter().zip(caches) {
            if data.len() != layout.bytes {
                return Err(EngineError::State {
                    reason: format!(
                        "cache of {} bytes given for a {}-byte layout",
                        data.len(),
                        layout.bytes
                    ),
                });
            }
            bytes.extend_from_slice(&data[layout.occupied(consumed, shape.context)]);
        }
        bytes.extend_from_slice(logits);
        Ok(Self { bytes })
    }

    /// Wraps bytes read back from storage; they are checked when restored.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self { bytes }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Size of the snapshot in bytes.
    pub fn size_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Rows consumed (`P`) recorded in the header, if the header is readable.
    pub fn consumed(&self) -> Option<usize> {
        self.words(HEADER_WORDS)
            .and_then(|w| usize::try_from(w[3]).ok())
    }

    fn words(&self, n: usize) -> Option<Vec<i32>> {
        let b = self.bytes.get(..n * 4)?;
        Some(
            b.chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        )
    }

    /// Checks the blob against `shape` (magic, nCache, vocab, logit bytes, CL and every cache
    /// size, as bllm does) and returns its parts.
    pub fn view(&self, shape: &StateShape) -> Result<StateView<'_>, EngineError> {
        let bad = |reason: String| EngineError::State { reason };
        let n = shape.caches.len();
        let w = self.words(HEADER_WORDS + n).ok_or_else(|| {
            bad(format!(
                "truncated: {} bytes, no complete header",
                self.bytes.len()
            ))
        })?;
        if w[0] != STATE_MAGIC as i32 {
            return Err(bad(format!("bad magic {:#010x}", w[0])));
        }
        let expect = |i: usize, what: &str, want: usize| -> Result<(), EngineError> {
            if usize::try_from(w[i]).ok() == Some(want) {
                Ok(())
            } else {
                Err(bad(format!(
                    "{what} is {} but this model has {want}: the state does not match this model",
                    w[i]
                )))
            }
        };
        expect(1, "nCache", n)?;
        expect(2, "vocab", shape.vocab)?;
        expect(4, "logitBytes", shape.logit_bytes)?;
        expect(5, "CL", shape.context)?;
        for (i, c) in shape.caches.iter().enumerate() {
            expect(HEADER_WORDS + i, "cache size", c.bytes)?;
        }
        let consumed = usize::try_from(w[3]).map_err(|_| bad(format!("negative P {}", w[3])))?;
        let max_pos = match w[6] {
            -1 => None,
            m => Some(u32::try_from(m).map_err(|_| bad(format!("bad maxPos {m}")))?),
        };
        if (consumed == 0) != max_pos.is_none() {
            return Err(bad(format!("P {consumed} and maxPos {max_pos:?} disagree")));
        }
        let mut off = (HEADER_WORDS + n) * 4;
        let mut caches = Vec::with_capacity(n);
        for c in &shape.caches {
            let range = c.occupied(consumed, shape.context);
            let end = off + range.len();
            let data = self
                .bytes
                .get(off..end)
                .ok_or_else(|| bad("truncated / corrupt state (cache data)".into()))?;
            caches.push((range, data));
            off = end;
        }
        let logits = self
            .bytes
            .get(off..off + shape.logit_bytes)
            .ok_or_else(|| bad("truncated / corrupt state (logits)".into()))?;
        if off + shape.logit_bytes != self.bytes.len() {
            return Err(bad(format!(
                "{} trailing bytes after the logits",
                self.bytes.len() - off - shape.logit_bytes
            )));
        }
        Ok(StateView {
            consumed,
            max_pos,
            caches,
            logits,
        })
    }
}
