//! The `bpu_vlm` ROS 2 node (binary `vlm_node`): serves `/ask`, streams answers as
//! `bpu_vlm_msgs/Token` on `/vlm/tokens`, publishes finished `Answer`s on `/vlm/answers` and
//! stops requests through `/vlm/cancel`.
//!
//! This crate holds ROS plumbing only: no model math and no FFI (those live in `vlm` and
//! `vlm-bpu`). A frame's way to a token:
//! 1. [`cameras`] validates each camera message into the latest-frame cache;
//! 2. [`ask`] checks a request against a snapshot of the [`params`] in force (served and
//!    set at run time through [`param_server`]; sizes first, [`limits`]), picks its
//!    image and builds the job ([`job`]: a `vlm::assistant::Turn` plus the image choice and
//!    session), admits it ([`registry`]) and queues it;
//! 3. [`worker`], the one thread that owns the model, converts the frame to RGB, continues the
//!    conversation from [`sessions`] and asks `vlm::assistant`, publishing each delta through
//!    [`token_sink`];
//! 4. the request ends in one [`outcome`], from which the last Token, the `Answer` and the
//!    `/ask` response are filled; error codes are [`interface::ErrorCode`] and finish
//!    reasons `vlm::stream::FinishReason` until then.
//!
//! [`node`] creates the entities, threads and shutdown ([`ask_server`] tracks every `/ask`
//! task until its response is sent; [`ask_action`] serves the same asks as the action
//! `vlm/ask`, each goal on the service's path with its Tokens as feedback; [`signals`]:
//! SIGINT, SIGTERM); [`diagnostics`] reports on
//! `/diagnostics` (the level judged by [`health`]); [`rosout`] sends warnings to `/rosout`;
//! [`embedded`] is the demo model (`demo_model`); [`log_level`] sets the stderr log level from
//! `--ros-args --log-level`.
//!
//! Failures stay as small as they can: every string bound for a message passes [`ros_text`]
//! (a NUL from the model cannot panic r2r), each request is served inside
//! [`panics::contained`] (a panic fails that request only), and what cannot be recovered is
//! raised in [`fatal`], which decides the exit code ([`test_hooks`] injects panics in debug
//! builds).
#![forbid(unsafe_code)]

pub mod ask;
pub mod ask_action;
pub mod ask_server;
pub mod cameras;
pub mod clock;
pub mod diagnostics;
pub mod embedded;
pub mod fatal;
pub mod health;
pub mod interface;
pub mod job;
pub mod limits;
pub mod log_level;
pub mod names;
pub mod node;
pub mod outcome;
pub mod panics;
pub mod param_server;
pub mod params;
pub mod prefill;
pub mod registry;
pub mod ros_names;
pub mod ros_text;
pub mod rosout;
pub mod sessions;
pub mod signals;
pub mod structured;
pub mod test_hooks;
pub mod token_sink;
pub mod worker;

/// The generated interface types of `msg/` (package `bpu_vlm_msgs`).
pub use r2r::bpu_vlm_msgs as msgs;
