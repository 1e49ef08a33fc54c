//! Priming that follows the scene (`scene_check`, on by default) over a real ROS 2 graph
//! (peer: `tests/peers/scene_peer.py`), on the embedded tiny model on the BPU simulator, with
//! a scripted 10 Hz camera whose every frame carries Gaussian noise of σ = 4/255:
//! - a static scene is primed once: 10 s of its noisy frames start no second priming and are
//!   no scene change;
//! - an ask on the unchanged scene is served from the priming (its older frame) with
//!   `scene_checked_stamp` the newest frame's, within 0.3 s of the ask;
//! - after the scene switches, an ask never gets the old scene's priming: its `image_stamp`
//!   is a frame of the new scene, sent after the switch;
//! - the new scene is primed once it held, and the next ask is served from that priming.
//!
//! Primings, hits and scene counters are read from `/diagnostics`, never from timings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::node_proc::{domain, ok, peer_env, start_demo_node};
use common::ros_env;
use common::scripted::{count, first_of, pair, pair_of, scene_of, secs};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primings_follow_the_scene_and_asks_never_get_an_old_scene() -> anyhow::Result<()> {
    ros_env();
    let d = domain();
    let env = peer_env(&d);
    let node = start_demo_node(
        &d,
        &[
            ("image_topics", "['/cam']"),
            ("default_camera", "/cam"),
            ("diagnostics_period_s", "0.05"),
            ("prefill_duty", "1.0"),
        ],
        &env,
    )?;
    let (rep, _log) = node
        .serve_peer(
            &d,
            "tests/peers/scene_peer.py",
            &[],
            Duration::from_secs(300),
        )
        .await?;

    // Static: no second priming, no scene change in 10 s of noisy frames.
    let (s0, s1) = (&rep["d_static_0"], &rep["d_static_1"]);
    for key in [
        "prefills_done",
        "prefills_stopped",
        "prefills_on_scene_change",
    ] {
        assert_eq!(count(s1, key), count(s0, key), "{key}: {s0} → {s1}");
    }
    assert_eq!(count(s1, "camera /cam scene_changes"), 0, "{s1}");

    // Same scene: served from the priming, checked against the newest frame.
    let u = &rep["U"];
    ok("U", u);
    let (used, checked) = (
        pair(&u["response"]["image_stamp"]),
        pair(&u["response"]["scene_checked_stamp"]),
    );
    assert_eq!(scene_of(&rep, used), "a");
    assert_eq!(scene_of(&rep, checked), "a");
    assert!(secs(used) < secs(checked), "an older primed frame: {u}");
    let lag = secs(pair_of(&rep["U_at"])) - secs(checked);
    assert!(
        (-0.05..=0.3).contains(&lag),
        "checked {lag} s before the ask"
    );
    assert_eq!(pair(&u["answer"]["scene_checked_stamp"]), checked);
    let (before, after) = (s1, &rep["d_U"]);
    for key in ["prefill_hits", "prefill_scene_same_asks"] {
        assert_eq!(count(after, key) - count(before, key), 1, "{key}: {after}");
    }

    // Switched: never the old scene's priming.
    let v = &rep["V"];
    ok("V", v);
    let used = pair(&v["response"]["image_stamp"]);
    assert_eq!(scene_of(&rep, used), "b", "{v}");
    assert!(secs(used) >= secs(first_of(&rep, "b")));
    assert_eq!(pair(&v["response"]["scene_checked_stamp"]), used);
    let (before, after) = (&rep["d_U"], &rep["d_V"]);
    assert_eq!(
        count(after, "prefill_scene_changed_asks") - count(before, "prefill_scene_changed_asks"),
        1,
        "{after}"
    );
    assert_eq!(count(after, "prefill_hits"), count(before, "prefill_hits"));
    assert!(count(after, "camera /cam scene_changes") >= 1, "{after}");

    // The new scene primed (by the change) and served.
    let w = &rep["W"];
    ok("W", w);
    assert_eq!(scene_of(&rep, pair(&w["response"]["image_stamp"])), "b");
    let (before, after) = (&rep["d_V"], &rep["d_W"]);
    assert_eq!(
        count(after, "prefill_hits") - count(before, "prefill_hits"),
        1
    );
    assert!(count(after, "prefills_on_scene_change") >= 1, "{after}");
    Ok(())
}
