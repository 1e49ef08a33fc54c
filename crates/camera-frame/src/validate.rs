//! Cheap arrival checks: every header field against the payload, no pixel is touched.

use std::fmt;
use std::io::Cursor;

use image::ImageDecoder;

use crate::encoding::{parse_compressed_format, Codec, CompressedFormat, Encoding, PixelFormat};
use crate::error::FrameError;

/// How far an NV12 buffer's plane height may exceed the reported height (covers 16-, 32- and
/// 64-row alignment, e.g. 1080 → 1088).
pub const MAX_NV12_ROW_PADDING: u32 = 64;

/// Size caps applied on arrival and to jpeg/png decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted width in pixels.
    pub max_width: u32,
    /// Largest accepted height in pixels.
    pub max_height: u32,
    /// Largest accepted payload (`data.len()`) in bytes.
    pub max_data_bytes: usize,
}

impl Default for Limits {
    /// 8192×8192 pixels and 64 MiB of payload (a 3840×2160 bgra8 frame is 33 MB).
    fn default() -> Self {
        Self {
            max_width: 8192,
            max_height: 8192,
            max_data_bytes: 64 << 20,
        }
    }
}

impl Limits {
    /// The largest RGB8 buffer a decode under these limits may produce, used as the decoder's
    /// allocation cap so a small jpeg cannot claim gigabytes.
    pub fn max_decoded_bytes(&self) -> u64 {
        // Four channels: the decoder may hold RGBA before we drop alpha.
        u64::from(self.max_width) * u64::from(self.max_height) * 4
    }

    fn check_data_len(&self, len: usize) -> Result<(), FrameError> {
        if len > self.max_data_bytes {
            return Err(FrameError::DataTooLarge {
                len,
                max: self.max_data_bytes,
            });
        }
        Ok(())
    }

    fn check_dims(&self, width: u32, height: u32) -> Result<(), FrameError> {
        if width == 0 || height == 0 {
            return Err(FrameError::ZeroSize { width, height });
        }
        if width > self.max_width || height > self.max_height {
            return Err(FrameError::TooLarge {
                width,
                height,
                max_width: self.max_width,
                max_height: self.max_height,
            });
        }
        Ok(())
    }
}

/// A borrowed view of `sensor_msgs/Image` (the node fills it from the r2r message).
///
/// `D` is the payload: `&[u8]` to validate or convert in place, `Vec<u8>` to hand the bytes
/// to [`crate::Frame::from_image`] without a copy.
#[derive(Clone)]
pub struct ImageMsg<'a, D = &'a [u8]> {
    pub encoding: &'a str,
    pub width: u32,
    pub height: u32,
    /// Bytes per row (of the Y plane for NV12).
    pub step: u32,
    pub is_bigendian: bool,
    pub data: D,
}

impl<D: AsRef<[u8]>> fmt::Debug for ImageMsg<'_, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImageMsg")
            .field("encoding", &self.encoding)
            .field("width", &self.width)
            .field("height", &self.height)
            .field("step", &self.step)
            .field("is_bigendian", &self.is_bigendian)
            .field("data_len", &self.data.as_ref().len())
            .finish()
    }
}

/// A borrowed view of `sensor_msgs/CompressedImage`.
#[derive(Clone)]
pub struct CompressedMsg<'a, D = &'a [u8]> {
    pub format: &'a str,
    pub data: D,
}

impl<D: AsRef<[u8]>> fmt::Debug for CompressedMsg<'_, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompressedMsg")
            .field("format", &self.format)
            .field("data_len", &self.data.as_ref().len())
            .finish()
    }
}

/// A validated uncompressed frame: every row read by the conversion lies inside the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawLayout {
    pub format: PixelFormat,
    pub width: u32,
    pub height: u32,
    pub step: u32,
    /// Rows in the (Y) plane: `height`, or for NV12 the padded plane height (1088 for a
    /// 1080-row frame in a 1088-row buffer); the UV plane starts at `step * plane_rows`.
    pub plane_rows: u32,
    pub big_endian: bool,
}

/// A jpeg/png payload whose signature and header were read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressedLayout {
    pub codec: Codec,
    /// From the codec header (authoritative over any `Image.width`/`height`).
    pub width: u32,
    pub height: u32,
    /// Bytes per pixel the decoder holds, from the header: its output's (colour type and
    /// sample depth, 8 for 16-bit RGBA), plus two per component for a progressive jpeg's
    /// coefficients.
    pub decode_bytes_per_pixel: u32,
}

