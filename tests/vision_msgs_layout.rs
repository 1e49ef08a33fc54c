//! The vision_msgs stand-in (`tools/vision_msgs`, built by `tools/ros2-bootstrap.sh` because
//! the PyPI wheels lack vision_msgs) must have the field layout of the vision_msgs ROS 2
//! Humble ships, recorded in `tools/vision_msgs/upstream-4.1.1.txt`: checked on the stand-in's
//! sources, on the vision_msgs found on `AMENT_PREFIX_PATH` (the stand-in here, the
//! distribution's package on the board) and on the types r2r generates from it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Message name -> its fields in declaration order, as (name, fully qualified type).
type Layout = BTreeMap<String, Vec<(String, String)>>;

const PRIMITIVES: &[&str] = &[
    "bool", "byte", "char", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32",
    "uint32", "int64", "uint64", "string", "wstring",
];

fn stand_in() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/vision_msgs")
}

fn recorded() -> Layout {
    let text = std::fs::read_to_string(stand_in().join("upstream-4.1.1.txt")).unwrap();
    let mut layout = Layout::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let parts: Vec<_> = line.split_whitespace().collect();
        assert_eq!(parts.len(), 3, "MESSAGE FIELD TYPE: {line}");
        layout
            .entry(parts[0].to_owned())
            .or_default()
            .push((parts[1].to_owned(), parts[2].to_owned()));
    }
    assert!(layout.len() >= 7, "parsed too little: {layout:?}");
    layout
}

/// `Pose2D` and `vision_msgs/Pose2D` are the same type inside vision_msgs.
fn qualified(ty: &str) -> String {
    let base = ty.split('[').next().unwrap();
    if base.contains('/') || PRIMITIVES.contains(&base) {
        ty.to_owned()
    } else {
        format!("vision_msgs/{ty}")
    }
}

/// The fields of a .msg file: comments, blank lines and constants left out.
fn msg_fields(path: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .filter(|l| !l.is_empty() && !l.contains('='))
        .map(|l| {
            let parts: Vec<_> = l.split_whitespace().collect();
            (parts[1].to_owned(), qualified(parts[0]))
        })
        .collect()
}

#[test]
fn stand_in_sources_have_the_recorded_layout() {
    let record = recorded();
    let mut files: Vec<_> = std::fs::read_dir(stand_in().join("msg"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    let mut want: Vec<_> = record.keys().map(|m| format!("{m}.msg")).collect();
    want.sort();
    assert_eq!(
        files, want,
        "tools/vision_msgs/msg holds the recorded messages only"
    );
    for (message, fields) in &record {
        let path = stand_in().join(format!("msg/{message}.msg"));
        assert_eq!(&msg_fields(&path), fields, "{message}");
    }
    let cmake = std::fs::read_to_string(stand_in().join("CMakeLists.txt")).unwrap();
    for message in record.keys() {
        assert!(
            cmake.contains(&format!("\"msg/{message}.msg\"")),
            "{message} not built"
        );
    }
    assert!(
        stand_in().join("COLCON_IGNORE").exists(),
        "the board's colcon build must not see the stand-in"
    );
}

/// The share directory of the first vision_msgs on AMENT_PREFIX_PATH, as ament's index
/// finds it.
fn installed_share() -> PathBuf {
    let prefixes = std::env::var("AMENT_PREFIX_PATH").expect("source .ros2/setup.bash first");
    prefixes
        .split(':')
        .map(Path::new)
        .find(|p| {
            p.join("share/ament_index/resource_index/packages/vision_msgs")
                .exists()
        })
        .map(|p| p.join("share/vision_msgs"))
        .unwrap_or_else(|| panic!("no vision_msgs on AMENT_PREFIX_PATH={prefixes}"))
}

#[test]
fn installed_vision_msgs_has_the_recorded_layout() {
    let share = installed_share();
    for (message, fields) in &recorded() {
        let path = share.join(format!("msg/{message}.msg"));
        assert_eq!(&msg_fields(&path), fields, "{}", path.display());
    }
}

/// Top-level field names of a default-built message, in declaration order (r2r turns on
/// serde_json's `preserve_order`), with the JSON kind each type must serialise to.
fn generated(message: Value) -> Vec<(String, &'static str)> {
    let Value::Object(map) = message else {
        panic!("not a struct: {message}")
    };
    map.into_iter()
        .map(|(name, v)| {
            let kind = match v {
                Value::String(_) => "string",
                Value::Number(_) => "number",
                Value::Array(_) => "array",
                Value::Object(_) => "struct",
                other => panic!("{name}: unexpected {other}"),
            };
            (name, kind)
        })
        .collect()
}

fn kind(ty: &str) -> &'static str {
    if ty.ends_with(']') {
        "array"
    } else if ty == "string" {
        "string"
    } else if PRIMITIVES.contains(&ty) {
        "number"
    } else {
        "struct"
    }
}

#[test]
fn generated_bindings_have_the_recorded_layout() {
    use r2r::vision_msgs::msg;
    let to = |v: Result<Value, serde_json::Error>| generated(v.unwrap());
    let bindings: BTreeMap<&str, Vec<(String, &str)>> = [
        (
            "Detection2DArray",
            to(serde_json::to_value(msg::Detection2DArray::default())),
        ),
        (
            "Detection2D",
            to(serde_json::to_value(msg::Detection2D::default())),
        ),
        (
            "BoundingBox2D",
            to(serde_json::to_value(msg::BoundingBox2D::default())),
        ),
        ("Pose2D", to(serde_json::to_value(msg::Pose2D::default()))),
        ("Point2D", to(serde_json::to_value(msg::Point2D::default()))),
        (
            "ObjectHypothesisWithPose",
            to(serde_json::to_value(
                msg::ObjectHypothesisWithPose::default(),
            )),
        ),
        (
            "ObjectHypothesis",
            to(serde_json::to_value(msg::ObjectHypothesis::default())),
        ),
    ]
    .into_iter()
    .collect();
    let record = recorded();
    assert_eq!(
        bindings.keys().copied().collect::<Vec<_>>(),
        record.keys().map(String::as_str).collect::<Vec<_>>()
    );
    for (message, fields) in &record {
        let want: Vec<_> = fields.iter().map(|(n, t)| (n.clone(), kind(t))).collect();
        assert_eq!(bindings[message.as_str()], want, "{message}");
    }
    // Humble's 4.x layout (BoundingBox2D.center a Pose2D with a position), not 3.x's
    // geometry_msgs/Pose2D with x, y, theta.
    let mut bbox = msg::BoundingBox2D::default();
    bbox.center.position.x = 1.5;
    bbox.center.theta = 0.25;
    assert_eq!(bbox.center.position.x, 1.5);
}
