//! An admitted request as the worker takes it: the chat turn to ask, where its images come
//! from, its conversation and the channel its response goes back on.

use std::sync::atomic::Ordering;
use std::time::Instant;

use camera_frame::{CachedFrame, Frame, FrameHeader, Stamp};
use vlm::assistant::{ImageKey, Turn};
use vlm::engine::ImageInput;
use vlm::vision::RgbImage;

use crate::interface::ErrorCode;
use crate::msgs::srv::Ask;
use crate::serve::failure::Failure;
use crate::serve::registry::Admission;
use crate::serve::token_sink::GoalFeedback;

/// Where the images of an ask come from.
pub enum Images {
    None,
    /// Frames sent in the request (validated on arrival), and the first one's header, which
    /// the answer reports.
    Request {
        frames: Vec<Frame>,
        first: FrameHeader,
    },
    /// The latest frame of a camera topic.
    Camera(CachedFrame),
}

/// The image an answer reports (`image_source`, `image_stamp`, the header's `frame_id`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ImageOrigin {
    /// A camera topic, `request`, or empty for a text-only ask.
    pub source: String,
    /// The used image's own header stamp (the first request image's); zero when text-only.
    pub stamp: Stamp,
    /// The used image's own TF frame, so TF can tie the answer to the camera; empty when
    /// text-only.
    pub frame_id: String,
    /// The used image's size in pixels as it arrived (the first one's when there are
    /// several), before the vision tower scales it: the frame a client converts the model's
    /// relative coordinates into. 0 when text-only.
    pub width: u32,
    pub height: u32,
    /// The newest camera frame's stamp found to show the same scene (`scene_checked_stamp`):
    /// the used frame's own for a camera frame unless a scene check says later; zero when no
    /// camera frame was used.
    pub scene_checked: Stamp,
}

impl Images {
    pub(crate) fn origin(&self) -> ImageOrigin {
        match self {
            Self::None => ImageOrigin::default(),
            Self::Request { frames, first } => ImageOrigin {
                source: "request".to_owned(),
                stamp: first.stamp,
                frame_id: first.frame_id.to_string(),
                // Raw images come first in the model input, as `first` does.
                width: frames.first().map_or(0, Frame::width),
                height: frames.first().map_or(0, Frame::height),
                scene_checked: Stamp::default(),
            },
            Self::Camera(c) => ImageOrigin {
                source: c.topic.to_string(),
                stamp: c.stamp,
                frame_id: c.frame_id.to_string(),
                width: c.frame.width(),
                height: c.frame.height(),
                scene_checked: c.stamp,
            },
        }
    }

    /// Converts the frames to RGB for the model, each with its identity in a conversation
    /// ([`Turn::image_keys`]: a frame the session already holds is not added again). This is
    /// the costly part of an image, so it runs on the worker when the job's turn comes, not
    /// when the request arrives. Request frames are taken: their payload moves on (an rgb8
    /// one without a copy) and their key is the content hash of the pixels; a camera frame
    /// stays in the cache for the next ask, so it is converted from a shared reference, and
    /// its key is the cached message's (`camera_key`).
    ///
    /// With `turn`, its cancel flag and deadline are checked before each request image: a
    /// request stopped meanwhile ends `cancelled` or `timeout` without decoding the rest (each
    /// image may take a large share of a second and of the decode budget).
    pub fn take_inputs(
        &mut self,
        turn: Option<&Turn>,
    ) -> Result<(Vec<ImageInput>, Vec<Option<ImageKey>>), Failure> {
        match self {
            Self::None => Ok((Vec::new(), Vec::new())),
            Self::Request { frames, .. } => {
                let frames = std::mem::take(frames);
                let total = frames.len();
                let (mut inputs, mut keys) = (Vec::with_capacity(total), Vec::with_capacity(total));
                for (i, f) in frames.into_iter().enumerate() {
                    if let Some(stop) = turn.and_then(|t| stopped_decoding(t, i, total)) {
                        return Err(stop);
                    }
                    let input =
                        rgb_input(f.into_rgb8().map_err(|e| e.to_string())).map_err(|e| {
                            Failure::new(
                                ErrorCode::InvalidRequest,
                                format!("request image {i}: {e}"),
                            )
                        })?;
                    keys.push(match &input {
                        ImageInput::Rgb(img) => Some(ImageKey::of_rgb(img)),
                        ImageInput::Pixels(_) => None,
                    });
                    inputs.push(input);
                }
                Ok((inputs, keys))
            }
            Self::Camera(c) => {
                let input =
                    rgb_input(c.frame.to_rgb8().map_err(|e| e.to_string())).map_err(|e| {
                        Failure::new(
                            ErrorCode::NoImage,
                            format!("the latest frame on {} cannot be decoded: {e}", c.topic),
                        )
                    })?;
                Ok((vec![input], vec![Some(camera_key(c))]))
            }
        }
    }

    /// The key [`Images::take_inputs`] gives a camera frame, without converting it.
    pub(crate) fn camera_key(&self) -> Option<ImageKey> {
        match self {
            Self::Camera(c) => Some(camera_key(c)),
            _ => None,
        }
    }
}

