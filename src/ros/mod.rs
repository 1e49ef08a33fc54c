//! The ROS side of the node that knows nothing of requests or the model: names, QoS, the
//! spin thread, publishers behind `publish::Publish`, the node's clock, logging (stderr
//! level, `/rosout`, rate-limited warnings), parameters and their services, camera
//! messages into frames, text made safe for a message, and the managed-node (lifecycle)
//! protocol.

pub(crate) mod cameras;
pub(crate) mod clock;
pub mod lifecycle;
pub mod log_level;
pub(crate) mod log_limit;
pub(crate) mod names;
pub(crate) mod param_server;
pub mod params;
pub(crate) mod publish;
pub mod qos;
pub(crate) mod remap;
pub mod rosout;
pub mod spin;
pub(crate) mod text;
