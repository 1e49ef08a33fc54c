//! Vision input: any RGB8 frame → the tower's bucket (Pillow-exact bicubic) → normalised,
//! patchified `[n_patch, 3·T·P·P]` rows in the tower's merged order.

pub mod preprocess;
pub mod resize;

pub use preprocess::{patchify_merged, preprocess, Geometry, PixelValues};
pub use resize::{resize_bicubic, RgbImage};

/// Errors of image preprocessing.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VisionError {
    #[error("image {width}x{height} must have {expected} bytes of RGB8, has {actual}")]
    BadBuffer {
        width: usize,
        height: usize,
        expected: usize,
        actual: usize,
    },
    #[error("image size {width}x{height} is empty")]
    Empty { width: usize, height: usize },
    #[error("bucket {side} px does not fit the tower geometry (patch {patch}, merge {merge})")]
    BadGeometry {
        side: usize,
        patch: usize,
        merge: usize,
    },
    #[error("patchify: {0}")]
    Patchify(String),
    /// A size of the geometry (from a package or a graph's shape) whose product overflows.
    #[error("tower geometry overflows: {0}")]
    Overflow(String),
}
