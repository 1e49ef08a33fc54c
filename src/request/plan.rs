//! Planning an Ask request: every check (sizes first, [`crate::request::limits`]), the
//! sampling settings over the node's defaults, the `json_schema` compiled
//! (`crate::request::structured`), the image picked, and the job's plan built. A request
//! that fails a check is refused with the reason; nothing is queued here, but the node's
//! path (`plan_admitted`) takes the request's place in the queue between the cheap checks
//! and the compile.

use std::sync::Arc;
use std::time::{Duration, Instant};

use camera_frame::{BudgetError, CameraCache, DecodeBudget, Frame, Freshness, Limits, SelectError};
use r2r::sensor_msgs::msg::{CompressedImage, Image};
use serde_json::Value;
use vlm::assistant::Turn;
use vlm::sampler::SamplingParams;
use vlm::structured::JsonSchema;

use crate::interface::{enable_thinking, ErrorCode};
use crate::msgs::srv::Ask;
use crate::process::panics::contained;
use crate::process::test_hooks::{self, Site};
use crate::request::context::AskContext;
use crate::request::limits::check_sizes;
use crate::request::structured;
use crate::ros::cameras::{frame_from_compressed, frame_from_image, frame_header};
use crate::ros::params::{time_limit, Params, MAX_NEW_TOKENS_LIMIT};
use crate::serve::failure::Failure;
use crate::serve::job::{Images, JobPlan};

/// The camera name that asks for a text-only answer.
pub(crate) const NO_CAMERA: &str = "none";

fn invalid(message: impl Into<String>) -> Failure {
    Failure::new(ErrorCode::InvalidRequest, message)
}

/// `-1` (the field's default) = the node's value; anything else must pass `ok`.
fn float_or(v: f32, default: f32, name: &str, ok: impl Fn(f32) -> bool) -> Result<f32, Failure> {
    if v == -1.0 {
        Ok(default)
    } else if v.is_finite() && ok(v) {
        Ok(v)
    } else {
        Err(invalid(format!("{name} {v} is out of range")))
    }
}

/// Time limit from the request (`-1` = the parameter, `0` = none).
fn limit_secs(v: f64, default: f64, name: &str) -> Result<Option<Duration>, Failure> {
    let s = if v == -1.0 { default } else { v };
    time_limit(s).map_err(|e| {
        invalid(format!(
            "{name} {v} must be -1, 0 or a positive number of seconds: {e}"
        ))
    })
}

/// The time limit of a request: `-1` = `request_timeout_s`, `0` = as long as
/// `max_request_timeout_s` allows; above that cap it is refused naming the parameter. The
/// node's own default (or its "none") is cut to the cap, so no request holds the worker
/// longer than the cap whatever the parameters say.
fn request_timeout(v: f64, p: &Params) -> Result<Option<Duration>, Failure> {
    let asked = limit_secs(v, p.request_timeout_s, "timeout_s")?;
    // A hand-built `Params` may hold a cap that is no time limit: then there is none.
    let Ok(Some(cap)) = time_limit(p.max_request_timeout_s) else {
        return Ok(asked);
    };
    match asked {
        Some(t) if t > cap && v != -1.0 => Err(invalid(format!(
            "timeout_s {v} is above the limit of {} s (parameter max_request_timeout_s)",
            p.max_request_timeout_s
        ))),
        Some(t) => Ok(Some(t.min(cap))),
        None => Ok(Some(cap)),
    }
}

