//! `vlm bench --host-overhead` on a sim package: per-token host time and the decode-state
//! copies an ask may wait for (snapshot, into a kept snapshot's memory, restore), of a
//! priming-sized state.
#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn host_overhead_reports_the_state_copies() {
    let d = tempfile::tempdir().unwrap();
    vlm_testkit::sim_package("tiny-sym", d.path(), |o| o.cache_len = 64);
    let out = Command::new(env!("CARGO_BIN_EXE_vlm"))
        .args([
            "bench",
            "--host-overhead",
            "--repeats",
            "2",
            "--steps",
            "4",
            "--json",
        ])
        .arg(d.path())
        .env("BPU_SIM_TIMING", "off")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &j["state_copy"];
    // Half the 64-row window: the state measured is as long as the window allows.
    assert_eq!(s["rows"], 32, "{j}");
    assert!(s["bytes"].as_u64().unwrap() > 0, "{j}");
    for k in ["snapshot_ms", "snapshot_reusing_ms", "restore_ms"] {
        let v = s[k].as_f64().unwrap();
        assert!(v.is_finite() && v >= 0.0, "{k}: {j}");
    }
}
