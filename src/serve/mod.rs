//! Serving admitted requests on the one thread that owns the model: the job ([`job`]), the
//! worker loop (`worker`), one job to its end (`deliver`: the last Token, the `Answer`
//! and the response from one `outcome`, failures as [`failure`]), the Token stream
//! (`token_sink`), conversations (`sessions`), the background frame priming
//! (`priming`), admission and cancel by id (`registry`) and what diagnostics read
//! (`stats`).

pub(crate) mod deliver;
pub(crate) mod detect_feedback;
pub(crate) mod detect_tap;
pub(crate) mod detections;
pub mod failure;
pub mod job;
pub(crate) mod outcome;
pub(crate) mod priming;
pub(crate) mod registry;
pub(crate) mod sessions;
pub(crate) mod stats;
pub(crate) mod token_sink;
pub(crate) mod worker;
