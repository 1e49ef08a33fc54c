//! Fully resolved ROS names, as rcl expands them when an entity is created: the node's
//! answers and cache keys must name a camera the way the graph does (`image_source`), and
//! a request may name it either way.
//!
//! Only expansion is done here (relative → under the namespace, `~` → under the node);
//! `--ros-args -r` remappings are applied by rcl to the subscription but not reflected in
//! the names reported (r2r 0.9.7 exposes no `rcl_node_resolve_name`).

/// Expands `name` for a node `node_name` in `namespace` (`/` or `/a/b`): absolute names stay,
/// `~` and `~/x` go under the node's full name, anything else under the namespace.
pub fn expand(name: &str, namespace: &str, node_name: &str) -> String {
    let ns = namespace.trim_end_matches('/');
    if name.starts_with('/') {
        return name.to_owned();
    }
    if let Some(rest) = name.strip_prefix('~') {
        return format!("{ns}/{node_name}{rest}");
    }
    format!("{ns}/{name}")
}

/// The node's full name (`/vlm_node`, `/robot1/vlm_node`).
pub fn full_name(namespace: &str, node_name: &str) -> String {
    expand(node_name, namespace, node_name)
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
        assert_eq!(full_name("/", "vlm_node"), "/vlm_node");
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
        assert_eq!(full_name("/robot1", "vlm_node"), "/robot1/vlm_node");
    }
}
