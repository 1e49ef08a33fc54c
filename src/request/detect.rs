//! `/detect` (`bpu_vlm_msgs/srv/Detect`): "where is it?". A detect request is an ask on the
//! `/ask` path ([`crate::request::ask::handle_planned`]) — the same queue, limits, cancel,
//! error codes, camera choice and frame pre-fill — whose prompt, schema and budget come
//! from [`vlm::grounding::DetectSpec`]; its answer's 0–1000 numbers become a
//! `vision_msgs/Detection2DArray` in the pixels of the frame used, with that frame's header.
//! Every result goes out on `vlm/detections`, and the frame with the detections drawn on
//! `vlm/annotated` while that topic has a subscriber.

use std::sync::{Arc, Mutex, MutexGuard};

use r2r::sensor_msgs::msg::Image;
use r2r::vision_msgs::msg::{Detection2D, Detection2DArray};
use r2r::Publisher;
use vlm::grounding::{self, DetectSpec, Detection, Kind, ObjectScanner, TokenScores};
use vlm::vision::RgbImage;

use crate::interface::ErrorCode;
use crate::msgs::srv::{Ask, Detect};
use crate::process::panics::contained_async;
use crate::process::test_hooks;
use crate::request::ask::{handle_planned, GoalHooks};
use crate::request::context::AskContext;
use crate::serve::detect_feedback::to_array;
use crate::serve::detect_tap::{DetectTap, TapOut};
use crate::serve::failure::Failure;
use crate::serve::outcome::refused;

/// The topics every detect result goes to, each publisher behind a lock: an r2r publisher
/// may be sent between threads but not shared.
pub(crate) struct DetectOutputs {
    pub detections: Mutex<Publisher<Detection2DArray>>,
    pub annotated: Mutex<Publisher<Image>>,
}