/// What validation found a frame to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Raw(RawLayout),
    Compressed(CompressedLayout),
}

impl Layout {
    /// Width in pixels of the RGB8 image the frame converts to.
    pub fn width(&self) -> u32 {
        match self {
            Self::Raw(r) => r.width,
            Self::Compressed(c) => c.width,
        }
    }

    /// Height in pixels of the RGB8 image the frame converts to.
    pub fn height(&self) -> u32 {
        match self {
            Self::Raw(r) => r.height,
            Self::Compressed(c) => c.height,
        }
    }

    /// Width × height, as the header gives them.
    pub fn pixels(&self) -> u64 {
        u64::from(self.width()) * u64::from(self.height())
    }

    /// The most memory converting the frame to RGB8 takes at once, known from the header
    /// before any pixel is decoded: a raw frame's RGB8 output (`w·h·3`); a jpeg/png body's
    /// decoded buffer (`w·h·bytes per pixel`, at least the RGB8 it is narrowed to in place).
    pub fn decoded_bytes(&self) -> u64 {
        let per_pixel = match self {
            Self::Raw(_) => 3,
            Self::Compressed(c) => c.decode_bytes_per_pixel.max(3),
        };
        // Saturating: a header cannot make the charge wrap to a small one.
        self.pixels().saturating_mul(u64::from(per_pixel))
    }

    /// The frame's encoding.
    pub fn encoding(&self) -> Encoding {
        match self {
            Self::Raw(r) => Encoding::Raw(r.format),
            Self::Compressed(c) => Encoding::Compressed(c.codec),
        }
    }
}

impl<D: AsRef<[u8]>> ImageMsg<'_, D> {
    /// Checks the header against the payload without converting anything.
    ///
    /// In order: encoding known; payload within `max_data_bytes`; for jpeg/png carried in an
    /// `Image`, signature and header (the header's size is used, `step` is ignored); otherwise
    /// width and height nonzero and within the limits; even width for YUV 4:2:2, even width and
    /// height for NV12; `step >= width * bytes_per_pixel`; `data.len() >= step * height`.
    ///
    /// NV12 plane height: the Y plane has `plane_rows` rows of `step` bytes and the UV plane
    /// follows at `step * plane_rows`. `plane_rows` is the reported height, except when the
    /// payload is exactly `step * R * 3 / 2` bytes for an even `R` with
    /// `height < R <= height + MAX_NV12_ROW_PADDING`: then the buffer was allocated for `R`
    /// aligned rows (an RDK camera reporting 1080 rows in a 1088-row buffer) and
    /// `plane_rows = R`. A camera that reports the padded height itself (1088) yields an image
    /// of that height; its padding rows are part of the picture. Otherwise the payload must
    /// hold at least `step * height * 3 / 2` bytes and bytes past that are ignored.
    pub fn validate(&self, limits: &Limits) -> Result<Layout, FrameError> {
        let data = self.data.as_ref();
        let encoding =
            Encoding::parse(self.encoding).ok_or_else(|| FrameError::UnknownEncoding {
                encoding: self.encoding.to_owned(),
            })?;
        limits.check_data_len(data.len())?;
        let format = match encoding {
            Encoding::Compressed(codec) => {
                return read_compressed_header(codec, data, limits).map(Layout::Compressed)
            }
            Encoding::Raw(format) => format,
        };
        let (width, height, step) = (self.width, self.height, self.step);
        limits.check_dims(width, height)?;
        let name = format.as_str();
        match format {
            PixelFormat::Uyvy | PixelFormat::Yuyv if width % 2 != 0 => {
                return Err(odd(name, "width", width));
            }
            PixelFormat::Nv12 if width % 2 != 0 => return Err(odd(name, "width", width)),
            PixelFormat::Nv12 if height % 2 != 0 => return Err(odd(name, "height", height)),
            _ => {}
        }
        let min_step = u64::from(width) * u64::from(format.bytes_per_pixel());
        if u64::from(step) < min_step {
            return Err(FrameError::StepTooSmall {
                encoding: name,
                step,
                min_step,
                width,
            });
        }
        let len = data.len() as u64;
        let plane_rows = if format == PixelFormat::Nv12 {
            nv12_plane_rows(step, height, len).ok_or(FrameError::DataTooShort {
                encoding: name,
                len: data.len(),
                needed: u64::from(step) * u64::from(height) * 3 / 2,
            })?
        } else {
            let needed = u64::from(step) * u64::from(height);
            if len < needed {
                return Err(FrameError::DataTooShort {
                    encoding: name,
                    len: data.len(),
                    needed,
                });
            }
            height
        };
        Ok(Layout::Raw(RawLayout {
            format,
            width,
            height,
            step,
            plane_rows,
            big_endian: self.is_bigendian,
        }))
    }
}

