//! Camera frames for the bpu_vlm node, without ROS.
//!
//! - [`ImageMsg`] / [`CompressedMsg`] mirror `sensor_msgs/Image` and
//!   `sensor_msgs/CompressedImage`; `validate` checks a frame on arrival (encoding, size caps,
//!   step, payload length, jpeg/png signature and header) without touching pixels.
//! - [`Frame`] is a validated frame that owns its payload; [`Frame::to_rgb8`] converts it only
//!   when an ask uses it (rgb8, bgr8, rgba8, bgra8, mono8, mono16, yuv422 = UYVY,
//!   yuv422_yuy2/yuyv = YUYV, nv12 with a wide step and padded plane height, jpeg, png). YUV
//!   uses BT.601 limited range, see [`yuv_to_rgb`]. [`Frame::decoded`] decodes a jpeg/png
//!   body at once, so a body that does not decode is a rejection on arrival rather than a
//!   failure of the ask that uses it.
//! - [`DecodeBudget`] caps the pixels of one image and the decoded bytes of a request's
//!   images, from their headers, before any pixel is decoded.
//! - [`CameraCache`] keeps the latest valid frame per topic and picks the frame for an ask.
//! - [`SceneSignature`] is a frame's luma thumbnail, computed on arrival, so two frames can be
//!   compared for a change of scene in microseconds.
//!
//! This crate must not depend on r2r, ROS message types or tokio: the node maps message
//! fields into these types.
//!
//! ```
//! use camera_frame::{Frame, ImageMsg, Limits};
//!
//! // 2×2 UYVY: two rows of `U Y0 V Y1`.
//! let data = vec![128, 16, 128, 235, 128, 235, 128, 16];
//! let msg = ImageMsg { encoding: "yuv422", width: 2, height: 2, step: 4, is_bigendian: false, data };
//! let frame = Frame::from_image(msg, &Limits::default())?;
//! let rgb = frame.to_rgb8()?;
//! assert_eq!(rgb.as_raw(), &[0, 0, 0, 255, 255, 255, 255, 255, 255, 0, 0, 0]);
//! # Ok::<(), camera_frame::FrameError>(())
//! ```
#![forbid(unsafe_code)]

mod budget;
mod cache;
mod convert;
mod encoding;
mod error;
mod frame;
mod mjpeg;
mod scene;
mod validate;

pub use budget::{BudgetError, DecodeBudget};
pub use cache::{
    CacheConfig, CacheConfigError, CachedFrame, CameraCache, FrameHeader, Freshness, RejectWarning,
    SelectError, Stamp, TopicStats, UnknownTopic,
};
pub use convert::yuv_to_rgb;
pub use encoding::{parse_compressed_format, Codec, CompressedFormat, Encoding, PixelFormat};
pub use error::{FrameError, FrameErrorKind};
pub use frame::Frame;
/// The `image` crate, whose `RgbImage` the conversions return (the runtime's own RGB type is
/// `vlm::vision::RgbImage`; the node converts between them in one place).
pub use image;
pub use scene::{SceneSignature, DEFAULT_SCENE_CHANGE_THRESHOLD, GRID_H, GRID_W};
pub use validate::{
    CompressedLayout, CompressedMsg, ImageMsg, Layout, Limits, RawLayout, MAX_NV12_ROW_PADDING,
};
