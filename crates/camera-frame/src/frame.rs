//! An owned, validated frame: what the cache stores and converts when an ask uses it.

use image::RgbImage;

use crate::convert::{decode_to_rgb8, raw_to_rgb8};
use crate::encoding::Encoding;
use crate::error::FrameError;
use crate::validate::{CompressedMsg, ImageMsg, Layout, Limits};

/// A frame that passed arrival validation, holding its payload.
///
/// The only way to build one is through validation, so [`Frame::to_rgb8`] never reads out of
/// bounds; only a jpeg/png body can still fail (at decode time).
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
