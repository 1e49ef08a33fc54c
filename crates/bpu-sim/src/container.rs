//! The sim `.hbm` container: our own versioned format, never confused with a real `.hbm`.
//!
//! Layout (little-endian): magic `BPUSIMHB` (8 bytes), version `u32`, header length `u64`,
//! header (UTF-8 JSON, [`Header`]), payload (a safetensors blob, possibly empty).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::pads::{PadMask, PadRope};

/// First bytes of every sim container.
pub const MAGIC: &[u8; 8] = b"BPUSIMHB";
/// Current container version.
pub const VERSION: u32 = 1;
const PREAMBLE: usize = 8 + 4 + 8;

/// Errors reading or writing a container; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a sim container (no BPUSIMHB magic)", path.display())]
    NoMagic { path: PathBuf },
    #[error("{}: sim container version {found} is not supported (this build reads {VERSION})", path.display())]
    Version { path: PathBuf, found: u32 },
    #[error("{}: corrupt sim container: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
}

/// One tensor as the simulated runtime reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorDesc {
    pub shape: Vec<i32>,
    /// `HB_DNN_TENSOR_TYPE_*` value.
    pub dtype: i32,
    /// Byte strides as reported; `-1` = dense (resolved with 32-byte alignment).
    pub strides: Vec<i64>,
    /// Quantisation scale (empty = none).
    #[serde(default)]
    pub scale: Vec<f32>,
}

/// What a graph computes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GraphKind {
    /// Test graph: every output `i` = input `i` × `mul` + `add`, element-wise on f32 tensors of
    /// equal shape (strides may differ).
    Affine { mul: f32, add: f32 },
    /// Qwen3.5 text graph over `rows` rows (1 = decode), docs/package-contract.md §3/§4.
    Qwen35Text(TextParams),
    /// Qwen3.5 vision tower, docs/package-contract.md §6.
    Visual(VisualParams),
}

/// Logits element type of a text graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogitsType {
    F32,
    S16,
}

/// Variant flags of a text graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextParams {
    /// Rows per run: 1 for decode, N for prefill.
    pub rows: usize,
    /// K/V window (cache_len).
    pub window: usize,
    /// Leading dim of the mask: 1 or the attention head count.
    pub mask_heads: usize,
    /// Prefill only: emit logits for every row (`true`) or the last row only.
    pub logits_all_rows: bool,
    pub logits: LogitsType,
    /// Scale of S16 logits.
    pub logits_scale: f32,
    /// Prefill only: the padded-tail protocol inferred in docs/package-contract.md §4.4 (unconfirmed on
    /// a board). The graph counts its pads `N − t` as the rows carrying its marking
    /// ([`TextParams::pad_rope`] and [`TextParams::pad_mask`], [`crate::pads`]) and takes the
    /// rows where [`TextParams::pad_layout`] puts pads as the pads, whatever the runtime put
    /// there; pads leave GDN state untouched and their K/V rows are zero where an `N`-row
    /// shift puts them. With no row so marked, all `N` rows run as real ones.
    #[serde(default)]
    pub pads: bool,
    /// Where a padded graph expects its pad rows (the layout it was compiled for).
    #[serde(default, skip_serializing_if = "PadLayout::is_last")]
    pub pad_layout: PadLayout,
    /// The rope a padded graph recognises its pads by.
    #[serde(default, skip_serializing_if = "PadRope::is_identity")]
    pub pad_rope: PadRope,
    /// The mask row a padded graph recognises its pads by.
    #[serde(default, skip_serializing_if = "PadMask::is_masked")]
    pub pad_mask: PadMask,
    /// Every tensor reports `-1` strides and `alignedByteSize` `-1` (as real graphs may): the
    /// runtime picks the layout and `hbDNNInferV2` checks it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub dynamic_strides: bool,
    /// S16 logits carry one scale per vocabulary entry (`scaleLen` = vocab, `quantizeAxis` =
    /// the last axis): a runtime that reads `scale[0]` only gets wrong logits.
    #[serde(default, skip_serializing_if = "is_false")]
    pub logits_per_axis: bool,
    /// K/V windows of one head (`[CL, 1, D]`) report other strides on the output side than on
    /// the input side (the size-1 head dim's), describing the same bytes.
    #[serde(default, skip_serializing_if = "is_false")]
    pub cache_out_strides: bool,
    /// Bytes the cache tensors' `alignedByteSize` reports beyond `stride[0] × dim[0]` (0:
    /// none), as a board graph may pad its allocation: the runtime must allocate that much.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_aligned_extra: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Where a padded prefill graph expects the `N − t` pad rows of a chunk with `t` real rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PadLayout {
    /// Pads in rows `0..N−t`, the real rows last: the physically last row is the last real
    /// one, so a last-row logits output stays correct.
    First,
    /// Real rows in `0..t`, pads after them: a last-row logits output gives row `t − 1`'s.
    #[default]
    Last,
}

