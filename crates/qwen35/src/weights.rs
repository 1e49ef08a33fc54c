//! Safetensors checkpoint access: memory-mapped files, tensors looked up by HF name with
//! shape checks. Vectors (norms, biases, conv taps) are converted to f32 on load (F32, BF16
//! and F16 sources); weight matrices ([`WeightStore::get_matrix`]) keep bf16 as bf16, read in
//! place from the memory map, so a bf16 checkpoint costs its file size in memory, not twice.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use half::bf16;
use safetensors::{Dtype, SafeTensors};

use crate::error::{Error, Result};
use crate::mmap::MappedFile;

struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// bf16 elements, either in place in a checkpoint's memory map or owned.
pub struct Bf16Data(Bf16Storage);

enum Bf16Storage {
    Owned(Vec<bf16>),
    /// `len` elements at byte offset `start` of the map; `start` is even (checked when built).
    Mapped {
        file: Arc<MappedFile>,
        start: usize,
        len: usize,
    },
}

impl Bf16Data {
    pub fn from_vec(v: Vec<bf16>) -> Self {
        Self(Bf16Storage::Owned(v))
    }

    pub fn as_slice(&self) -> &[bf16] {
        match &self.0 {
            Bf16Storage::Owned(v) => v,
            Bf16Storage::Mapped { file, start, len } => {
                bytemuck::try_cast_slice(&file.bytes()[*start..*start + 2 * len])
                    .expect("bf16 views are built only at even offsets of a page-aligned map")
            }
        }
    }

    /// Whether the data is read in place from a memory-mapped checkpoint.
    pub fn is_mapped(&self) -> bool {
        matches!(self.0, Bf16Storage::Mapped { .. })
    }
}

/// A weight matrix in the precision it is computed from: bf16 checkpoints stay bf16
/// (multiplied by the bf16×f32 kernels), everything else is f32.
pub enum WeightData {
    F32(Vec<f32>),
    Bf16(Bf16Data),
}

impl WeightData {
    pub fn len(&self) -> usize {
        match self {
            WeightData::F32(v) => v.len(),
            WeightData::Bf16(b) => b.as_slice().len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends elements `range` widened to f32 (bf16 → f32 is exact).
    pub fn extend_f32(&self, range: std::ops::Range<usize>, out: &mut Vec<f32>) {
        match self {
            WeightData::F32(v) => out.extend_from_slice(&v[range]),
            WeightData::Bf16(b) => out.extend(
                b.as_slice()[range]
                    .iter()
                    .map(|x| crate::kernels::bf16::widen(*x)),
            ),
        }
    }

    /// Bytes held (for logs and the benchmark).
    pub fn size_bytes(&self) -> usize {
        match self {
            WeightData::F32(v) => 4 * v.len(),
            WeightData::Bf16(b) => 2 * b.as_slice().len(),
        }
    }
}

/// All `*.safetensors` files of a checkpoint directory, indexed by tensor name.
pub struct WeightStore {
    files: Vec<Arc<MappedFile>>,
    index: HashMap<String, Entry>,
}

impl WeightStore {
    /// Maps every `*.safetensors` file in `dir` (sorted by name).
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let rd = std::fs::read_dir(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut paths: Vec<PathBuf> = Vec::new();
        for e in rd {
            let e = e.map_err(|source| Error::Io {
                path: dir.to_path_buf(),
                source,
            })?;
            let p = e.path();
            if p.extension().is_some_and(|x| x == "safetensors") {
                paths.push(p);
            }
        }
        paths.sort();
        if paths.is_empty() {
            return Err(Error::Safetensors {
                path: dir.to_path_buf(),
                reason: "no *.safetensors file in the directory".into(),
            });
        }
        Self::open_files(&paths)
    }

    pub fn open_files(paths: &[PathBuf]) -> Result<Self> {
        let mut files = Vec::new();
        let mut index = HashMap::new();
        for (fi, p) in paths.iter().enumerate() {
            let mf = MappedFile::open(p)?;
            {
                let bytes = mf.bytes();
                let st = SafeTensors::deserialize(bytes).map_err(|e| Error::Safetensors {
                    path: p.clone(),
                    reason: format!("{e} (truncated or corrupt file?)"),
                })?;
                let base = bytes.as_ptr() as usize;
                for (name, view) in st.tensors() {
                    let start = view.data().as_ptr() as usize - base;
                    let end = start + view.data().len();
                    index.insert(
                        name,
                        Entry {
                            file: fi,
                            dtype: view.dtype(),
                            shape: view.shape().to_vec(),
                            start,
                            end,
                        },
                    );
                }
            }
            files.push(Arc::new(mf));
        }
        Ok(Self { files, index })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.index.get(name).map(|e| e.shape.as_slice())
    }

    fn entry(&self, name: &str, shape: &[usize]) -> Result<&Entry> {
        let e = self.index.get(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_string(),
        })?;
        if e.shape != shape {
            return Err(Error::TensorShape {
                name: name.to_string(),
                expected: shape.to_vec(),
                found: e.shape.clone(),
            });
        }
        Ok(e)
    }

    /// A weight matrix `name` checked against `shape`: BF16 stays bf16 (in place in the map
    /// when 2-byte aligned, else copied), F32 and F16 become f32 as in [`Self::get_f32`].
    pub fn get_matrix(&self, name: &str, shape: &[usize]) -> Result<WeightData> {
        let e = self.entry(name, shape)?;
        if e.dtype != Dtype::BF16 {
            return self.get_f32(name, shape).map(WeightData::F32);
        }
        let file = &self.files[e.file];
        let len = (e.end - e.start) / 2;
        // in place only where the map's little-endian bytes are the host's u16 layout
        let data = if e.start % 2 == 0 && cfg!(target_endian = "little") {
            Bf16Data(Bf16Storage::Mapped {
                file: Arc::clone(file),
                start: e.start,
                len,
            })
        } else {
            let bytes = &file.bytes()[e.start..e.end];
            Bf16Data::from_vec(
                bytes
                    .chunks_exact(2)
                    .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                    .collect(),
            )
        };
        Ok(WeightData::Bf16(data))
    }

    /// The tensor `name` as f32, checked against `shape`.
    pub fn get_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let e = self.entry(name, shape)?;
        let bytes = &self.files[e.file].bytes()[e.start..e.end];
        let out = match e.dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            other => {
                return Err(Error::TensorDtype {
                    name: name.to_string(),
                    dtype: format!("{other:?}"),
                })
            }
        };
        Ok(out)
    }

    /// Files backing the store (for messages).
    pub fn paths(&self) -> Vec<&Path> {
        self.files.iter().map(|f| f.path()).collect()
    }
}
