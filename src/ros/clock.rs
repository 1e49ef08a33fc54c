//! Stamps for the headers the node publishes: the node's ROS time now, and camera stamps as
//! `builtin_interfaces/Time`. Image ages are measured on the steady clock from arrival,
//! never from these stamps.
//!
//! ROS time is the system clock, or under `use_sim_time` the last `/clock` message (zero
//! until the first), as rcl's time override does. The node follows `/clock` itself rather
//! than through r2r's `TimeSource`: r2r 0.9.7 compiles that only under a cfg its build
//! script emits when it generates bindings, not when it reuses cached ones, so it comes and
//! goes between builds.

use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use camera_frame::Stamp;
use futures::{Stream, StreamExt};
use r2r::builtin_interfaces::msg::Time;
use r2r::rosgraph_msgs::msg::Clock;
use r2r::ParameterValue;

use crate::ros::params::ParamError;

/// The topic of simulated time (global by convention).
pub(crate) const CLOCK_TOPIC: &str = "/clock";

/// The latest simulated time, once `use_sim_time` is on; a process runs one node, and every
/// publisher (worker, ask tasks, diagnostics) stamps from it without being handed the node.
static SIM_TIME: OnceLock<Mutex<Time>> = OnceLock::new();

/// The parameter `use_sim_time` as given (absent = false).
pub(crate) fn use_sim_time(given: Option<&ParameterValue>) -> Result<bool, ParamError> {
    match given {
        None | Some(ParameterValue::NotSet) => Ok(false),
        Some(ParameterValue::Bool(b)) => Ok(*b),
        Some(other) => Err(ParamError {
            name: "use_sim_time",
            reason: format!("must be a bool, got {other:?}"),
        }),
    }
}

/// Switches stamps to simulated time (zero until the first `/clock` message).
pub(crate) fn enable_sim_time() {
    SIM_TIME.get_or_init(|| Mutex::new(Time::default()));
}

/// Follows `/clock` until the subscription ends (node shut down). A bag replayed in a loop
/// sends time backwards; that is taken as it comes, as rcl does.
pub(crate) async fn follow(mut clock: impl Stream<Item = Clock> + Unpin) {
    enable_sim_time();
    while let Some(msg) = clock.next().await {
        if let Some(t) = SIM_TIME.get() {
            *t.lock().unwrap_or_else(PoisonError::into_inner) = msg.clock;
        }
    }
}

/// The node's ROS time now.
pub(crate) fn now() -> Time {
    match SIM_TIME.get() {
        Some(t) => t.lock().unwrap_or_else(PoisonError::into_inner).clone(),
        None => system_now(),
    }
}

/// The system clock; one before 1970 reads as zero and one past 2038 as the largest stamp,
/// rather than failing a publish.
fn system_now() -> Time {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Time {
        sec: i32::try_from(d.as_secs()).unwrap_or(i32::MAX),
        nanosec: d.subsec_nanos(),
    }
}

/// A camera frame's header stamp, as it arrived.
pub(crate) fn time(stamp: Stamp) -> Time {
    Time {
        sec: stamp.sec,
        nanosec: stamp.nanosec,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_sim_time_must_be_a_bool() {
        assert!(!use_sim_time(None).unwrap());
        assert!(use_sim_time(Some(&ParameterValue::Bool(true))).unwrap());
        let e = use_sim_time(Some(&ParameterValue::String("yes".into()))).unwrap_err();
        assert_eq!(e.name, "use_sim_time");
    }
}
