//! An owned, validated frame: what the cache stores and converts when an ask uses it.

use image::RgbImage;

use crate::convert::{decode_to_rgb8, raw_to_rgb8};
use crate::encoding::{Encoding, PixelFormat};
use crate::error::FrameError;
use crate::validate::{CompressedMsg, ImageMsg, Layout, Limits, RawLayout};

/// A frame that passed arrival validation, holding its payload.
///
/// The only way to build one is through validation, so [`Frame::to_rgb8`] never reads out of
/// bounds; only a jpeg/png body can still fail (at decode time, or at once through
/// [`Frame::decoded`]).
#[derive(Debug, Clone)]
pub struct Frame {
    layout: Layout,
    data: Vec<u8>,
    limits: Limits,
}

impl Frame {
    /// Validates a `sensor_msgs/Image` and takes its payload (moved when `D` is `Vec<u8>`,
    /// copied only after validation succeeds when `D` is `&[u8]`).
    pub fn from_image<D>(msg: ImageMsg<'_, D>, limits: &Limits) -> Result<Self, FrameError>
    where
        D: AsRef<[u8]> + Into<Vec<u8>>,
    {
        let layout = msg.validate(limits)?;
        Ok(Self {
            layout,
            data: msg.data.into(),
            limits: *limits,
        })
    }

    /// Validates a `sensor_msgs/CompressedImage` and takes its payload.
    pub fn from_compressed<D>(
        msg: CompressedMsg<'_, D>,
        limits: &Limits,
    ) -> Result<Self, FrameError>
    where
        D: AsRef<[u8]> + Into<Vec<u8>>,
    {
        let layout = Layout::Compressed(msg.validate(limits)?);
        Ok(Self {
            layout,
            data: msg.data.into(),
            limits: *limits,
        })
    }

    /// What validation found.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The frame's encoding.
    pub fn encoding(&self) -> Encoding {
        self.layout.encoding()
    }

    /// Width of the RGB8 image [`Frame::to_rgb8`] returns.
    pub fn width(&self) -> u32 {
        self.layout.width()
    }

    /// Height of the RGB8 image [`Frame::to_rgb8`] returns.
    pub fn height(&self) -> u32 {
        self.layout.height()
    }

    /// The payload as received.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The same frame with a jpeg/png body decoded to tight rgb8 now; a raw frame is returned
    /// as it is.
    ///
    /// Arrival validation reads only a jpeg/png header, so a body that does not decode would
    /// otherwise be found when an ask uses the frame — after it had replaced the camera's
    /// last good one in the cache. The node decodes compressed camera frames with this on
    /// arrival (cost per frame in BENCHMARKS.md).
    pub fn decoded(self) -> Result<Self, FrameError> {
        let Layout::Compressed(c) = self.layout else {
            return Ok(self);
        };
        let rgb = decode_to_rgb8(c.codec, &self.data, &self.limits)?;
        let (width, height) = rgb.dimensions();
        // The decoder's limits cap the width at `max_width`; a width whose row does not fit
        // a u32 step cannot come out of it, and is refused rather than wrapped if it did.
        let step = width.checked_mul(3).ok_or(FrameError::TooLarge {
            width,
            height,
            max_width: self.limits.max_width,
            max_height: self.limits.max_height,
        })?;
        Ok(Self {
            layout: Layout::Raw(RawLayout {
                format: PixelFormat::Rgb8,
                width,
                height,
                step,
                plane_rows: height,
                big_endian: false,
            }),
            data: rgb.into_raw(),
            limits: self.limits,
        })
    }

    /// Converts to RGB8, consuming the frame: tight rgb8 (a request image, a decoded
    /// jpeg/png) hands its payload over without a copy.
    pub fn into_rgb8(self) -> Result<RgbImage, FrameError> {
        if let Layout::Raw(r) = &self.layout {
            let tight = u64::from(r.width) * 3 == u64::from(r.step)
                && self.data.len() as u64 == u64::from(r.step) * u64::from(r.height);
            if r.format == PixelFormat::Rgb8 && tight {
                return Ok(RgbImage::from_raw(r.width, r.height, self.data)
                    .expect("tight rgb8 holds exactly width*height*3 bytes"));
            }
        }
        self.to_rgb8()
    }

    /// Converts to RGB8 (done only when an ask uses the frame).
    pub fn to_rgb8(&self) -> Result<RgbImage, FrameError> {
        let _span = tracing::trace_span!(
            "to_rgb8",
            encoding = %self.encoding(),
            width = self.width(),
            height = self.height()
        )
        .entered();
        convert(&self.layout, &self.data, &self.limits)
    }
}

fn convert(layout: &Layout, data: &[u8], limits: &Limits) -> Result<RgbImage, FrameError> {
    match layout {
        Layout::Raw(raw) => Ok(raw_to_rgb8(raw, data)),
        Layout::Compressed(c) => decode_to_rgb8(c.codec, data, limits),
    }
}

impl<D: AsRef<[u8]>> ImageMsg<'_, D> {
    /// Validates, then converts to RGB8 without taking the payload.
    pub fn to_rgb8(&self, limits: &Limits) -> Result<RgbImage, FrameError> {
        let layout = self.validate(limits)?;
        convert(&layout, self.data.as_ref(), limits)
    }
}

impl<D: AsRef<[u8]>> CompressedMsg<'_, D> {
    /// Validates, then decodes to RGB8 without taking the payload.
    pub fn to_rgb8(&self, limits: &Limits) -> Result<RgbImage, FrameError> {
        let layout = Layout::Compressed(self.validate(limits)?);
        convert(&layout, self.data.as_ref(), limits)
    }
}
