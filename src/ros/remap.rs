//! The command line's remapping rules (`--ros-args -r from:=to`), read as rcl reads them, so
//! the node can report the names rcl gave its entities: a camera's `image_source` and the
//! silent-camera check name the remapped topic, and the stderr log filter knows the node's
//! logger before the node exists. rcl applies the same rules to the entities themselves;
//! r2r 0.9.7 exposes neither `rcl_node_resolve_name` nor a subscription's topic name, so they
//! are read again here.
//!
//! The rcl rules followed:
//! - a rule is `[node:]from:=to` after `-r` or `--remap` inside `--ros-args` (up to `--`);
//!   a rule with a `node:` prefix applies only to the node of that name;
//! - `__node:=` (or `__name:=`) renames the node and `__ns:=` moves it: the first rule that
//!   applies wins, the namespace rule is matched against the node's new name;
//! - any other rule is a name rule: `from` and `to` are expanded for the node (relative →
//!   under its namespace, `~` → under its full name) and the first rule whose `from` equals
//!   the expanded name replaces it.

use crate::ros::names;

/// One `[node:]from:=to` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    node: Option<String>,
    from: String,
    to: String,
}

impl Rule {
    fn parse(text: &str) -> Option<Self> {
        let (lhs, to) = text.split_once(":=")?;
        let (node, from) = match lhs.split_once(':') {
            Some((node, from)) => (Some(node.to_owned()), from),
            None => (None, lhs),
        };
        if from.is_empty() || to.is_empty() {
            return None;
        }
        Some(Self {
            node,
            from: from.to_owned(),
            to: to.to_owned(),
        })
    }

    fn applies_to(&self, node_name: &str) -> bool {
        self.node.as_deref().is_none_or(|n| n == node_name)
    }
}

/// The remapping rules of a command line, in the order given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RemapRules(Vec<Rule>);

impl RemapRules {
    /// The rules among the ROS arguments of `args` (those after `--ros-args`, up to `--`).
    pub(crate) fn from_args<S: AsRef<str>>(args: impl IntoIterator<Item = S>) -> Self {
        let mut rules = Vec::new();
        let mut in_ros = false;
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            match arg.as_ref() {
                "--ros-args" => in_ros = true,
                "--" => in_ros = false,
                "-r" | "--remap" if in_ros => {
                    let Some(rule) = args.next() else { break };
                    rules.extend(Rule::parse(rule.as_ref()));
                }
                _ => {}
            }
        }
        Self(rules)
    }

    /// The first special rule `key` (`__node`, `__ns`) that applies to `node_name`.
    fn special(&self, keys: &[&str], node_name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|r| keys.contains(&r.from.as_str()) && r.applies_to(node_name))
            .map(|r| r.to.as_str())
    }

    /// The node's name: `name` as the code creates it, renamed by `__node:=`.
    pub(crate) fn node_name(&self, name: &str) -> String {
        self.special(&["__node", "__name"], name)
            .unwrap_or(name)
            .to_owned()
    }

    /// The node's namespace: `namespace` as the code creates it, moved by `__ns:=` (matched
    /// against the node's name after renaming, as rcl does).
    pub(crate) fn namespace(&self, node_name: &str, namespace: &str) -> String {
        self.special(&["__ns"], node_name)
            .unwrap_or(namespace)
            .to_owned()
    }

    /// `name` as rcl resolves it for the node `node_name` in `namespace` (both as rcl
    /// reports them, after renaming): expanded, then replaced by the first name rule whose
    /// expanded `from` equals it (the replacement expanded too).
    pub(crate) fn resolve(&self, name: &str, namespace: &str, node_name: &str) -> String {
        let expanded = names::expand(name, namespace, node_name);
        self.0
            .iter()
            .filter(|r| !r.from.starts_with("__") && r.applies_to(node_name))
            .find(|r| names::expand(&r.from, namespace, node_name) == expanded)
            .map(|r| names::expand(&r.to, namespace, node_name))
            .unwrap_or(expanded)
    }
}

/// The node's own names as rcl reports them (after renaming), and the rules its entities'
/// names go through.
#[derive(Debug, Clone)]
pub(crate) struct NodeNames {
    pub name: String,
    pub namespace: String,
    /// `/r2/vlm_front`: what `/diagnostics` names the node by.
    pub full_name: String,
    pub rules: RemapRules,
}

