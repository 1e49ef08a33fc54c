//! The level of the node's stderr log (`tracing`): the ROS way first, so `ros2 run` and the
//! launch file's `log_level` reach it, not only rcutils.
//!
//! 1. `--ros-args --log-level vlm_node:=LEVEL` (the node's own logger), else
//!    `--ros-args --log-level LEVEL` (the default level), as rcl reads them;
//! 2. else `RUST_LOG` (tracing directives, e.g. `bpu_vlm=debug,vlm=info`);
//! 3. else `info`.
//!
//! ROS levels map to tracing's: `debug`, `info`, `warn`, `error`; `fatal` = `error`.
//! Warnings and errors also go to `/rosout` whatever this says ([`crate::ros::rosout`]).

use tracing_subscriber::EnvFilter;

use crate::ros::names::NODE_NAME;

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

/// The stderr filter of `vlm_node` (see the module documentation).
pub fn stderr_filter<S: AsRef<str>>(args: impl IntoIterator<Item = S>) -> EnvFilter {
    match ros_log_level(args, NODE_NAME) {
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
}
