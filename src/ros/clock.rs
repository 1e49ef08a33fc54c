//! Stamps for the headers the node publishes: the node's ROS time now, and camera stamps as
//! `builtin_interfaces/Time`. Image ages are measured on the steady clock from arrival,
//! never from these stamps.
//!
//! ROS time is the system clock, or under `use_sim_time` the last `/clock` message (zero
//! until the first), as rcl's time override does. The node follows `/clock` itself rather
//! than through r2r's `TimeSource`: r2r 0.9.7 compiles that only under a cfg its build
//! script emits when it generates bindings, not when it reuses cached ones, so it comes and
//! goes between builds.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use camera_frame::Stamp;
use futures::{Stream, StreamExt};
use r2r::builtin_interfaces::msg::Time;
use r2r::rosgraph_msgs::msg::Clock;
use r2r::ParameterValue;

use crate::ros::params::ParamError;

/// The topic of simulated time (global by convention).
pub(crate) const CLOCK_TOPIC: &str = "/clock";

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

/// The node's ROS time, cloned into everything that stamps a message (the worker, the
/// action's goals, diagnostics): the system clock, or under `use_sim_time` the last `/clock`
/// message (zero until the first).
#[derive(Clone, Default)]
pub(crate) struct RosClock {
    /// The latest simulated time; `None`: the system clock.
    sim: Option<Arc<Mutex<Time>>>,
}

impl RosClock {
    /// A clock of simulated time, zero until [`RosClock::follow`] gets a `/clock` message.
    pub(crate) fn simulated() -> Self {
        Self {
            sim: Some(Arc::new(Mutex::new(Time::default()))),
        }
    }

    /// Follows `/clock` until the subscription ends (node shut down). A bag replayed in a
    /// loop sends time backwards; that is taken as it comes, as rcl does.
    pub(crate) async fn follow(self, mut clock: impl Stream<Item = Clock> + Unpin) {
        while let Some(msg) = clock.next().await {
            if let Some(t) = &self.sim {
                *t.lock().unwrap_or_else(PoisonError::into_inner) = msg.clock;
            }
        }
    }

    /// The node's ROS time now.
    pub(crate) fn now(&self) -> Time {
        match &self.sim {
            Some(t) => t.lock().unwrap_or_else(PoisonError::into_inner).clone(),
            None => system_now(),
        }
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

    #[test]
    fn a_simulated_clock_is_zero_until_clock_then_follows_it() {
        let sim = RosClock::simulated();
        assert_eq!(sim.now(), Time::default());
        let t = Time {
            sec: 42,
            nanosec: 7,
        };
        let msgs = futures::stream::iter([Clock { clock: t.clone() }]);
        futures::executor::block_on(sim.clone().follow(msgs));
        assert_eq!(sim.now(), t);
        assert!(RosClock::default().now().sec > 0, "the system clock");
    }
}