/// The NV12 plane height for a payload of `len` bytes (see [`ImageMsg::validate`]), or
/// `None` when the payload cannot hold `height` rows of both planes.
fn nv12_plane_rows(step: u32, height: u32, len: u64) -> Option<u32> {
    let step = u64::from(step);
    let three_half_rows = 3 * step; // bytes in two rows of Y plus one row of UV
    if three_half_rows > 0 && (2 * len).is_multiple_of(three_half_rows) {
        let rows = 2 * len / three_half_rows;
        let h = u64::from(height);
        if rows.is_multiple_of(2) && rows > h && rows <= h + u64::from(MAX_NV12_ROW_PADDING) {
            return u32::try_from(rows).ok();
        }
    }
    (len >= step * u64::from(height) * 3 / 2).then_some(height)
}

fn odd(encoding: &'static str, dimension: &'static str, value: u32) -> FrameError {
    FrameError::OddSize {
        encoding,
        dimension,
        value,
    }
}

impl<D: AsRef<[u8]>> CompressedMsg<'_, D> {
    /// Checks the format string, payload size, signature and header (no pixel decoding).
    ///
    /// The format string must name jpeg or png (see [`parse_compressed_format`]) or be empty
    /// (then the signature decides); the payload must start with that codec's signature.
    pub fn validate(&self, limits: &Limits) -> Result<CompressedLayout, FrameError> {
        let data = self.data.as_ref();
        let format =
            parse_compressed_format(self.format).map_err(|reason| FrameError::UnknownFormat {
                format: self.format.to_owned(),
                reason,
            })?;
        limits.check_data_len(data.len())?;
        let codec = match format {
            CompressedFormat::Named(codec) => codec,
            CompressedFormat::Sniff => Codec::sniff(data).ok_or(FrameError::UnknownFormat {
                format: self.format.to_owned(),
                reason: "empty format and no jpeg/png signature",
            })?,
        };
        read_compressed_header(codec, data, limits)
    }
}

pub(crate) fn image_format(codec: Codec) -> image::ImageFormat {
    match codec {
        Codec::Jpeg => image::ImageFormat::Jpeg,
        Codec::Png => image::ImageFormat::Png,
    }
}