/// Why a request's images stop being decoded before image `done` of `total`: its cancel flag
/// or its deadline.
fn stopped_decoding(turn: &Turn, done: usize, total: usize) -> Option<Failure> {
    let (code, what) = if turn
        .cancel
        .as_ref()
        .is_some_and(|c| c.load(Ordering::Acquire))
    {
        (ErrorCode::Cancelled, "cancelled")
    } else if turn.deadline.is_some_and(|d| Instant::now() >= d) {
        (ErrorCode::Timeout, "timeout")
    } else {
        return None;
    };
    Some(Failure::new(
        code,
        format!("{what} while decoding the request's images ({done} of {total} decoded)"),
    ))
}

/// A camera frame's identity: its topic and header stamp, and its arrival count on the topic,
/// so a driver that stamps every frame alike (zero stamps) still gives each frame its own key.
/// Two asks that select the same cached message get the same key.
fn camera_key(c: &CachedFrame) -> ImageKey {
    ImageKey::new(format!(
        "camera:{}@{}.{:09}#{}",
        c.topic, c.stamp.sec, c.stamp.nanosec, c.seq
    ))
}

fn rgb_input(img: Result<camera_frame::image::RgbImage, String>) -> Result<ImageInput, String> {
    let img = img?;
    let (w, h) = (img.width() as usize, img.height() as usize);
    RgbImage::new(w, h, img.into_raw())
        .map(ImageInput::Rgb)
        .map_err(|e| e.to_string())
}

/// A validated request: the turn for the assistant, whose images stay empty until
/// [`Images::take_inputs`] fills them on the worker, and what only the node knows about it.
pub struct JobPlan {
    pub turn: Turn,
    pub images: Images,
    /// The conversation to continue and park the answer in; `None` = a fresh one, dropped.
    pub session_id: Option<String>,
    /// The ask's `max_image_age_s` (`None` = no limit): a primed frame must be within it.
    pub max_image_age: Option<std::time::Duration>,
    /// Set when a primed frame was chosen after a scene check: the stamp of the ask's newest
    /// frame, which showed the same scene (`scene_checked_stamp`).
    pub scene_checked: Option<Stamp>,
    /// A detect request's link to the worker (`crate::serve::detections`); `None` for an ask.
    pub(crate) detect: Option<crate::serve::detect_tap::DetectTap>,
    /// A watch goal's evaluation: it publishes no Token and no Answer (its answer goes to the
    /// goal's feedback), and the node's last-answer timings do not count it.
    pub(crate) quiet: bool,
}

/// An admitted request, ready for the worker. Its cancel flag, deadline and arrival time
/// are the turn's (`cancel`, `deadline`, `started`).
pub(crate) struct Job {
    pub id: String,
    pub plan: JobPlan,
    /// Its place in the registry: released before `respond` is used, and on drop if the job
    /// ends any other way.
    pub admission: Admission,
    pub respond: tokio::sync::oneshot::Sender<Ask::Response>,
    /// An action goal's feedback, which gets every Token the tokens topic gets.
    pub feedback: Option<GoalFeedback>,
}

impl Job {
    pub(crate) fn is_cancelled(&self) -> bool {
        self.plan
            .turn
            .cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Acquire))
    }

    pub(crate) fn is_past_deadline(&self, now: Instant) -> bool {
        self.plan.turn.deadline.is_some_and(|d| now >= d)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::Duration;

    use camera_frame::{ImageMsg, Limits};

    use super::*;

    fn two_frames() -> Images {
        let frame = || {
            let msg = ImageMsg {
                encoding: "rgb8",
                width: 2,
                height: 1,
                step: 6,
                is_bigendian: false,
                data: vec![1u8, 2, 3, 4, 5, 6],
            };
            Frame::from_image(msg, &Limits::default()).unwrap()
        };
        Images::Request {
            frames: vec![frame(), frame()],
            first: FrameHeader::default(),
        }
    }

    /// A request cancelled or past its deadline decodes no further image: the check comes
    /// before each one.
    #[test]
    fn cancel_and_deadline_stop_the_decoding_of_request_images() {
        let mut turn = Turn::new("?", 1);
        let (inputs, keys) = two_frames().take_inputs(Some(&turn)).unwrap();
        assert_eq!((inputs.len(), keys.len()), (2, 2));

        turn.cancel = Some(Arc::new(AtomicBool::new(true)));
        let mut images = two_frames();
        let f = images.take_inputs(Some(&turn)).unwrap_err();
        assert_eq!(f.code, ErrorCode::Cancelled, "{}", f.message);
        assert!(f.message.contains("0 of 2"), "{}", f.message);
        assert!(
            matches!(&images, Images::Request { frames, .. } if frames.is_empty()),
            "the frames are released, not kept for later"
        );

        turn.cancel = None;
        turn.deadline = Instant::now().checked_sub(Duration::from_millis(1));
        let f = two_frames().take_inputs(Some(&turn)).unwrap_err();
        assert_eq!(f.code, ErrorCode::Timeout, "{}", f.message);

        // Without a turn (a priming of a camera frame) nothing is checked.
        assert!(two_frames().take_inputs(None).is_ok());
    }
}