impl DetectOutputs {
    /// Drawing costs a copy of the frame: only while someone looks.
    fn wants_annotated(&self) -> bool {
        lock(&self.annotated)
            .get_inter_process_subscription_count()
            .is_ok_and(|n| n > 0)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The ask a detect request is, or why it is refused before it is planned.
fn to_ask(req: Detect::Request) -> Result<(Ask::Request, DetectSpec), Failure> {
    let invalid = |m: String| Failure::new(ErrorCode::InvalidRequest, m);
    let spec = DetectSpec::new(&req.query, req.max_objects as usize, req.points)
        .map_err(|e| invalid(e.to_string()))?;
    let sent = req.images.len() + req.compressed_images.len();
    if sent > 1 {
        return Err(invalid(format!(
            "images + compressed_images hold {sent} images; a detect takes at most one"
        )));
    }
    if sent == 0 && req.camera == "none" {
        return Err(invalid(
            "camera \"none\" gives no image to find things in".into(),
        ));
    }
    let ask = Ask::Request {
        request_id: req.request_id,
        prompt: spec.prompt(),
        camera: req.camera,
        max_image_age_s: req.max_image_age_s,
        images: req.images,
        compressed_images: req.compressed_images,
        timeout_s: req.timeout_s,
        json_schema: test_hooks::held_detect_answer().unwrap_or_else(|| spec.schema_text()),
        // Greedy: the most likely boxes, the same ones for the same frame.
        temperature: 0.0,
        enable_thinking: crate::interface::enable_thinking::OFF,
        ..Ask::Request::default()
    };
    Ok((ask, spec))
}

/// Handles one detect request to its response and publishes its result; `hooks` are an
/// action goal's (none for a service request).
pub(crate) async fn handle(
    req: Detect::Request,
    ctx: Arc<AskContext>,
    outputs: Arc<DetectOutputs>,
    hooks: GoalHooks,
) -> Detect::Response {
    let id = req.request_id.clone();
    let (ask, spec) = match to_ask(req) {
        Ok(a) => a,
        Err(f) => {
            tracing::info!(request_id = %id, code = f.code.as_str(), "detect refused: {}", f.message);
            return response(refused(id, f, &ctx.nuls), Vec::new());
        }
    };
    // The answer's budget is the request's max_new_tokens in all but name: the node's
    // limit on it holds here too.
    let limit = ctx.params.snapshot().max_request_new_tokens;
    if spec.token_budget() > limit as usize {
        let f = Failure::new(
            ErrorCode::InvalidRequest,
            format!(
                "an answer of {} objects needs up to {} tokens, above the limit of {limit} \
                 (parameter max_request_new_tokens); ask for fewer objects",
                spec.max_objects,
                spec.token_budget()
            ),
        );
        return response(refused(id, f, &ctx.nuls), Vec::new());
    }
    let tap = DetectTap::new(spec.clone(), outputs.wants_annotated());
    let out = tap.out.clone();
    let budget = spec.token_budget();
    let nuls = ctx.nuls.clone();
    let adjust = move |plan: &mut crate::serve::job::JobPlan| {
        plan.turn.max_new_tokens = budget;
        plan.turn.token_probs = true;
        plan.detect = Some(tap);
    };
    let asked = contained_async(handle_planned(ask, ctx, hooks, adjust)).await;
    let answer = match asked {
        Ok(a) => a,
        Err(p) => {
            let f = Failure::new(ErrorCode::BackendError, format!("internal error: {p}"));
            return response(refused(id, f, &nuls), Vec::new());
        }
    };
    let TapOut { scores, rgb } = std::mem::take(&mut *lock(&out));
    let (answer, found) = found(answer, spec.kind, scores.as_ref());
    let resp = response(answer, found);
    // A failure's empty array would tell a tracker "nothing is there": only answers, and a
    // stopped detect's objects found before it stopped, are published.
    if !resp.image_source.is_empty() && (resp.success || !resp.detections.detections.is_empty()) {
        publish(&outputs, &resp, rgb);
    }
    resp
}

/// The detections of an answer: all of them from a complete one (an answer that does not
/// parse fails `incomplete`), the objects whose JSON closed from a stopped one.
fn found(
    mut answer: Ask::Response,
    kind: Kind,
    scores: Option<&TokenScores>,
) -> (Ask::Response, Vec<Detection>) {
    let (w, h) = (answer.image_width as usize, answer.image_height as usize);
    if answer.success {
        match grounding::detections(&answer.answer, kind, w, h, scores) {
            Ok(d) => return (answer, d),
            Err(e) => {
                answer.success = false;
                answer.error_code = ErrorCode::Incomplete.as_str().to_owned();
                answer.error_message = e.to_string();
            }
        }
    }
    let mut scanner = ObjectScanner::new(kind);
    let partial = scanner
        .push(&answer.answer)
        .iter()
        .filter_map(|r| grounding::to_pixels(r, w, h, grounding::label_score(r, scores)))
        .collect();
    (answer, partial)
}

/// The Detect response of an Ask response and its detections.
fn response(a: Ask::Response, found: Vec<Detection>) -> Detect::Response {
    Detect::Response {
        detections: to_array(&a.image_header, &found),
        success: a.success,
        error_code: a.error_code,
        error_message: a.error_message,
        request_id: a.request_id,
        text: a.answer,
        image_source: a.image_source,
        image_header: a.image_header,
        image_width: a.image_width,
        image_height: a.image_height,
        prompt_tokens: a.prompt_tokens,
        completion_tokens: a.completion_tokens,
        ttft_s: a.ttft_s,
        decode_tokens_per_s: a.decode_tokens_per_s,
    }
}

/// The result on `vlm/detections`, and drawn on `vlm/annotated` when the frame was kept.
fn publish(outputs: &DetectOutputs, resp: &Detect::Response, rgb: Option<RgbImage>) {
    if let Err(e) = lock(&outputs.detections).publish(&resp.detections) {
        tracing::warn!(error = %e, "could not publish the detections");
    }
    let Some(mut img) = rgb else {
        return;
    };
    let marks: Vec<annotate::Mark> = resp
        .detections
        .detections
        .iter()
        .enumerate()
        .map(mark)
        .collect();
    if let Err(e) = annotate::draw(&mut img.data, img.width, img.height, &marks) {
        tracing::warn!(error = %e, "could not draw the detections");
        return;
    }
    let msg = Image {
        header: resp.image_header.clone(),
        height: img.height as u32,
        width: img.width as u32,
        encoding: "rgb8".into(),
        is_bigendian: 0,
        step: (img.width * 3) as u32,
        data: img.data,
    };
    if let Err(e) = lock(&outputs.annotated).publish(&msg) {
        tracing::warn!(error = %e, "could not publish the annotated frame");
    }
}

fn mark((i, d): (usize, &Detection2D)) -> annotate::Mark {
    let b = &d.bbox;
    let (x, y) = (b.center.position.x, b.center.position.y);
    let shape = if b.size_x == 0.0 && b.size_y == 0.0 {
        annotate::Shape::Point { x, y }
    } else {
        annotate::Shape::Box {
            x1: x - b.size_x / 2.0,
            y1: y - b.size_y / 2.0,
            x2: x + b.size_x / 2.0,
            y2: y + b.size_y / 2.0,
        }
    };
    let label = d
        .results
        .first()
        .map(|r| format!("{} {:.2}", r.hypothesis.class_id, r.hypothesis.score))
        .unwrap_or_default();
    annotate::Mark {
        shape,
        label,
        index: i,
    }
}

/// Answers one `/detect` request (the loop is [`crate::request::ask_server::AskServer`]'s).
pub(crate) async fn answer(
    mut request: r2r::ServiceRequest<Detect::Service>,
    ctx: Arc<AskContext>,
    outputs: Arc<DetectOutputs>,
) {
    // Taken, not cloned: the request's image is its bulk.
    let message = std::mem::take(&mut request.message);
    let response = handle(message, ctx, outputs, GoalHooks::default()).await;
    if let Err(error) = request.respond(response) {
        tracing::warn!(%error, "could not send the /detect response");
    }
}

/// The service's name (relative: in the node's namespace, as `/ask`).
pub(crate) const SERVICE: &str = "detect";
/// The action's name (relative, as the Ask action's default `vlm/ask`).
pub(crate) const ACTION: &str = "vlm/detect";
/// Every detect result.
pub(crate) const DETECTIONS_TOPIC: &str = "vlm/detections";
/// The frame with the detections drawn, while it has a subscriber.
pub(crate) const ANNOTATED_TOPIC: &str = "vlm/annotated";
