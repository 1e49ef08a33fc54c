//! README.md's "Using the node" commands, run as a reader would type them against the real
//! node on the embedded demo model (peer: `tests/peers/readme_peer.py`, which reads them from
//! README.md): the `tools/vlm-ask.py` lines in bash, the `ros2 service call`/`ros2 action
//! send_goal`/`ros2 topic echo` lines carried out with rclpy from their parsed name, type and
//! YAML (the ros2 CLI is not on PyPI), and the Python example as its own process. A README
//! edit that names a wrong field, type, topic or flag fails here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::node_proc::{domain, start_demo_node};
use common::ros_env;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_commands_work_as_written() -> anyhow::Result<()> {
    ros_env();
    let d = domain();
    let node = start_demo_node(&d, &[], &[])?;
    let (rep, _log) = node
        .serve_peer(
            &d,
            "tests/peers/readme_peer.py",
            &[],
            Duration::from_secs(600),
        )
        .await?;
    let shell = &rep["shell"];
    assert_eq!(shell["status"], 0, "the README's vlm-ask.py lines: {shell}");
    assert!(shell["lines"].as_u64().unwrap() >= 5, "{shell}");
    let ros2 = rep["ros2"].as_array().unwrap();
    // Two asks, a cancel and an action goal in the README today; each answered.
    assert!(ros2.len() >= 4, "{rep}");
    for c in ros2 {
        let (line, out) = (&c["line"], &c["result"]);
        if line.as_str().unwrap().contains("bpu_vlm_msgs/srv/Ask") {
            assert_eq!(out["success"], true, "{line}: {out}");
        }
        if line.as_str().unwrap().contains("send_goal") {
            assert_eq!(out["success"], true, "{line}: {out}");
            assert!(out["feedback"].as_u64().unwrap() > 0, "{line}: {out}");
        }
    }
    let echoed = rep["echoed"].as_object().unwrap();
    for topic in ["/vlm/tokens", "/vlm/answers", "/diagnostics"] {
        assert!(
            echoed[topic].as_u64().unwrap() > 0,
            "`ros2 topic echo {topic}` would have shown nothing: {rep}"
        );
    }
    let py = &rep["python"];
    assert_eq!(py["status"], 0, "the README's Python example: {py}");
    assert!(
        py["stdout"].as_str().unwrap().trim_end().ends_with("stop")
            || py["stdout"]
                .as_str()
                .unwrap()
                .trim_end()
                .ends_with("length"),
        "the example prints the finish reason last: {py}"
    );
    Ok(())
}
