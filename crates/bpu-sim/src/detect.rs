//! Which implementation runs a package: decided by its `.hbm` files, before any library is
//! loaded, never by a silent fallback.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::container::{Container, MAGIC};

/// The implementation a set of `.hbm` files needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Implementation {
    /// Every file is a sim container: run on the simulator.
    Sim,
    /// Every file is a real `.hbm`: run on the board libraries.
    Board,
}

impl std::fmt::Display for Implementation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Implementation::Sim => "simulator",
            Implementation::Board => "board libraries",
        })
    }
}

/// Why a set of files cannot be run; every variant names the offending file.
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    #[error("no .hbm files given")]
    Empty,
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: neither a sim container nor a real .hbm: {reason}", path.display())]
    Unrecognised { path: PathBuf, reason: String },
    #[error("{}: invalid sim container: {source}", path.display())]
    BadContainer {
        path: PathBuf,
        #[source]
        source: crate::container::ContainerError,
    },
    #[error("{} is a {found} file but {} is a {first} file: a package cannot mix sim containers and real .hbm files", path.display(), first_path.display())]
    Mixed {
        path: PathBuf,
        found: Implementation,
        first_path: PathBuf,
        first: Implementation,
    },
    #[error("{} needs the {found}, but the {requested} was requested explicitly", path.display())]
    Contradiction {
        path: PathBuf,
        found: Implementation,
        requested: Implementation,
    },
}

/// Smallest file we accept as a real `.hbm` (the real format is not public; real files are
/// hundreds of megabytes, so anything this small is certainly not one).
pub const MIN_REAL_HBM: u64 = 4096;

/// Classifies one file.
pub fn classify(path: &Path) -> Result<Implementation, DetectError> {
    let io = |source| DetectError::Io {
        path: path.to_owned(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let mut head = vec![0u8; 512.min(len as usize)];
    f.read_exact(&mut head).map_err(io)?;
    let unrecognised = |reason: String| DetectError::Unrecognised {
        path: path.to_owned(),
        reason,
    };
    if head.starts_with(MAGIC) {
        Container::read(path).map_err(|source| DetectError::BadContainer {
            path: path.to_owned(),
            source,
        })?;
        return Ok(Implementation::Sim);
    }
    if head.starts_with(&MAGIC[..6]) {
        return Err(unrecognised("damaged sim container magic".into()));
    }
    if len < MIN_REAL_HBM {
        return Err(unrecognised(format!(
            "{len} bytes is too small for a compiled model"
        )));
    }
    let text = head
        .iter()
        .all(|&b| b == b'\n' || b == b'\r' || b == b'\t' || (0x20..0x7f).contains(&b));
    if text {
        return Err(unrecognised("the file is plain text".into()));
    }
    Ok(Implementation::Board)
}

/// Classifies a package's `.hbm` files; all must agree, and must match `requested` if given.
pub fn inspect_package<P: AsRef<Path>>(
    files: &[P],
    requested: Option<Implementation>,
) -> Result<Implementation, DetectError> {
    let mut first: Option<(PathBuf, Implementation)> = None;
    for p in files {
        let path = p.as_ref();
        let found = classify(path)?;
        if let Some(req) = requested {
            if req != found {
                return Err(DetectError::Contradiction {
                    path: path.to_owned(),
                    found,
                    requested: req,
                });
            }
        }
        match &first {
            None => first = Some((path.to_owned(), found)),
            Some((fp, fi)) if *fi != found => {
                return Err(DetectError::Mixed {
                    path: path.to_owned(),
                    found,
                    first_path: fp.clone(),
                    first: *fi,
                })
            }
            Some(_) => {}
        }
    }
    let (_, imp) = first.ok_or(DetectError::Empty)?;
    tracing::info!(implementation = %imp, "package implementation chosen by its .hbm files");
    Ok(imp)
}