/// The sampling settings of a request over the node's defaults.
pub(crate) fn sampling(req: &Ask::Request, p: &Params) -> Result<SamplingParams, Failure> {
    let s = SamplingParams {
        temperature: float_or(req.temperature, p.temperature, "temperature", |x| x >= 0.0)?,
        top_p: float_or(req.top_p, p.top_p, "top_p", |x| x > 0.0 && x <= 1.0)?,
        min_p: float_or(req.min_p, p.min_p, "min_p", |x| (0.0..=1.0).contains(&x))?,
        repetition_penalty: float_or(
            req.repetition_penalty,
            p.repetition_penalty,
            "repetition_penalty",
            |x| x > 0.0,
        )?,
        // Any finite negative is the documented "node default"; -inf is no number a client
        // means, so it is refused like NaN.
        presence_penalty: if !req.presence_penalty.is_finite() {
            return Err(invalid(format!(
                "presence_penalty {} is out of range",
                req.presence_penalty
            )));
        } else if req.presence_penalty < 0.0 {
            p.presence_penalty
        } else if req.presence_penalty <= 100.0 {
            req.presence_penalty
        } else {
            return Err(invalid(format!(
                "presence_penalty {} is out of range",
                req.presence_penalty
            )));
        },
        top_k: match req.top_k {
            -1 => p.top_k as usize,
            k if k >= 0 => k as usize,
            k => return Err(invalid(format!("top_k {k} must be -1 or >= 0"))),
        },
        seed: match req.seed {
            -1 => p.seed,
            s if s >= 0 => Some(s as u64),
            s => return Err(invalid(format!("seed {s} must be -1 or >= 0"))),
        },
        ..SamplingParams::default()
    };
    s.validate().map_err(|e| invalid(e.to_string()))?;
    Ok(s)
}

/// A request whose fields are checked, up to its schema: what [`finish`] builds the job of.
struct Checked {
    req: Ask::Request,
    thinking: bool,
    sampling: SamplingParams,
    timeout: Option<Duration>,
    /// `max_image_age_s` (the request's or the node's) and `max_camera_silence_s`.
    fresh: Freshness,
    tools: Vec<Value>,
}

/// Every check of [`plan_async`] before the schema's compile, which is the costly one.
fn check(req: Ask::Request, p: &Params) -> Result<Checked, Failure> {
    // Sizes first: nothing below parses, copies or scans a field before it is bounded.
    check_sizes(&req, p)?;
    if req.prompt.trim().is_empty() {
        return Err(invalid("the prompt is empty"));
    }
    if req.max_new_tokens > MAX_NEW_TOKENS_LIMIT {
        return Err(invalid(format!(
            "max_new_tokens {} is above the limit of {MAX_NEW_TOKENS_LIMIT}",
            req.max_new_tokens
        )));
    }
    if req.max_new_tokens > p.max_request_new_tokens {
        return Err(invalid(format!(
            "max_new_tokens {} is above the limit of {} (parameter max_request_new_tokens)",
            req.max_new_tokens, p.max_request_new_tokens
        )));
    }
    let structured = !req.json_schema.is_empty();
    let thinking = match req.enable_thinking {
        // A schema answer thinks only when the request asks: a planner waits for the value.
        enable_thinking::DEFAULT => p.enable_thinking && !structured,
        enable_thinking::OFF => false,
        enable_thinking::ON => true,
        v => return Err(invalid(format!("enable_thinking {v} must be -1, 0 or 1"))),
    };
    let mut sampling = sampling(&req, p)?;
    if structured {
        sampling = structured::sampling(sampling, &req);
    }
    let timeout = request_timeout(req.timeout_s, p)?;
    let max_age = limit_secs(req.max_image_age_s, p.max_image_age_s, "max_image_age_s")?;
    // A node parameter, checked when set: a value that is no limit here is no limit.
    let max_silence = time_limit(p.max_camera_silence_s).ok().flatten();
    let tools = if req.tools_json.trim().is_empty() {
        Vec::new()
    } else {
        match serde_json::from_str::<Value>(&req.tools_json) {
            Ok(Value::Array(a)) if a.iter().all(Value::is_object) => a,
            Ok(_) => return Err(invalid("tools_json must be a JSON array of objects")),
            Err(e) => return Err(invalid(format!("tools_json is not JSON: {e}"))),
        }
    };
    if req.stop.iter().any(String::is_empty) {
        return Err(invalid("stop strings must not be empty"));
    }
    if structured {
        structured::check_conflicts(&tools, &req.stop)?;
    }
    Ok(Checked {
        req,
        thinking,
        sampling,
        timeout,
        fresh: Freshness {
            max_age,
            max_silence,
        },
        tools,
    })
}

