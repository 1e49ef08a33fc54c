//! The one memory-map module of the crate (docs/conventions.md: `unsafe` is allowed here).
#![allow(unsafe_code)]

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A read-only memory map of a whole file.
pub struct MappedFile {
    map: memmap2::Mmap,
    path: PathBuf,
}

impl MappedFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        // SAFETY: the map is read-only and lives as long as `self`; checkpoints are not
        // modified while a model uses them (a concurrent writer could change the bytes we read,
        // which gives wrong numbers, not memory unsafety in our code: we only read `&[u8]`).
        // bf16 weight matrices are read in place for the model's whole life, so truncating
        // the file while a model is loaded would fault (SIGBUS) on the next read: replace
        // checkpoints by writing a new file and renaming it, never in place.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self {
            map,
            path: path.to_path_buf(),
        })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}
