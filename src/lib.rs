//! The `bpu_vlm` ROS 2 node (binary `vlm_node`): serves `/ask`, streams answers as
//! `bpu_vlm_msgs/Token` on `/vlm/tokens`, publishes finished `Answer`s on `/vlm/answers` and
//! stops requests through `/vlm/cancel`.
//!
//! This crate holds ROS plumbing only: no model math and no FFI (those live in the `vlm`
//! engine crates). ROS callbacks never block: every entity is created first, one thread
//! spins the `r2r::Node`, and requests are handled by tokio tasks.
//!
//! Until the engine is wired in, `/ask` honestly answers `not_ready`.
#![forbid(unsafe_code)]

pub mod ask;
pub mod interface;
pub mod names;
pub mod node;

/// The generated interface types of `msg/` (package `bpu_vlm_msgs`).
pub use r2r::bpu_vlm_msgs as msgs;
