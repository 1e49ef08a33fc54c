//! Camera topics → the latest-frame cache: one subscription and one draining task per topic.
//! Frames are validated on arrival (never converted there); a rejected frame keeps the
//! previous one and logs a rate-limited warning.

use std::sync::Arc;
use std::time::Instant;

use camera_frame::{CameraCache, CompressedMsg, Frame, FrameError, ImageMsg, Limits, Stamp};
use futures::{Stream, StreamExt};
use r2r::sensor_msgs::msg::{CompressedImage, Image};
use r2r::QosProfile;

use crate::params::{CameraQos, Params};

/// The QoS of camera subscriptions.
pub fn camera_qos(q: CameraQos) -> QosProfile {
    match q {
        CameraQos::SensorData => QosProfile::sensor_data(),
        CameraQos::Reliable => QosProfile::sensor_data().reliable(),
    }
}

/// `sensor_msgs/Image` fields → the validated frame (the payload is moved, not copied).
pub fn frame_from_image(msg: Image, limits: &Limits) -> Result<Frame, FrameError> {
    Frame::from_image(
        ImageMsg {
            encoding: &msg.encoding,
            width: msg.width,
            height: msg.height,
            step: msg.step,
            is_bigendian: msg.is_bigendian != 0,
            data: msg.data,
        },
        limits,
    )
}

/// `sensor_msgs/CompressedImage` fields → the validated frame.
pub fn frame_from_compressed(msg: CompressedImage, limits: &Limits) -> Result<Frame, FrameError> {
    Frame::from_compressed(
        CompressedMsg {
            format: &msg.format,
            data: msg.data,
        },
        limits,
    )
}

fn stamp(h: &r2r::std_msgs::msg::Header) -> Stamp {
    Stamp {
        sec: h.stamp.sec,
        nanosec: h.stamp.nanosec,
    }
}

/// Every configured camera topic (raw first), as the cache lists them.
pub fn topics(p: &Params) -> Vec<String> {
    p.image_topics
        .iter()
        .chain(&p.compressed_image_topics)
        .cloned()
        .collect()
}

/// One camera message as the draining task sees it.
pub enum CameraMsg {
    Raw(Image),
    Compressed(CompressedImage),
}

/// Drains one topic's subscription into the cache until the stream ends (node shut down).
pub async fn drain(
    topic: String,
    mut msgs: impl Stream<Item = CameraMsg> + Unpin,
    cache: Arc<CameraCache>,
) {
    let limits = Limits::default();
    while let Some(msg) = msgs.next().await {
        let (st, outcome) = match msg {
            CameraMsg::Raw(m) => (stamp(&m.header), frame_from_image(m, &limits)),
            CameraMsg::Compressed(m) => (stamp(&m.header), frame_from_compressed(m, &limits)),
        };
        match cache.record(&topic, outcome, st, Instant::now()) {
            Ok(None) => {}
            Ok(Some(w)) => {
                tracing::warn!(
                    topic = %w.topic,
                    suppressed = w.suppressed,
                    rejected_total = w.rejected_total,
                    "camera frame rejected (the previous frame is kept): {}",
                    w.error
                );
            }
            Err(e) => tracing::error!(error = %e, "camera message for an unconfigured topic"),
        }
    }
}