/// The job of a checked request with its compiled schema: the deadline, the images, the turn.
fn finish(
    checked: Checked,
    json_schema: Option<Arc<JsonSchema>>,
    p: &Params,
    cameras: Option<&CameraCache>,
    now: Instant,
) -> Result<JobPlan, Failure> {
    let Checked {
        req,
        thinking,
        sampling,
        timeout,
        fresh,
        tools,
    } = checked;
    let max_new_tokens = if req.max_new_tokens == 0 {
        p.default_new_tokens()
    } else {
        req.max_new_tokens
    };
    let deadline = match timeout {
        Some(t) => Some(now.checked_add(t).ok_or_else(|| {
            invalid(format!(
                "timeout_s {} is too long to be a deadline",
                req.timeout_s
            ))
        })?),
        None => None,
    };
    let Ask::Request {
        prompt,
        system_prompt,
        stop,
        session_id,
        use_default_stop,
        images,
        compressed_images,
        camera,
        ..
    } = req;
    let images = pick_images(images, compressed_images, &camera, cameras, p, fresh, now)?;
    // Images stay empty here: the worker converts the frames when the job's turn comes.
    let turn = Turn {
        thinking,
        system: Some(system_prompt)
            .filter(|s| !s.trim().is_empty())
            .or_else(|| p.system_prompt.clone()),
        tools,
        sampling,
        stop,
        use_default_stop,
        deadline,
        started: now,
        json_schema,
        ..Turn::new(prompt, max_new_tokens as usize)
    };
    Ok(JobPlan {
        turn,
        images,
        session_id: Some(session_id).filter(|s| !s.is_empty()),
        max_image_age: fresh.max_age,
        scene_checked: None,
        detect: None,
        quiet: false,
    })
}

/// Checks a request and builds its job (without the queue slot and response channel), as
/// the node does but with the queue's room only probed, and only for a schema it would
/// compile: planning on its own (the tests') takes no place in the queue.
/// The turn's `cancel` is left unset: the flag comes with the queue slot. The request is
/// consumed: its prompt, stop strings and images move into the job without a copy.
/// `ctx.cameras` is `None` when the node runs without vision; `ctx.schemas` compiles a
/// `json_schema` for the served model (`None` before a model is loaded).
pub async fn plan_async(
    req: Ask::Request,
    p: Arc<Params>,
    ctx: &AskContext,
    now: Instant,
) -> Result<JobPlan, Failure> {
    let compiles = ctx.schemas().is_some() && !req.json_schema.is_empty();
    let probe = || {
        if compiles {
            ctx.registry
                .room()
                .map_err(|e| Failure::new(ErrorCode::Busy, e.to_string()))
        } else {
            Ok(())
        }
    };
    plan_admitted(req, p, ctx, now, probe)
        .await
        .map(|(plan, ())| plan)
}

/// The node's planning: the cheap checks, then `admit` — the request's place in the queue,
/// taken before anything costly or large (a schema's compile, the images) — then the rest.
/// So at most `queue_depth` requests (compiling, queued or running) hold memory, and any
/// other gets `busy` at once; a refusal after `admit` drops what it returned (the place
/// is free before the refusal goes out).
///
/// Compiling a schema (llguidance, then a first mask over the whole vocabulary) can take
/// long for a large uncached one, so it runs on the blocking pool, not on the runtime's two
/// threads that also serve other asks, the action loop, `vlm/cancel` and diagnostics; at
/// most `structured::COMPILES_AT_ONCE` compile at once, and later ones wait their turn
/// without holding a thread.
pub(crate) async fn plan_admitted<A>(
    req: Ask::Request,
    p: Arc<Params>,
    ctx: &AskContext,
    now: Instant,
    admit: impl FnOnce() -> Result<A, Failure>,
) -> Result<(JobPlan, A), Failure> {
    let mut checked = check(req, &p)?;
    let admitted = admit()?;
    let json_schema = compile_schema(&mut checked, ctx).await?;
    let plan = finish(checked, json_schema, &p, ctx.cameras.as_deref(), now)?;
    Ok((plan, admitted))
}