impl PadLayout {
    fn is_last(&self) -> bool {
        *self == PadLayout::Last
    }

    /// `first` or `last`.
    pub fn as_str(self) -> &'static str {
        match self {
            PadLayout::First => "first",
            PadLayout::Last => "last",
        }
    }
}

impl std::str::FromStr for PadLayout {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "first" => Ok(PadLayout::First),
            "last" => Ok(PadLayout::Last),
            other => Err(format!("pad layout {other:?}: expected `first` or `last`")),
        }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn two() -> usize {
    2
}

fn is_two(r: &usize) -> bool {
    *r == 2
}

/// Geometry of the vision graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VisualParams {
    pub image_size: usize,
    pub output: LogitsType,
    pub output_scale: f32,
    /// Rank of the tower's input and output: 2 (`[n, len]`) or more, with leading 1s.
    #[serde(default = "two", skip_serializing_if = "is_two")]
    pub rank: usize,
    /// As [`TextParams::dynamic_strides`].
    #[serde(default, skip_serializing_if = "is_false")]
    pub dynamic_strides: bool,
}

impl GraphKind {
    /// Whether the graph reports `-1` strides and `alignedByteSize` (the runtime picks the
    /// layout).
    pub fn dynamic_strides(&self) -> bool {
        match self {
            GraphKind::Qwen35Text(p) => p.dynamic_strides,
            GraphKind::Visual(p) => p.dynamic_strides,
            GraphKind::Affine { .. } => false,
        }
    }
}

/// One graph in a container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphDesc {
    pub name: String,
    #[serde(flatten)]
    pub kind: GraphKind,
    pub inputs: Vec<TensorDesc>,
    pub outputs: Vec<TensorDesc>,
    /// BPU cores the graph claims to be compiled for.
    #[serde(default = "one")]
    pub compile_cores: i32,
}

fn one() -> i32 {
    1
}

/// The JSON header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub graphs: Vec<GraphDesc>,
    /// The HF `config.json` of the source checkpoint (text graphs and the tower need it).
    #[serde(default)]
    pub config: Option<serde_json::Value>,
    /// False for a `--no-weights` package: only timing is modelled; text graphs emit a fixed
    /// synthetic logits output, nothing else is written.
    #[serde(default = "yes")]
    pub has_weights: bool,
    /// BPU architecture the graphs were compiled for (`nash-m` = S100/S100P, `nash-e` = S100
    /// J6E, `nash-p` = S600); `None` (older containers) = any. An optional key, so version 1
    /// containers without it stay readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub march: Option<String>,
}

fn yes() -> bool {
    true
}

/// A parsed container: header plus the payload bytes (safetensors, may be empty).
#[derive(Debug, Clone)]
pub struct Container {
    pub header: Header,
    pub payload: Vec<u8>,
}

impl Container {
    /// Serialises to bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, serde_json::Error> {
        let header = serde_json::to_vec(&self.header)?;
        let mut out = Vec::with_capacity(PREAMBLE + header.len() + self.payload.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(header.len() as u64).to_le_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(&self.payload);
        Ok(out)
    }

