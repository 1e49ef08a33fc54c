//! Camera topics → the latest-frame cache: one subscription and one draining task per topic.
//! Raw frames are validated on arrival (converted only when an ask uses them); jpeg/png
//! frames are also decoded on arrival, so a body that does not decode is a rejection and
//! never replaces the camera's last good frame. A rejected frame keeps the previous one and
//! logs a rate-limited warning. Decoding costs a few ms per frame (BENCHMARKS.md,
//! "Camera frames"); when it falls behind the camera, the frames queued meanwhile are
//! skipped and only the newest is decoded.

use std::sync::Arc;
use std::time::Instant;

use camera_frame::{
    CameraCache, CompressedMsg, Encoding, Frame, FrameError, FrameHeader, ImageMsg, Limits, Stamp,
};
use futures::{FutureExt, Stream, StreamExt};
use r2r::sensor_msgs::msg::{CompressedImage, Image};
use r2r::QosProfile;

use crate::process::panics::contained;
use crate::ros::params::{CameraQos, Params};

/// The QoS of camera subscriptions.
pub(crate) fn camera_qos(q: CameraQos) -> QosProfile {
    match q {
        CameraQos::SensorData => QosProfile::sensor_data(),
        CameraQos::Reliable => QosProfile::sensor_data().reliable(),
    }
}

/// `sensor_msgs/Image` fields → the validated frame (the payload is moved, not copied).
pub(crate) fn frame_from_image(msg: Image, limits: &Limits) -> Result<Frame, FrameError> {
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
pub(crate) fn frame_from_compressed(
    msg: CompressedImage,
    limits: &Limits,
) -> Result<Frame, FrameError> {
    Frame::from_compressed(
        CompressedMsg {
            format: &msg.format,
            data: msg.data,
        },
        limits,
    )
}

/// The header parts an answer reports about its image, as the sender wrote them.
pub(crate) fn frame_header(h: &r2r::std_msgs::msg::Header) -> FrameHeader {
    FrameHeader {
        stamp: Stamp {
            sec: h.stamp.sec,
            nanosec: h.stamp.nanosec,
        },
        frame_id: Arc::from(h.frame_id.as_str()),
    }
}

/// Every configured camera topic (raw first), as the cache lists them.
pub(crate) fn topics(p: &Params) -> Vec<String> {
    p.image_topics
        .iter()
        .chain(&p.compressed_image_topics)
        .cloned()
        .collect()
}

/// One camera message as the draining task sees it.
pub(crate) enum CameraMsg {
    Raw(Image),
    Compressed(CompressedImage),
}

/// Drains one topic's subscription into the cache until the stream ends (node shut down).
pub(crate) async fn drain(
    topic: String,
    mut msgs: impl Stream<Item = CameraMsg> + Unpin,
    cache: Arc<CameraCache>,
) {
    let limits = Limits::default();
    while let Some(mut msg) = msgs.next().await {
        // Only the newest message can become the latest frame; the ones queued behind a
        // slow decode would only delay it.
        while let Some(Some(newer)) = msgs.next().now_or_never() {
            msg = newer;
        }
        let (st, outcome) = match msg {
            CameraMsg::Raw(m) => (frame_header(&m.header), frame_from_image(m, &limits)),
            CameraMsg::Compressed(m) => {
                (frame_header(&m.header), frame_from_compressed(m, &limits))
            }
        };
        let outcome = match outcome {
            Ok(frame) => decode_on_arrival(frame).await,
            Err(e) => Err(e),
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

/// Decodes a jpeg/png frame off the async workers (a 1080p jpeg takes milliseconds); a raw
/// frame passes through.
async fn decode_on_arrival(frame: Frame) -> Result<Frame, FrameError> {
    let Encoding::Compressed(codec) = frame.encoding() else {
        return Ok(frame);
    };
    // A decoder that panics on a hostile body rejects the frame; the node goes on.
    let decoded = tokio::task::spawn_blocking(move || contained(|| frame.decoded())).await;
    match decoded {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => Err(FrameError::Decode {
            codec,
            reason: format!("the decoder panicked: {panic}"),
        }),
        Err(e) => Err(FrameError::Decode {
            codec,
            reason: format!("the decoder stopped: {e}"),
        }),
    }
}
