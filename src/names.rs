//! Names of the node and its entities, as pinned by the interface contract. Entity names are
//! relative, so they move with the node's namespace: in the root namespace they are `/ask`,
//! `/vlm/tokens`, `/vlm/answers`, `/vlm/cancel` and the action `/vlm/ask`.

/// Default node name.
pub const NODE_NAME: &str = "vlm_node";

/// Service answering questions (`bpu_vlm_msgs/srv/Ask`).
pub const ASK_SERVICE: &str = "ask";

/// Service stopping a request (`bpu_vlm_msgs/srv/Cancel`).
pub const CANCEL_SERVICE: &str = "vlm/cancel";

/// Action asking questions with Token feedback (`bpu_vlm_msgs/action/Ask`).
pub const ASK_ACTION: &str = "vlm/ask";

/// Topic of streamed deltas (`bpu_vlm_msgs/msg/Token`).
pub const TOKENS_TOPIC: &str = "vlm/tokens";

/// Topic of finished answers (`bpu_vlm_msgs/msg/Answer`).
pub const ANSWERS_TOPIC: &str = "vlm/answers";

/// History depth of `/vlm/tokens`: a whole answer of deltas fits, so a slow subscriber
/// on reliable QoS still receives every Token.
pub const TOKENS_HISTORY_DEPTH: usize = 4096;

/// History depth of `/vlm/answers`.
pub const ANSWERS_HISTORY_DEPTH: usize = 64;
