//! ROS names: the node's and its entities' as the interface pins them, and their fully
//! resolved form.
//!
//! Entity names are relative, so they move with the node's namespace: in the root namespace
//! they are `/ask`, `/vlm/tokens`, `/vlm/answers`, `/vlm/cancel` and the action `/vlm/ask`.
//!
//! [`expand`] resolves a name as rcl does when an entity is created: the node's answers and
//! cache keys must name a camera the way the graph does (`image_source`), and a request may
//! name it either way. Only expansion is done here (relative → under the namespace, `~` → under
//! the node); `--ros-args -r` remapping rules are applied on top by [`crate::ros::remap`].

/// Default node name.
pub(crate) const NODE_NAME: &str = "vlm_node";

/// Service answering questions (`bpu_vlm_msgs/srv/Ask`).
pub(crate) const ASK_SERVICE: &str = "ask";

/// Service stopping a request (`bpu_vlm_msgs/srv/Cancel`).
pub(crate) const CANCEL_SERVICE: &str = "vlm/cancel";

/// Action asking questions with Token feedback (`bpu_vlm_msgs/action/Ask`).
pub(crate) const ASK_ACTION: &str = "vlm/ask";

/// Topic of streamed deltas (`bpu_vlm_msgs/msg/Token`).
pub(crate) const TOKENS_TOPIC: &str = "vlm/tokens";

/// Topic of finished answers (`bpu_vlm_msgs/msg/Answer`).
pub(crate) const ANSWERS_TOPIC: &str = "vlm/answers";

/// History depth of `/vlm/tokens`: a whole answer of deltas fits, so a slow subscriber
/// on reliable QoS still receives every Token.
pub(crate) const TOKENS_HISTORY_DEPTH: usize = 4096;

/// History depth of `/vlm/answers`.
pub(crate) const ANSWERS_HISTORY_DEPTH: usize = 64;

/// Expands `name` for a node `node_name` in `namespace` (`/` or `/a/b`): absolute names stay,
/// `~` and `~/x` go under the node's full name, anything else under the namespace.
pub(crate) fn expand(name: &str, namespace: &str, node_name: &str) -> String {
    let ns = namespace.trim_end_matches('/');
    if name.starts_with('/') {
        return name.to_owned();
    }
    if let Some(rest) = name.strip_prefix('~') {
        return format!("{ns}/{node_name}{rest}");
    }
    format!("{ns}/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_namespace_gives_todays_absolute_names() {
        for (rel, abs) in [
            ("ask", "/ask"),
            ("vlm/tokens", "/vlm/tokens"),
            ("image_raw", "/image_raw"),
        ] {
            assert_eq!(expand(rel, "/", "vlm_node"), abs);
        }
        assert_eq!(expand("vlm_node", "/", "vlm_node"), "/vlm_node");
    }

    #[test]
    fn relative_names_move_with_the_namespace_and_absolute_ones_stay() {
        assert_eq!(
            expand("vlm/answers", "/robot1", "vlm_node"),
            "/robot1/vlm/answers"
        );
        assert_eq!(expand("image_raw", "/a/b/", "vlm_node"), "/a/b/image_raw");
        assert_eq!(expand("/cam", "/robot1", "vlm_node"), "/cam");
        assert_eq!(
            expand("~/debug", "/robot1", "vlm_node"),
            "/robot1/vlm_node/debug"
        );
        assert_eq!(
            expand("vlm_node", "/robot1", "vlm_node"),
            "/robot1/vlm_node"
        );
    }
}
