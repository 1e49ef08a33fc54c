//! Detections as `vision_msgs`, and a `vlm/detect` goal's feedback: the detections found so
//! far, sent each time the answer's next JSON object closes (the Tokens of the answer are
//! scanned as they are published). Each object's score is read from the tokens drawn so far
//! ([`LiveScores`]) by the rule the result uses ([`grounding::label_score`]), so an object
//! has the same score in the feedback and in the result (0 only when the drawn tokens could
//! not be read: then the result alone has it).

use std::sync::Mutex;

use r2r::std_msgs::msg::Header;
use r2r::unique_identifier_msgs::msg::UUID;
use r2r::vision_msgs::msg::{
    BoundingBox2D, Detection2D, Detection2DArray, ObjectHypothesis, ObjectHypothesisWithPose,
    Point2D, Pose2D,
};
use r2r::Publisher;
use vlm::grounding::{self, Detection, Kind, LiveScores, ObjectScanner};

use crate::msgs::action::Detect as DetectAction;
use crate::msgs::msg::Token;

/// `detections` as `vision_msgs`, every header `header` (the source frame's).
pub(crate) fn to_array(header: &Header, detections: &[Detection]) -> Detection2DArray {
    let one = |d: &Detection| Detection2D {
        header: header.clone(),
        results: vec![ObjectHypothesisWithPose {
            hypothesis: ObjectHypothesis {
                class_id: d.label.clone(),
                score: f64::from(d.score),
            },
            ..Default::default()
        }],
        bbox: BoundingBox2D {
            center: Pose2D {
                position: Point2D {
                    x: d.center[0],
                    y: d.center[1],
                },
                theta: 0.0,
            },
            size_x: d.size[0],
            size_y: d.size[1],
        },
        id: d.index.to_string(),
    };
    Detection2DArray {
        header: header.clone(),
        detections: detections.iter().map(one).collect(),
    }
}

/// One goal's feedback.
pub(crate) struct DetectFeedback {
    goal_id: UUID,
    state: Mutex<State>,
}

struct State {
    /// In the lock: a publisher may be sent between threads but not shared.
    publisher: Publisher<DetectAction::FeedbackMessage>,
    scanner: ObjectScanner,
    /// The frame's header and size, once the worker has chosen the frame.
    frame: Option<(Header, usize, usize)>,
    found: Vec<Detection>,
    /// The tokens drawn so far, once the worker has set the turn up to share them.
    scores: Option<LiveScores>,
}

impl DetectFeedback {
    pub(crate) fn new(
        publisher: Publisher<DetectAction::FeedbackMessage>,
        goal_id: UUID,
        kind: Kind,
    ) -> Self {
        Self {
            goal_id,
            state: Mutex::new(State {
                publisher,
                scanner: ObjectScanner::new(kind),
                frame: None,
                found: Vec::new(),
                scores: None,
            }),
        }
    }

    /// The frame the answer is about (chosen on the worker, after a pre-fill may have
    /// replaced the planned one).
    pub(crate) fn bind(&self, header: Header, width: u32, height: u32) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.frame = Some((header, width as usize, height as usize));
    }

    /// Where the scores of the objects come from (set on the worker before the answer).
    pub(crate) fn score_with(&self, scores: LiveScores) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.scores = Some(scores);
    }

    /// Scans one published Token; sends the detections so far when an object closed.
    pub(crate) fn on_token(&self, token: &Token) {
        if token.reasoning || token.text.is_empty() {
            return;
        }
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let closed = s.scanner.push(&token.text);
        let Some((header, w, h)) = s.frame.clone() else {
            return;
        };
        if closed.is_empty() {
            return;
        }
        let scores = s.scores.as_ref().and_then(|l| l.scores(s.scanner.text()));
        let before = s.found.len();
        let found: Vec<Detection> = closed
            .iter()
            .filter_map(|r| {
                grounding::to_pixels(r, w, h, grounding::label_score(r, scores.as_ref()))
            })
            .collect();
        s.found.extend(found);
        if s.found.len() == before {
            return;
        }
        let msg = DetectAction::FeedbackMessage {
            goal_id: self.goal_id.clone(),
            feedback: DetectAction::Feedback {
                detections: to_array(&header, &s.found),
            },
        };
        if let Err(e) = s.publisher.publish(&msg) {
            tracing::warn!(request_id = %token.request_id, error = %e, "could not publish detect feedback");
        }
    }
}
