//! The level of the node's stderr log (`tracing`): the ROS way first, so `ros2 run` and the
//! launch file's `log_level` reach it, not only rcutils.
//!
//! 1. `--ros-args --log-level vlm_node:=LEVEL` (the node's own logger: `r2.vlm_front` under
//!    `-r __node:=vlm_front -r __ns:=/r2`), else `--ros-args --log-level LEVEL` (the default
//!    level), as rcl reads them;
//! 2. else `RUST_LOG` (tracing directives, e.g. `bpu_vlm=debug,vlm=info`);
//! 3. else `info`.
//!
//! ROS levels map to tracing's: `debug`, `info`, `warn`, `error`; `fatal` = `error`.
//! `/rosout` has a level of its own, the parameter `rosout_level` ([`crate::ros::rosout`]).

use tracing_subscriber::EnvFilter;

use crate::ros::names::NODE_NAME;
use crate::ros::remap::{logger_name, RemapRules};

/// The tracing level of a ROS log level name (case-insensitive, as rcutils reads it).
fn tracing_level(ros: &str) -> Option<&'static str> {
    match ros.to_ascii_lowercase().as_str() {
        "debug" => Some("debug"),
        "info" => Some("info"),
        "warn" | "warning" => Some("warn"),
        "error" | "fatal" => Some("error"),
        _ => None,
    }
}

/// The level `--log-level` sets for `node_name` among the ROS arguments of `args` (those
/// after `--ros-args`, up to `--`): its logger's own level wins over the default level;
/// levels of other loggers (`rcl:=debug`) do not apply. The last one given wins, as in rcl.
pub(crate) fn ros_log_level<S: AsRef<str>>(
    args: impl IntoIterator<Item = S>,
    node_name: &str,
) -> Option<&'static str> {
    let mut in_ros = false;
    let mut default = None;
    let mut own = None;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        match arg.as_ref() {
            "--ros-args" => in_ros = true,
            "--" => in_ros = false,
            "--log-level" if in_ros => {
                let Some(value) = args.next() else { break };
                match value.as_ref().split_once(":=") {
                    Some((logger, level)) if logger == node_name => own = tracing_level(level),
                    Some(_) => {}
                    None => default = tracing_level(value.as_ref()),
                }
            }
            _ => {}
        }
    }
    own.or(default)
}

/// The node's logger as rcl will name it, from the renaming rules among `args`.
fn node_logger<S: AsRef<str>>(args: &[S]) -> String {
    let rules = RemapRules::from_args(args);
    let name = rules.node_name(NODE_NAME);
    logger_name(&rules.namespace(&name, "/"), &name)
}

/// The stderr filter of `vlm_node` (see the module documentation).
pub fn stderr_filter<S: AsRef<str>>(args: impl IntoIterator<Item = S>) -> EnvFilter {
    let args: Vec<S> = args.into_iter().collect();
    match ros_log_level(&args, &node_logger(&args)) {
        Some(level) => EnvFilter::new(level),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(args: &[&str]) -> Option<&'static str> {
        ros_log_level(args.iter().copied(), "vlm_node")
    }

    #[test]
    fn ros_log_level_forms() {
        assert_eq!(level(&["vlm_node"]), None);
        assert_eq!(level(&["vlm_node", "--ros-args", "-p", "a:=1"]), None);
        assert_eq!(
            level(&["vlm_node", "--ros-args", "--log-level", "debug"]),
            Some("debug")
        );
        assert_eq!(
            level(&["vlm_node", "--ros-args", "--log-level", "WARN"]),
            Some("warn")
        );
        assert_eq!(
            level(&["vlm_node", "--ros-args", "--log-level", "fatal"]),
            Some("error")
        );
        // The node's own logger wins over the default, in any order; others do not apply.
        assert_eq!(
            level(&[
                "x",
                "--ros-args",
                "--log-level",
                "vlm_node:=error",
                "--log-level",
                "debug"
            ]),
            Some("error")
        );
        assert_eq!(
            level(&["x", "--ros-args", "--log-level", "rcl:=debug"]),
            None
        );
        // Outside --ros-args (a user argument, or after `--`) it is not a ROS argument.
        assert_eq!(level(&["x", "--log-level", "debug"]), None);
        assert_eq!(
            level(&["x", "--ros-args", "--", "--log-level", "debug"]),
            None
        );
        // Several --ros-args blocks, as launch_ros writes them: the last value wins.
        assert_eq!(
            level(&[
                "x",
                "--ros-args",
                "--log-level",
                "info",
                "--ros-args",
                "-r",
                "__node:=vlm_node",
                "--log-level",
                "warn"
            ]),
            Some("warn")
        );
        assert_eq!(level(&["x", "--ros-args", "--log-level"]), None);
    }

    #[test]
    fn the_node_logger_follows_renaming() {
        assert_eq!(node_logger(&["x"]), "vlm_node");
        let renamed = [
            "x",
            "--ros-args",
            "-r",
            "__node:=vlm_front",
            "-r",
            "__ns:=/r2",
            "--log-level",
            "r2.vlm_front:=debug",
        ];
        assert_eq!(node_logger(&renamed), "r2.vlm_front");
        assert_eq!(
            ros_log_level(renamed, &node_logger(&renamed)),
            Some("debug")
        );
        assert_eq!(ros_log_level(renamed, "vlm_node"), None);
    }
}
