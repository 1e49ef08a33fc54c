//! Reading the reports of the peers that drive a scripted camera (tests/peers/scene_peer.py,
//! watch_peer.py): stamps as `[sec, nanosec]`, the scene each sent frame showed (the report's
//! `sent`: `[[sec, nanosec], scene]` per frame) and diagnostics counters.

use serde_json::Value;

/// A `builtin_interfaces/Time` as the peers report it (`{"sec", "nanosec"}`).
pub fn pair(v: &Value) -> [i64; 2] {
    [v["sec"].as_i64().unwrap(), v["nanosec"].as_i64().unwrap()]
}

/// A stamp the peers record themselves (`[sec, nanosec]`).
pub fn pair_of(v: &Value) -> [i64; 2] {
    [v[0].as_i64().unwrap(), v[1].as_i64().unwrap()]
}

pub fn secs(s: [i64; 2]) -> f64 {
    s[0] as f64 + s[1] as f64 * 1e-9
}

/// The scene the camera showed in the frame stamped `stamp`.
pub fn scene_of(rep: &Value, stamp: [i64; 2]) -> String {
    rep["sent"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| pair_of(&s[0]) == stamp)
        .map(|s| s[1].as_str().unwrap().to_owned())
        .unwrap_or_else(|| panic!("{stamp:?} was never sent"))
}

/// The first frame of scene `key`.
pub fn first_of(rep: &Value, key: &str) -> [i64; 2] {
    let s = rep["sent"].as_array().unwrap();
    pair_of(&s.iter().find(|s| s[1] == key).unwrap()[0])
}

/// A diagnostics counter (the values are strings on the wire).
pub fn count(d: &Value, key: &str) -> i64 {
    d[key]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{key} missing: {d}"))
}
