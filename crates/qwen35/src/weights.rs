//! Safetensors checkpoint access: memory-mapped files, tensors looked up by HF name with
//! shape checks, converted to f32 on load (F32, BF16 and F16 sources).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

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

/// All `*.safetensors` files of a checkpoint directory, indexed by tensor name.
pub struct WeightStore {
    files: Vec<MappedFile>,
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
            files.push(mf);
        }
        Ok(Self { files, index })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.index.get(name).map(|e| e.shape.as_slice())
    }

    /// The tensor `name` as f32, checked against `shape`.
    pub fn get_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
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
