//! Requests from their arrival to the worker's queue: `/ask` and `/vlm/cancel` (`ask`, all
//! asks sharing one [`context`]), the checks and the job they build ([`plan`], sizes first
//! in [`limits`], `json_schema` in `structured`), the `/ask` service's tasks (`ask_server`)
//! the Ask action (`ask_action`), `/detect` (`detect`, `detect_action`) and standing questions
//! (`watch`, `watch_action`). The top room: it hands jobs to [`crate::serve`].

pub(crate) mod ask;
pub(crate) mod ask_action;
pub(crate) mod ask_server;
pub mod context;
pub(crate) mod detect;
pub(crate) mod detect_action;
pub mod limits;
pub mod plan;
pub(crate) mod servers;
pub(crate) mod structured;
pub(crate) mod watch;
pub(crate) mod watch_action;