    /// Writes to `path`.
    pub fn write(&self, path: &Path) -> Result<(), ContainerError> {
        let bytes = self.to_bytes().map_err(|e| ContainerError::Corrupt {
            path: path.to_owned(),
            reason: format!("header does not serialise: {e}"),
        })?;
        std::fs::write(path, bytes).map_err(|source| ContainerError::Io {
            path: path.to_owned(),
            source,
        })
    }

    /// Parses bytes read from `path` (named in errors).
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Self, ContainerError> {
        if !bytes.starts_with(MAGIC) {
            return Err(ContainerError::NoMagic {
                path: path.to_owned(),
            });
        }
        let corrupt = |reason: String| ContainerError::Corrupt {
            path: path.to_owned(),
            reason,
        };
        if bytes.len() < PREAMBLE {
            return Err(corrupt(format!(
                "{} bytes, shorter than the preamble",
                bytes.len()
            )));
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4-byte slice"));
        if version != VERSION {
            return Err(ContainerError::Version {
                path: path.to_owned(),
                found: version,
            });
        }
        let hlen = u64::from_le_bytes(bytes[12..20].try_into().expect("8-byte slice"));
        let end = usize::try_from(hlen)
            .ok()
            .and_then(|h| PREAMBLE.checked_add(h))
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| corrupt(format!("header length {hlen} exceeds the file")))?;
        let header: Header = serde_json::from_slice(&bytes[PREAMBLE..end])
            .map_err(|e| corrupt(format!("header: {e}")))?;
        header.validate().map_err(corrupt)?;
        Ok(Self {
            header,
            payload: bytes[end..].to_vec(),
        })
    }

    /// Reads only the header of a file (the payload of a weighted container can be large).
    pub fn read_header(path: &Path) -> Result<Header, ContainerError> {
        use std::io::Read;
        let io = |source| ContainerError::Io {
            path: path.to_owned(),
            source,
        };
        let mut f = std::fs::File::open(path).map_err(io)?;
        let mut pre = Vec::with_capacity(PREAMBLE);
        (&mut f)
            .take(PREAMBLE as u64)
            .read_to_end(&mut pre)
            .map_err(io)?;
        if pre.len() == PREAMBLE && pre.starts_with(MAGIC) && pre[8..12] == VERSION.to_le_bytes() {
            let hlen = u64::from_le_bytes(pre[12..20].try_into().expect("8-byte slice"));
            let len = f.metadata().map_err(io)?.len();
            if hlen <= len {
                let mut header = Vec::new();
                f.take(hlen).read_to_end(&mut header).map_err(io)?;
                pre.extend_from_slice(&header);
            }
        }
        // Parsing the preamble and header alone reports every error `parse` would.
        Ok(Self::parse(path, &pre)?.header)
    }

    /// Reads and parses a file.
    pub fn read(path: &Path) -> Result<Self, ContainerError> {
        let bytes = std::fs::read(path).map_err(|source| ContainerError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &bytes)
    }
}

