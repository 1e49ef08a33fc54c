//! QoS of the node's own topics. Camera QoS is chosen by a parameter (`crate::ros::cameras`).

use r2r::QosProfile;

use crate::ros::names::{ANSWERS_HISTORY_DEPTH, TOKENS_HISTORY_DEPTH};

/// QoS of `/vlm/tokens`: reliable with a deep history, so no delta of an answer is lost.
pub fn tokens_qos() -> QosProfile {
    QosProfile::default()
        .reliable()
        .keep_last(TOKENS_HISTORY_DEPTH)
}

/// How many requests to one of the node's services DDS keeps until the spin thread takes
/// them. A burst arrives within a millisecond, faster than the spin thread takes them (one
/// per service per spin): with the default's 10, DDS would replace all but the last 10
/// unseen, and their clients would wait forever. The bound stays: a flood beyond it is
/// dropped by DDS rather than held in memory without end.
pub(crate) const REQUEST_HISTORY_DEPTH: usize = 256;

/// QoS of the services the node serves (`/ask`, `/vlm/cancel`, the action's): the ROS
/// default for services with [`REQUEST_HISTORY_DEPTH`].
pub(crate) fn requests_qos() -> QosProfile {
    QosProfile::services_default().keep_last(REQUEST_HISTORY_DEPTH)
}

/// QoS of `/vlm/answers`.
pub(crate) fn answers_qos() -> QosProfile {
    QosProfile::default()
        .reliable()
        .keep_last(ANSWERS_HISTORY_DEPTH)
}