impl NodeNames {
    /// The name rcl gives an entity of this node called `name` ([`RemapRules::resolve`]).
    pub(crate) fn resolve(&self, name: &str) -> String {
        self.rules.resolve(name, &self.namespace, &self.name)
    }
}

/// The rcutils logger of a node (`vlm_node`, `r2.vlm_front` for `/r2/vlm_front`), the name
/// `--log-level NAME:=LEVEL` and `/rosout` use.
pub(crate) fn logger_name(namespace: &str, node_name: &str) -> String {
    let ns = namespace.trim_matches('/');
    if ns.is_empty() {
        node_name.to_owned()
    } else {
        format!("{}.{node_name}", ns.replace('/', "."))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(args: &[&str]) -> RemapRules {
        RemapRules::from_args(args.iter().copied())
    }

    #[test]
    fn node_name_and_namespace() {
        let r = rules(&[
            "x",
            "--ros-args",
            "-r",
            "__node:=vlm_front",
            "-r",
            "__ns:=/r2",
        ]);
        assert_eq!(r.node_name("vlm_node"), "vlm_front");
        assert_eq!(r.namespace("vlm_front", "/"), "/r2");
        assert_eq!(logger_name("/r2", "vlm_front"), "r2.vlm_front");
        assert_eq!(logger_name("/a/b/", "n"), "a.b.n");
        assert_eq!(logger_name("/", "vlm_node"), "vlm_node");
        // The first applicable rule wins; a rule for another node does not apply.
        let r = rules(&[
            "x",
            "--ros-args",
            "-r",
            "other:__node:=no",
            "--remap",
            "__name:=first",
            "-r",
            "__node:=second",
            "-r",
            "vlm_node:__ns:=/old_name",
            "-r",
            "first:__ns:=/new_name",
        ]);
        assert_eq!(r.node_name("vlm_node"), "first");
        assert_eq!(r.namespace("first", "/"), "/new_name");
        // No rule, or rules outside --ros-args: the names as created.
        for r in [
            rules(&["x"]),
            rules(&["x", "-r", "__node:=a"]),
            rules(&["x", "--ros-args", "--", "-r", "__node:=a"]),
            rules(&["x", "--ros-args", "-r"]),
            rules(&["x", "--ros-args", "-r", "__node"]),
        ] {
            assert_eq!(r.node_name("vlm_node"), "vlm_node");
            assert_eq!(r.namespace("vlm_node", "/"), "/");
        }
    }

    #[test]
    fn topic_rules_match_the_expanded_name() {
        let r = rules(&["x", "--ros-args", "-r", "image_raw:=/my_cam/image"]);
        assert_eq!(r.resolve("image_raw", "/", "vlm_node"), "/my_cam/image");
        assert_eq!(r.resolve("/image_raw", "/", "vlm_node"), "/my_cam/image");
        assert_eq!(r.resolve("image", "/", "vlm_node"), "/image");
        // Under a namespace the relative rule matches the namespaced name, not /image_raw.
        assert_eq!(r.resolve("image_raw", "/r2", "n"), "/my_cam/image");
        assert_eq!(r.resolve("/image_raw", "/r2", "n"), "/image_raw");
        // A relative replacement lands in the node's namespace; `~` under the node.
        let r = rules(&[
            "x",
            "--ros-args",
            "-r",
            "/cam:=front/image",
            "-r",
            "cam2:=~/image",
            "-r",
            "other:/cam3:=/nope",
        ]);
        assert_eq!(r.resolve("/cam", "/r2", "n"), "/r2/front/image");
        assert_eq!(r.resolve("cam2", "/r2", "n"), "/r2/n/image");
        assert_eq!(r.resolve("/cam3", "/r2", "n"), "/cam3");
        // Special rules are not name rules; the first matching rule wins.
        let r = rules(&[
            "x",
            "--ros-args",
            "-r",
            "__ns:=/x",
            "-r",
            "a:=/first",
            "-r",
            "/a:=/second",
        ]);
        assert_eq!(r.resolve("__ns", "/", "n"), "/__ns");
        assert_eq!(r.resolve("a", "/", "n"), "/first");
    }
}
