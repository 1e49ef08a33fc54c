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
    CameraCache, Codec, CompressedMsg, Frame, FrameError, FrameHeader, ImageMsg, Limits, Stamp,
};
use futures::{FutureExt, Stream, StreamExt};
use r2r::sensor_msgs::msg::{CompressedImage, Image};
use r2r::QosProfile;

use crate::process::panics::contained;
use crate::process::test_hooks::{self, Site};
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
    while let Some(mut msg) = msgs.next().await {
        // Only the newest message can become the latest frame; the ones queued behind a
        // slow decode would only delay it.
        while let Some(Some(newer)) = msgs.next().now_or_never() {
            msg = newer;
        }
        let (st, outcome) = match msg {
            CameraMsg::Raw(m) => (frame_header(&m.header), checked(CameraMsg::Raw(m)).await),
            CameraMsg::Compressed(m) => (
                frame_header(&m.header),
                checked(CameraMsg::Compressed(m)).await,
            ),
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

/// Validates a message (a jpeg/png header is parsed) and decodes a jpeg/png frame, off the
/// async workers (a 1080p jpeg takes milliseconds). Both run contained on the blocking
/// thread: a header reader or decoder that panics on a hostile body rejects the frame,
/// counted like any bad frame, and the node goes on.
async fn checked(msg: CameraMsg) -> Result<Frame, FrameError> {
    let limits = Limits::default();
    let what = match &msg {
        CameraMsg::Raw(m) => What::Raw(m.encoding.clone()),
        // The codec a panic is reported under: the payload's signature, else jpeg (the
        // reason names the panic either way).
        CameraMsg::Compressed(m) => What::Compressed(Codec::sniff(&m.data).unwrap_or(Codec::Jpeg)),
    };
    let done = tokio::task::spawn_blocking(move || {
        contained(|| {
            test_hooks::point(Site::Camera);
            let frame = match msg {
                CameraMsg::Raw(m) => frame_from_image(m, &limits),
                CameraMsg::Compressed(m) => frame_from_compressed(m, &limits),
            }?;
            frame.decoded()
        })
    })
    .await;
    let stopped = |reason: String| match &what {
        What::Raw(encoding) => FrameError::UnknownEncoding {
            encoding: format!("{encoding} ({reason})"),
        },
        What::Compressed(codec) => FrameError::BadHeader {
            codec: *codec,
            reason,
        },
    };
    match done {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => Err(stopped(format!("the frame check panicked: {panic}"))),
        Err(e) => Err(stopped(format!("the frame check stopped: {e}"))),
    }
}

/// What a message was, for the error of a check that did not finish.
enum What {
    Raw(String),
    Compressed(Codec),
}
