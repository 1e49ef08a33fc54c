//! QoS of the node's own topics. Camera QoS is chosen by a parameter (`crate::ros::cameras`).

use r2r::QosProfile;

use crate::ros::names::{ANSWERS_HISTORY_DEPTH, TOKENS_HISTORY_DEPTH};

/// QoS of `/vlm/tokens`: reliable with a deep history, so no delta of an answer is lost.
pub fn tokens_qos() -> QosProfile {
    QosProfile::default()
        .reliable()
        .keep_last(TOKENS_HISTORY_DEPTH)
}

/// QoS of `/vlm/answers`.
pub(crate) fn answers_qos() -> QosProfile {
    QosProfile::default()
        .reliable()
        .keep_last(ANSWERS_HISTORY_DEPTH)
}
