//! A detect request's link to the worker (in the job's plan): what it asks for, and where
//! the worker leaves what the request reads once its response is in
//! (`crate::serve::detections` fills it).

use std::sync::{Arc, Mutex};

use vlm::grounding::{DetectSpec, TokenScores};
use vlm::vision::RgbImage;

/// A detect request's link to the worker: what it asks for, and where the worker leaves
/// what the request reads once its response is in.
pub(crate) struct DetectTap {
    pub spec: DetectSpec,
    /// Keep the frame in RGB for the annotated image (only while someone subscribes).
    pub keep_rgb: bool,
    pub out: Arc<Mutex<TapOut>>,
}

/// What the worker leaves for the request.
#[derive(Default)]
pub(crate) struct TapOut {
    /// Byte spans and probabilities of the answer's tokens; `None` before an answer.
    pub scores: Option<TokenScores>,
    /// The frame the model saw, as it arrived (before the tower's resize), in RGB.
    pub rgb: Option<RgbImage>,
}

impl DetectTap {
    pub(crate) fn new(spec: DetectSpec, keep_rgb: bool) -> Self {
        Self {
            spec,
            keep_rgb,
            out: Arc::default(),
        }
    }
}