/// Every check of an ask but the queue's and the image's (which are made for each of its
/// runs): what a watch goal is checked with once, when it is accepted.
pub(crate) async fn validate(req: Ask::Request, ctx: &AskContext) -> Result<(), Failure> {
    let mut checked = check(req, &ctx.params.snapshot())?;
    compile_schema(&mut checked, ctx).await.map(drop)
}

/// The request's schema compiled (off the runtime when a model is loaded), `None` for free
/// text.
async fn compile_schema(
    checked: &mut Checked,
    ctx: &AskContext,
) -> Result<Option<Arc<JsonSchema>>, Failure> {
    let served = ctx.schemas();
    let Some(schemas) = served
        .as_ref()
        .filter(|_| !checked.req.json_schema.is_empty())
    else {
        return structured::compile(&checked.req.json_schema, served.as_deref());
    };
    // The semaphore is never closed; a closed one would only mean no limit.
    let _permit = ctx.compiles.acquire().await;
    let text = std::mem::take(&mut checked.req.json_schema);
    let schemas = Arc::clone(schemas);
    // Contained on the pool's thread: a panic there is outside the ask task's scope, and
    // the hook would take the node down for one hostile schema.
    let compiled = tokio::task::spawn_blocking(move || {
        contained(|| {
            test_hooks::point(Site::Schema);
            structured::compile(&text, Some(&schemas))
        })
    })
    .await;
    match compiled {
        Ok(Ok(r)) => r,
        // The request fails as one whose serving panicked on the worker does.
        Ok(Err(p)) => Err(Failure::new(
            ErrorCode::BackendError,
            format!("internal error: {p}"),
        )),
        Err(e) => Err(Failure::new(
            ErrorCode::NotReady,
            format!("json_schema: the compile was stopped: {e}"),
        )),
    }
}

/// The request's frames checked from their headers: each within `max_image_pixels`, all
/// together within `max_request_decoded_mb` of decoded bytes; no pixel is decoded here.
fn request_frames(
    images: Vec<Image>,
    compressed_images: Vec<CompressedImage>,
    p: &Params,
) -> Result<Vec<Frame>, Failure> {
    let limits = Limits::default();
    let mut budget = DecodeBudget::new(
        p.max_image_pixels as u64,
        p.max_request_decoded_bytes as u64,
    );
    let mut frames = Vec::with_capacity(images.len() + compressed_images.len());
    let mut take = |field: &str, i: usize, frame: Result<Frame, camera_frame::FrameError>| {
        let frame = frame.map_err(|e| invalid(format!("{field}[{i}]: {e}")))?;
        budget.charge(frame.layout()).map_err(|e| {
            let param = match e {
                BudgetError::TooManyPixels { .. } => "max_image_pixels",
                BudgetError::OverBudget { .. } => "max_request_decoded_mb",
            };
            invalid(format!("{field}[{i}]: {e} (parameter {param})"))
        })?;
        frames.push(frame);
        Ok::<_, Failure>(())
    };
    for (i, m) in images.into_iter().enumerate() {
        take("images", i, frame_from_image(m, &limits))?;
    }
    for (i, m) in compressed_images.into_iter().enumerate() {
        take("compressed_images", i, frame_from_compressed(m, &limits))?;
    }
    Ok(frames)
}