fn read_compressed_header(
    codec: Codec,
    data: &[u8],
    limits: &Limits,
) -> Result<CompressedLayout, FrameError> {
    if !data.starts_with(codec.magic()) {
        return Err(FrameError::BadMagic { codec });
    }
    // The decoder reads the header only (a png's IHDR, a jpeg's segments up to the scan):
    // no pixel is inflated before the caps have seen the size.
    let decoder = image::ImageReader::with_format(Cursor::new(data), image_format(codec))
        .into_decoder()
        .map_err(|e| FrameError::BadHeader {
            codec,
            reason: e.to_string(),
        })?;
    let (width, height) = decoder.dimensions();
    limits.check_dims(width, height)?;
    let coefficients = match codec {
        Codec::Jpeg => crate::mjpeg::progressive_components(data).map_or(0, |n| 2 * u32::from(n)),
        Codec::Png => 0,
    };
    Ok(CompressedLayout {
        codec,
        width,
        height,
        decode_bytes_per_pixel: u32::from(decoder.color_type().bytes_per_pixel()) + coefficients,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FrameErrorKind;

    fn msg<'a>(enc: &'a str, w: u32, h: u32, step: u32, data: &'a [u8]) -> ImageMsg<'a> {
        ImageMsg {
            encoding: enc,
            width: w,
            height: h,
            step,
            is_bigendian: false,
            data,
        }
    }

    fn kind(r: Result<Layout, FrameError>) -> FrameErrorKind {
        r.expect_err("should be rejected").kind()
    }

    #[test]
    fn nv12_plane_rows_rule() {
        let l = Limits::default();
        // 1080p reported as 1080 in a tight buffer.
        let tight = vec![0u8; 1920 * 1080 * 3 / 2];
        let Layout::Raw(r) = msg("nv12", 1920, 1080, 1920, &tight).validate(&l).unwrap() else {
            panic!("raw");
        };
        assert_eq!(r.plane_rows, 1080);
        // Reported 1080 in a buffer of 1088 aligned rows, row step wider than the width.
        let padded = vec![0u8; 2048 * 1088 * 3 / 2];
        let Layout::Raw(r) = msg("nv12", 1920, 1080, 2048, &padded).validate(&l).unwrap() else {
            panic!("raw");
        };
        assert_eq!((r.plane_rows, r.height), (1088, 1080));
        // Reported 1088 (padded height) in the same buffer: an image 1088 rows tall.
        let Layout::Raw(r) = msg("nv12", 1920, 1088, 2048, &padded).validate(&l).unwrap() else {
            panic!("raw");
        };
        assert_eq!((r.plane_rows, r.height), (1088, 1088));
        // Trailing bytes that match no padded height are ignored.
        let extra = vec![0u8; 1920 * 1080 * 3 / 2 + 100];
        let Layout::Raw(r) = msg("nv12", 1920, 1080, 1920, &extra).validate(&l).unwrap() else {
            panic!("raw");
        };
        assert_eq!(r.plane_rows, 1080);
        // A buffer beyond the padding window is treated as tight with trailing bytes.
        let far = vec![0u8; 1920 * (1080 + 66) * 3 / 2];
        let Layout::Raw(r) = msg("nv12", 1920, 1080, 1920, &far).validate(&l).unwrap() else {
            panic!("raw");
        };
        assert_eq!(r.plane_rows, 1080);
        // One byte short of the UV plane.
        let short = vec![0u8; 1920 * 1080 * 3 / 2 - 1];
        assert_eq!(
            kind(msg("nv12", 1920, 1080, 1920, &short).validate(&l)),
            FrameErrorKind::DataTooShort
        );
        // Odd sizes.
        assert_eq!(
            kind(msg("nv12", 3, 2, 4, &[0; 12]).validate(&l)),
            FrameErrorKind::OddSize
        );
        assert_eq!(
            kind(msg("nv12", 2, 3, 2, &[0; 12]).validate(&l)),
            FrameErrorKind::OddSize
        );
    }

    #[test]
    fn packed_rules() {
        let l = Limits::default();
        assert_eq!(
            kind(msg("rgb8", 4, 2, 11, &[0; 24]).validate(&l)),
            FrameErrorKind::StepTooSmall
        );
        assert_eq!(
            kind(msg("rgb8", 4, 2, 12, &[0; 23]).validate(&l)),
            FrameErrorKind::DataTooShort
        );
        assert!(msg("rgb8", 4, 2, 12, &[0; 24]).validate(&l).is_ok());
        assert_eq!(
            kind(msg("yuv422", 3, 2, 6, &[0; 12]).validate(&l)),
            FrameErrorKind::OddSize
        );
        assert_eq!(
            kind(msg("mono16", 4, 2, 7, &[0; 16]).validate(&l)),
            FrameErrorKind::StepTooSmall
        );
        assert_eq!(
            kind(msg("rgb8", 0, 2, 0, &[]).validate(&l)),
            FrameErrorKind::ZeroSize
        );
        assert_eq!(
            kind(msg("rgb8", 8193, 1, 24579, &[0; 24579]).validate(&l)),
            FrameErrorKind::TooLarge
        );
        assert_eq!(
            kind(msg("rgb16", 1, 1, 6, &[0; 6]).validate(&l)),
            FrameErrorKind::UnknownEncoding
        );
        let small = Limits {
            max_data_bytes: 10,
            ..Limits::default()
        };
        assert_eq!(
            kind(msg("rgb8", 4, 1, 12, &[0; 12]).validate(&small)),
            FrameErrorKind::DataTooLarge
        );
        // Extreme header values must not overflow.
        assert_eq!(
            kind(msg("bgra8", 8192, 8192, u32::MAX, &[0; 64]).validate(&l)),
            FrameErrorKind::DataTooShort
        );
    }

    #[test]
    fn compressed_signature_checked() {
        let l = Limits::default();
        assert_eq!(
            kind(msg("jpeg", 4, 4, 0, b"\x89PNG\r\n\x1a\n").validate(&l)),
            FrameErrorKind::BadMagic
        );
        assert_eq!(
            kind(msg("png", 4, 4, 0, b"\x89PNG\r\n\x1a\n").validate(&l)),
            FrameErrorKind::BadHeader
        );
        let c = CompressedMsg {
            format: "",
            data: &b"GIF89a"[..],
        };
        assert_eq!(
            c.validate(&l).unwrap_err().kind(),
            FrameErrorKind::UnknownFormat
        );
    }
}
