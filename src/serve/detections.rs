//! What the worker does for a detect request beyond an ask (`crate::request::detect`): its
//! answer's token budget is checked against the window before anything runs, so an answer
//! is never cut short by the window's end, and the parts of the reply the response cannot
//! carry — the token probabilities behind each label's score and, while `vlm/annotated` has
//! a subscriber, the frame in RGB to draw on — are handed back through
//! [`crate::serve::detect_tap::DetectTap`].

use vlm::assistant::{Assistant, Reply, Turn};
use vlm::engine::ImageInput;
use vlm::grounding::{fit_budget, LiveScores, TokenScores};
use vlm::sampler::DrawnLog;
use vlm::vision::RgbImage;

use crate::interface::ErrorCode;
use crate::serve::failure::Failure;
use crate::serve::job::{Images, JobPlan};
use crate::serve::token_sink::GoalFeedback;

/// Refuses (`context_overflow`) a detect whose full answer would not fit the window after its
/// prompt. A pre-filled frame is counted as the image it stands for: the same rows.
pub(crate) fn fit(plan: &JobPlan, assistant: &Assistant) -> Result<(), Failure> {
    let Some(tap) = &plan.detect else {
        return Ok(());
    };
    let overflow = |m: String| Failure::new(ErrorCode::ContextOverflow, m);
    let t = &plan.turn;
    // Only the row count matters: 1-pixel stand-ins take the bucket's slots, and a
    // pre-filled frame (a key without pixels) counts as the image it stands for.
    let images = t.images.len().max(t.image_keys.len());
    let pixel = RgbImage::new(1, 1, vec![0; 3]).map_err(|e| overflow(e.to_string()))?;
    let turn = Turn {
        system: t.system.clone(),
        tools: t.tools.clone(),
        thinking: t.thinking,
        images: vec![ImageInput::Rgb(pixel); images],
        ..Turn::new(t.text.clone(), 0)
    };
    let rows = assistant
        .fresh_turn_rows(&turn)
        .map_err(|e| overflow(e.to_string()))?;
    fit_budget(&tap.spec, assistant.info().context, rows)
        .map(|_| ())
        .map_err(|e| overflow(e.to_string()))
}

/// A `vlm/detect` goal's feedback scores each object as it closes: the turn shares its drawn
/// tokens with it (only a goal pays for that; a `/detect` request has no feedback).
pub(crate) fn share_scores(
    plan: &mut JobPlan,
    assistant: &Assistant,
    feedback: Option<&GoalFeedback>,
) {
    let (Some(_), Some(GoalFeedback::Detect(f))) = (&plan.detect, feedback) else {
        return;
    };
    let log = DrawnLog::new();
    plan.turn.drawn_log = Some(log.clone());
    f.score_with(LiveScores::new(
        log,
        assistant.template().tokenizer().clone(),
    ));
}

/// Leaves the reply's token scores, and the frame when wanted, for the request.
pub(crate) fn collect(plan: &JobPlan, reply: &Reply, assistant: &Assistant) {
    let Some(tap) = &plan.detect else {
        return;
    };
    let c = &reply.completion;
    let scores = TokenScores::new(
        assistant.template().tokenizer(),
        &c.tokens,
        &reply.token_probs,
        &c.text,
    );
    let rgb = if tap.keep_rgb { frame_rgb(plan) } else { None };
    let mut out = tap.out.lock().unwrap_or_else(|e| e.into_inner());
    out.scores = scores;
    out.rgb = rgb;
}

/// The frame in RGB: the converted input when the turn carried it, else (a pre-filled
/// camera frame, whose pixels went to the tower earlier) converted again from the cache.
fn frame_rgb(plan: &JobPlan) -> Option<RgbImage> {
    if let Some(ImageInput::Rgb(img)) = plan.turn.images.first() {
        return Some(img.clone());
    }
    match &plan.images {
        Images::Camera(c) => {
            let img = c.frame.to_rgb8().ok()?;
            let (w, h) = (img.width() as usize, img.height() as usize);
            RgbImage::new(w, h, img.into_raw()).ok()
        }
        _ => None,
    }
}
