//! Stamps for the headers the node publishes: wall-clock time now, and camera stamps as
//! `builtin_interfaces/Time`.

use std::time::{SystemTime, UNIX_EPOCH};

use camera_frame::Stamp;
use r2r::builtin_interfaces::msg::Time;

/// The wall-clock time now. A clock before 1970 reads as zero and one past 2038 as the
/// largest stamp, rather than failing a publish.
pub fn now() -> Time {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Time {
        sec: i32::try_from(d.as_secs()).unwrap_or(i32::MAX),
        nanosec: d.subsec_nanos(),
    }
}

/// A camera frame's header stamp, as it arrived.
pub fn time(stamp: Stamp) -> Time {
    Time {
        sec: stamp.sec,
        nanosec: stamp.nanosec,
    }
}