impl Header {
    fn validate(&self) -> Result<(), String> {
        if self.graphs.is_empty() {
            return Err("no graphs".into());
        }
        for g in &self.graphs {
            if g.name.is_empty() || g.name.contains('\0') {
                return Err(format!("bad graph name {:?}", g.name));
            }
            for (side, list) in [("input", &g.inputs), ("output", &g.outputs)] {
                for (i, t) in list.iter().enumerate() {
                    let rank = t.shape.len();
                    if rank == 0 || rank > hbdnn_sys::HB_DNN_TENSOR_MAX_DIMENSIONS as usize {
                        return Err(format!("{}: {side} {i}: rank {rank}", g.name));
                    }
                    if t.strides.len() != rank || t.shape.iter().any(|&d| d <= 0) {
                        return Err(format!(
                            "{}: {side} {i}: shape {:?} strides {:?}",
                            g.name, t.shape, t.strides
                        ));
                    }
                    if g.kind.dynamic_strides() && t.strides.iter().any(|&s| s >= 0) {
                        return Err(format!(
                            "{}: {side} {i}: fixed strides {:?} in a graph with dynamic strides",
                            g.name, t.strides
                        ));
                    }
                    if elem_size(t.dtype).is_none() {
                        return Err(format!(
                            "{}: {side} {i}: unsupported dtype {}",
                            g.name, t.dtype
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Bytes per element of the dtypes the simulator supports.
pub fn elem_size(dtype: i32) -> Option<usize> {
    use hbdnn_sys::*;
    match dtype {
        HB_DNN_TENSOR_TYPE_S8 | HB_DNN_TENSOR_TYPE_U8 | HB_DNN_TENSOR_TYPE_BOOL8 => Some(1),
        HB_DNN_TENSOR_TYPE_F16 | HB_DNN_TENSOR_TYPE_S16 | HB_DNN_TENSOR_TYPE_U16 => Some(2),
        HB_DNN_TENSOR_TYPE_F32 | HB_DNN_TENSOR_TYPE_S32 | HB_DNN_TENSOR_TYPE_U32 => Some(4),
        HB_DNN_TENSOR_TYPE_F64 | HB_DNN_TENSOR_TYPE_S64 | HB_DNN_TENSOR_TYPE_U64 => Some(8),
        _ => None,
    }
}

/// Byte strides with `-1` resolved the way the runtime documents it (32-byte alignment), an
/// implementation independent of the wrapper's.
pub fn resolved_strides(t: &TensorDesc) -> Vec<usize> {
    let esz = elem_size(t.dtype).unwrap_or(1);
    let rank = t.shape.len();
    let mut s = vec![0usize; rank];
    for d in (0..rank).rev() {
        s[d] = if t.strides[d] >= 0 {
            t.strides[d] as usize
        } else if d + 1 == rank {
            esz
        } else {
            (s[d + 1] * t.shape[d + 1] as usize).div_ceil(32) * 32
        };
    }
    s
}

/// `alignedByteSize` of a tensor: `stride[0] × dim[0]` after resolution.
pub fn byte_size(t: &TensorDesc) -> usize {
    resolved_strides(t)[0] * t.shape[0] as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            graphs: vec![GraphDesc {
                name: "g".into(),
                kind: GraphKind::Affine { mul: 2.0, add: 1.0 },
                inputs: vec![TensorDesc {
                    shape: vec![3, 5],
                    dtype: 7,
                    strides: vec![-1, -1],
                    scale: vec![],
                }],
                outputs: vec![TensorDesc {
                    shape: vec![3, 5],
                    dtype: 7,
                    strides: vec![64, 4],
                    scale: vec![],
                }],
                compile_cores: 1,
            }],
            config: None,
            has_weights: true,
            march: Some("nash-m".into()),
        }
    }

    #[test]
    fn round_trip_and_rejections() {
        let p = Path::new("x.hbm");
        let c = Container {
            header: header(),
            payload: vec![1, 2, 3],
        };
        let bytes = c.to_bytes().unwrap();
        let back = Container::parse(p, &bytes).unwrap();
        assert_eq!(back.header, c.header);
        assert_eq!(back.payload, vec![1, 2, 3]);
        let mut v2 = bytes.clone();
        v2[8] = 2;
        assert!(matches!(
            Container::parse(p, &v2),
            Err(ContainerError::Version { found: 2, .. })
        ));
        assert!(matches!(
            Container::parse(p, &bytes[..15]),
            Err(ContainerError::Corrupt { .. })
        ));
        assert!(matches!(
            Container::parse(p, b"HBM\0something"),
            Err(ContainerError::NoMagic { .. })
        ));
        let mut bad = bytes.clone();
        bad[21] = b'!';
        let err = Container::parse(p, &bad).unwrap_err();
        assert!(err.to_string().contains("x.hbm"), "{err}");
    }

    #[test]
    fn strides_resolve_with_32_byte_alignment() {
        let t = &header().graphs[0].inputs[0];
        assert_eq!(resolved_strides(t), vec![32, 4]);
        assert_eq!(byte_size(t), 96);
        let o = &header().graphs[0].outputs[0];
        assert_eq!(byte_size(o), 192);
    }
}
