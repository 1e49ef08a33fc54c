//! The `bpu_vlm` ROS 2 node (binary `vlm_node`): serves `/ask`, streams answers as
//! `bpu_vlm_msgs/Token` on `/vlm/tokens`, publishes finished `Answer`s on `/vlm/answers` and
//! stops requests through `/vlm/cancel`.
//!
//! This crate holds ROS plumbing only: no model math and no FFI (those live in the `vlm`
//! engine crates). A frame's way to a token: [`cameras`] caches the latest valid frame per
//! topic → [`ask`] validates a request, picks its image and queues it ([`registry`]) →
//! [`engine`] (the one thread that owns the model) answers it through
//! `vlm::assistant` and publishes each delta → [`node`] wires the entities, threads and
//! shutdown; [`params`] and [`diagnostics`] around them; [`embedded`] is the default model.
#![forbid(unsafe_code)]

pub mod ask;
pub mod cameras;
pub mod diagnostics;
pub mod embedded;
pub mod engine;
pub mod interface;
pub mod names;
pub mod node;
pub mod params;
pub mod registry;

/// The generated interface types of `msg/` (package `bpu_vlm_msgs`).
pub use r2r::bpu_vlm_msgs as msgs;
