//! What the request-planning tests share: the node's default parameters, the demo model's
//! JSON-schema compiler, a camera cache, and a request every check accepts.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bpu_vlm::interface::ErrorCode;
use bpu_vlm::msgs::srv::Ask;
use bpu_vlm::request::context::AskContext;
use bpu_vlm::request::plan::plan_async;
use bpu_vlm::ros::params::Params;
use bpu_vlm::serve::failure::Failure;
use bpu_vlm::serve::job::JobPlan;
use camera_frame::{CacheConfig, CameraCache, Frame, ImageMsg, Limits, Stamp};
use vlm::assistant::load_tokenizer;
use vlm::structured::JsonSchemas;

pub fn params() -> Params {
    Params::from_values(&HashMap::new()).unwrap()
}

/// The JSON-schema compiler of the embedded demo model (its tokenizer, its 640-id
/// vocabulary), as the node hands it to planning once the model is loaded.
pub fn schemas() -> &'static Arc<JsonSchemas> {
    static SCHEMAS: OnceLock<Arc<JsonSchemas>> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/fixtures/models/tiny-4b");
        Arc::new(JsonSchemas::new(
            load_tokenizer(&dir.join("tokenizer.json")).unwrap(),
            640,
        ))
    })
}

/// Plans `req` on the path the node runs ([`plan_async`]) over parameters `p`, with
/// `cameras` (`None`: no vision) and `schemas` (`None`: no model loaded yet), at `now`.
pub fn plan(
    req: Ask::Request,
    p: &Params,
    cameras: Option<&Arc<CameraCache>>,
    schemas: Option<&Arc<JsonSchemas>>,
    now: Instant,
) -> Result<JobPlan, Failure> {
    let ctx = AskContext::new(p.clone(), cameras.cloned(), schemas.cloned());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(plan_async(req, Arc::new(p.clone()), &ctx, now))
}

/// A cache with one camera holding a frame that arrived at `t0` and one that never sent any.
pub fn cameras(t0: Instant) -> Arc<CameraCache> {
    let c = CameraCache::new(
        CacheConfig {
            topics: vec!["/cam".into(), "/silent".into()],
            default_camera: None,
            warn_interval: Duration::from_secs(5),
        },
        t0,
    )
    .unwrap();
    let frame = Frame::from_image(
        ImageMsg {
            encoding: "mono8",
            width: 2,
            height: 2,
            step: 2,
            is_bigendian: false,
            data: vec![1, 2, 3, 4],
        },
        &Limits::default(),
    );
    c.record("/cam", frame, Stamp::default(), t0).unwrap();
    Arc::new(c)
}

/// An edit of a request (one field set to a test value).
pub type Mutation = Box<dyn Fn(&mut Ask::Request)>;

/// A request every check accepts (text only, so no camera is needed).
pub fn valid() -> Ask::Request {
    Ask::Request {
        prompt: "What is in the picture?".into(),
        camera: "none".into(),
        max_image_age_s: -1.0,
        temperature: -1.0,
        top_p: -1.0,
        min_p: -1.0,
        top_k: -1,
        repetition_penalty: -1.0,
        presence_penalty: -1.0,
        seed: -1,
        enable_thinking: -1,
        use_default_stop: true,
        timeout_s: -1.0,
        ..Default::default()
    }
}

pub fn refusal(req: Ask::Request) -> Option<String> {
    refusal_with(req, &params())
}

/// [`refusal`] over parameters `p`.
pub fn refusal_with(req: Ask::Request, p: &Params) -> Option<String> {
    let t0 = Instant::now();
    match plan(req, p, Some(&cameras(t0)), Some(schemas()), t0) {
        Ok(_) => None,
        Err(f) => {
            assert_eq!(f.code, ErrorCode::InvalidRequest, "{}", f.message);
            Some(f.message)
        }
    }
}