fn pick_images(
    images: Vec<Image>,
    compressed_images: Vec<CompressedImage>,
    camera: &str,
    cameras: Option<&CameraCache>,
    p: &Params,
    fresh: Freshness,
    now: Instant,
) -> Result<Images, Failure> {
    let explicit = !images.is_empty() || !compressed_images.is_empty();
    let Some(cache) = cameras else {
        if explicit {
            return Err(invalid(
                "this node runs without vision (parameter vision: false)",
            ));
        }
        return Ok(Images::None);
    };
    if explicit {
        // Raw images come first in the model input, so the first of them is "the first".
        let first = images
            .first()
            .map(|m| &m.header)
            .or_else(|| compressed_images.first().map(|m| &m.header))
            .map(frame_header)
            .unwrap_or_default();
        let frames = request_frames(images, compressed_images, p)?;
        return Ok(Images::Request { frames, first });
    }
    let camera = camera.trim();
    if camera == NO_CAMERA {
        return Ok(Images::None);
    }
    let name = (!camera.is_empty()).then_some(camera);
    cache
        .select(name, fresh, now)
        .map(Images::Camera)
        .map_err(|e| Failure::new(select_error_code(&e), e.to_string()))
}

/// An unknown camera is the client's mistake; a missing or old frame is the camera's, and
/// retrying later may help.
fn select_error_code(e: &SelectError) -> ErrorCode {
    match e {
        SelectError::UnknownCamera { .. } => ErrorCode::InvalidRequest,
        SelectError::NoCamera | SelectError::NoImage { .. } => ErrorCode::NoImage,
        SelectError::StaleImage { .. } | SelectError::SilentCamera { .. } => ErrorCode::StaleImage,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;
    use std::time::Duration;

    use vlm::structured::JsonSchemas;

    use super::*;
    use crate::ros::param_server::LiveParams;
    use crate::serve::registry::Registry;

    /// A context with the demo model's schema compiler and a queue of `depth`.
    fn context(depth: usize) -> AskContext {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/fixtures/models/tiny-4b");
        let tokenizer = vlm::assistant::load_tokenizer(&dir.join("tokenizer.json")).unwrap();
        AskContext {
            params: LiveParams::new(Params::from_values(&HashMap::new()).unwrap()),
            cameras: None,
            registry: Arc::new(Registry::new(depth)),
            jobs: std::sync::Mutex::new(None),
            schemas: std::sync::Mutex::new(Some(Arc::new(JsonSchemas::new(tokenizer, 640)))),
            lifecycle: crate::ros::lifecycle::Lifecycle::active(),
            compiles: tokio::sync::Semaphore::new(structured::COMPILES_AT_ONCE),
            clock: Default::default(),
            nuls: Default::default(),
            watches: Default::default(),
        }
    }

    fn request(schema: &str) -> Ask::Request {
        Ask::Request {
            prompt: "Where is the cup?".into(),
            json_schema: schema.into(),
            ..Default::default()
        }
    }

    /// A schema compiles only with a permit, and waiting for one holds up nothing else: a
    /// free-text request plans meanwhile.
    #[tokio::test]
    async fn a_schema_compiles_with_a_permit_and_waits_for_one() {
        let ctx = context(4);
        let now = Instant::now();
        let held = ctx
            .compiles
            .acquire_many(structured::COMPILES_AT_ONCE as u32)
            .await
            .unwrap();
        let schema = request(r#"{"type": "integer"}"#);
        let mut waiting = Box::pin(plan_async(schema, ctx.params.snapshot(), &ctx, now));
        assert!(futures::poll!(&mut waiting).is_pending());
        let free = plan_async(request(""), ctx.params.snapshot(), &ctx, now).await;
        assert!(free.unwrap().turn.json_schema.is_none());
        assert!(futures::poll!(&mut waiting).is_pending(), "still no permit");
        drop(held);
        let planned = waiting.await.unwrap();
        assert!(planned.turn.json_schema.is_some());
        assert_eq!(
            ctx.compiles.available_permits(),
            structured::COMPILES_AT_ONCE
        );
    }

    /// With the queue full, a schema is not compiled: the request is refused `busy` at once
    /// (a free-text one is planned and refused at admission, as before).
    #[tokio::test]
    async fn a_full_queue_refuses_a_schema_before_compiling_it() {
        let ctx = context(1);
        let _running = ctx.registry.admit("running").unwrap();
        let now = Instant::now();
        for schema in [r#"{"type": "integer"}"#, "{"] {
            let f = plan_async(request(schema), ctx.params.snapshot(), &ctx, now)
                .await
                .err()
                .unwrap();
            assert_eq!(f.code, ErrorCode::Busy, "{schema}: {}", f.message);
        }
        // The cheap checks still come first.
        let mut bad = request(r#"{"type": "integer"}"#);
        bad.prompt.clear();
        let f = plan_async(bad, ctx.params.snapshot(), &ctx, now)
            .await
            .err()
            .unwrap();
        assert_eq!(f.code, ErrorCode::InvalidRequest);
        assert!(plan_async(request(""), ctx.params.snapshot(), &ctx, now)
            .await
            .is_ok());
    }

    /// The node's order: the cheap checks, then the place in the queue, then the compile.
    /// A request a check refuses takes no place; one waiting to compile holds its place, so
    /// the next is `busy` at once; one refused after admission gives its place back.
    #[tokio::test]
    async fn the_place_is_taken_before_the_compile_and_given_back_on_refusal() {
        let ctx = context(1);
        let now = Instant::now();
        let admit = |id: &'static str| {
            let registry = Arc::clone(&ctx.registry);
            move || {
                registry
                    .admit(id)
                    .map_err(|e| Failure::new(ErrorCode::Busy, e.to_string()))
            }
        };
        let mut bad = request(r#"{"type": "integer"}"#);
        bad.prompt.clear();
        let never = || -> Result<(), Failure> { panic!("a place for a request the checks refuse") };
        let f = plan_admitted(bad, ctx.params.snapshot(), &ctx, now, never)
            .await
            .err()
            .unwrap();
        assert_eq!(f.code, ErrorCode::InvalidRequest);

        let held = ctx
            .compiles
            .acquire_many(structured::COMPILES_AT_ONCE as u32)
            .await
            .unwrap();
        let schema = request(r#"{"type": "integer"}"#);
        let mut first = Box::pin(plan_admitted(
            schema,
            ctx.params.snapshot(),
            &ctx,
            now,
            admit("a"),
        ));
        assert!(futures::poll!(&mut first).is_pending());
        assert_eq!(
            ctx.registry.len(),
            1,
            "waiting for a compile holds the place"
        );
        let other = request(r#"{"type": "boolean"}"#);
        let f = plan_admitted(other, ctx.params.snapshot(), &ctx, now, admit("b"))
            .await
            .err()
            .unwrap();
        assert_eq!(f.code, ErrorCode::Busy, "{}", f.message);
        drop(held);
        let (plan, admission) = first.await.unwrap();
        assert!(plan.turn.json_schema.is_some());
        drop(admission);

        let f = plan_admitted(request("{"), ctx.params.snapshot(), &ctx, now, admit("c"))
            .await
            .err()
            .unwrap();
        assert_eq!(f.code, ErrorCode::InvalidRequest);
        assert!(
            ctx.registry.is_empty(),
            "a refused request gives its place back"
        );
    }

    #[test]
    fn camera_selection_errors_map_to_the_interface_codes() {
        let cases = [
            (
                SelectError::UnknownCamera {
                    name: "/nope".into(),
                },
                "invalid_request",
            ),
            (SelectError::NoCamera, "no_image"),
            (
                SelectError::NoImage {
                    topic: "/image_raw".into(),
                },
                "no_image",
            ),
            (
                SelectError::StaleImage {
                    topic: "/image_raw".into(),
                    age: Duration::from_secs(3),
                    max_age: Duration::from_secs(2),
                },
                "stale_image",
            ),
            (
                SelectError::SilentCamera {
                    topic: "/image_raw".into(),
                    silent: Duration::from_secs(3),
                    max_silence: Duration::from_secs(2),
                },
                "stale_image",
            ),
        ];
        for (e, code) in cases {
            assert_eq!(select_error_code(&e).as_str(), code, "{e}");
        }
    }
}
