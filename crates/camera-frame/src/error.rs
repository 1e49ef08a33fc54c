//! Why a frame was refused or could not be converted.

use crate::encoding::Codec;

/// A frame that failed validation on arrival or failed to decode when converted.
///
/// Every variant names the offending values so the node's rate-limited warning can say exactly
/// what the camera sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// `sensor_msgs/Image.encoding` is not one this crate converts.
    #[error("unknown image encoding {encoding:?}")]
    UnknownEncoding { encoding: String },
    /// `sensor_msgs/CompressedImage.format` names no codec this crate decodes.
    #[error("unsupported compressed image format {format:?}: {reason}")]
    UnknownFormat {
        format: String,
        reason: &'static str,
    },
    /// Width or height is zero.
    #[error("empty image: {width}x{height}")]
    ZeroSize { width: u32, height: u32 },
    /// Width or height is above the configured maximum.
    #[error("image {width}x{height} exceeds the limit {max_width}x{max_height}")]
    TooLarge {
        width: u32,
        height: u32,
        max_width: u32,
        max_height: u32,
    },
    /// The payload is bigger than the configured byte cap.
    #[error("image data of {len} bytes exceeds the limit of {max} bytes")]
    DataTooLarge { len: usize, max: usize },
    /// A chroma-subsampled encoding with a width or height it cannot carry (YUV 4:2:2 needs an
    /// even width, NV12 an even width and height).
    #[error("{encoding} needs an even {dimension}, got {value}")]
    OddSize {
        encoding: &'static str,
        dimension: &'static str,
        value: u32,
    },
    /// `step` is shorter than one row of pixels.
    #[error("{encoding} row step {step} is below the minimum {min_step} for width {width}")]
    StepTooSmall {
        encoding: &'static str,
        step: u32,
        min_step: u64,
        width: u32,
    },
    /// The payload is shorter than the rows (and planes) the header describes.
    #[error("{encoding} data has {len} bytes, the header needs at least {needed}")]
    DataTooShort {
        encoding: &'static str,
        len: usize,
        needed: u64,
    },
    /// A jpeg/png payload does not start with that codec's signature.
    #[error("{codec} data does not start with the {codec} signature")]
    BadMagic { codec: Codec },
    /// The jpeg/png header could not be read (checked on arrival, without decoding pixels).
    #[error("{codec} header unreadable: {reason}")]
    BadHeader { codec: Codec, reason: String },
    /// The jpeg/png pixels could not be decoded (found only when the frame is converted).
    #[error("{codec} decode failed: {reason}")]
    Decode { codec: Codec, reason: String },
}

/// The variant of a [`FrameError`] without its fields, for counting and matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameErrorKind {
    UnknownEncoding,
    UnknownFormat,
    ZeroSize,
    TooLarge,
    DataTooLarge,
    OddSize,
    StepTooSmall,
    DataTooShort,
    BadMagic,
    BadHeader,
    Decode,
}

impl FrameError {
    /// The variant without its fields.
    pub fn kind(&self) -> FrameErrorKind {
        match self {
            Self::UnknownEncoding { .. } => FrameErrorKind::UnknownEncoding,
            Self::UnknownFormat { .. } => FrameErrorKind::UnknownFormat,
            Self::ZeroSize { .. } => FrameErrorKind::ZeroSize,
            Self::TooLarge { .. } => FrameErrorKind::TooLarge,
            Self::DataTooLarge { .. } => FrameErrorKind::DataTooLarge,
            Self::OddSize { .. } => FrameErrorKind::OddSize,
            Self::StepTooSmall { .. } => FrameErrorKind::StepTooSmall,
            Self::DataTooShort { .. } => FrameErrorKind::DataTooShort,
            Self::BadMagic { .. } => FrameErrorKind::BadMagic,
            Self::BadHeader { .. } => FrameErrorKind::BadHeader,
            Self::Decode { .. } => FrameErrorKind::Decode,
        }
    }
}
