//! The Ask action (`msg/action/Ask.action`) carries exactly what the Ask service does: its
//! Goal has the fields of `Ask.Request`, its Result those of `Ask.Response` (same order,
//! types, defaults and constants), and its Feedback is one `bpu_vlm_msgs/Token`. The same
//! holds for Detect (its Feedback: the detections so far), whose fields shared with Ask are
//! spelled, typed and defaulted as Ask's. Checked on the IDL text and on the types r2r
//! generates from it (field names and default values).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bpu_vlm::msgs::action::Ask as AskAction;
use bpu_vlm::msgs::srv::Ask as AskService;
use serde_json::Value;

/// One IDL line without its comment, whitespace normalised: `type name [default]` or
/// `type NAME=value`.
fn idl_lines(section: &str) -> Vec<String> {
    section
        .lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .filter(|l| !l.is_empty())
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

fn sections(file: &str, n: usize) -> Vec<Vec<String>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let parts: Vec<_> = text.split("\n---\n").map(idl_lines).collect();
    assert_eq!(parts.len(), n, "{file}: {n} sections separated by ---");
    parts
}

#[test]
fn action_goal_and_result_are_the_service_request_and_response() {
    let srv = sections("msg/srv/Ask.srv", 2);
    let action = sections("msg/action/Ask.action", 3);
    assert!(
        srv[0].len() > 10 && srv[1].len() > 10,
        "parsed too little: {srv:?}"
    );
    assert_eq!(action[0], srv[0], "Goal must be Ask.srv's request");
    assert_eq!(action[1], srv[1], "Result must be Ask.srv's response");
    assert_eq!(action[2], vec!["bpu_vlm_msgs/Token token".to_owned()]);
}

/// Field names and default values of a generated message (a default-built one as JSON; in
/// declaration order, as r2r turns on serde_json's `preserve_order`).
fn fields(message: Result<Value, serde_json::Error>) -> Vec<(String, Value)> {
    match message.unwrap() {
        Value::Object(map) => map.into_iter().collect(),
        other => panic!("not a struct: {other}"),
    }
}

#[test]
fn generated_action_types_match_the_service_types() {
    let goal = fields(serde_json::to_value(AskAction::Goal::default()));
    assert_eq!(
        goal,
        fields(serde_json::to_value(AskService::Request::default()))
    );
    assert!(goal
        .iter()
        .any(|(n, v)| n == "temperature" && v.as_f64() == Some(-1.0)));
    assert_eq!(
        fields(serde_json::to_value(AskAction::Result::default())),
        fields(serde_json::to_value(AskService::Response::default()))
    );
    let feedback = AskAction::Feedback::default();
    assert_eq!(feedback.token, bpu_vlm::msgs::msg::Token::default());
}

/// A field or constant's name in an IDL line (`type name [default]` or `type NAME=value`).
fn idl_name(line: &str) -> &str {
    let rest = line.split_whitespace().nth(1).unwrap();
    rest.split('=').next().unwrap()
}

#[test]
fn detect_action_is_the_detect_service_and_shares_asks_spelling() {
    let srv = sections("msg/srv/Detect.srv", 2);
    let action = sections("msg/action/Detect.action", 3);
    assert!(
        srv[0].len() >= 9 && srv[1].len() > 10,
        "parsed too little: {srv:?}"
    );
    assert_eq!(action[0], srv[0], "Goal must be Detect.srv's request");
    assert_eq!(action[1], srv[1], "Result must be Detect.srv's response");
    assert_eq!(
        action[2],
        vec!["vision_msgs/Detection2DArray detections".to_owned()]
    );
    // Every field and constant the two services share is spelled, typed and defaulted as
    // Ask's, so a client handles both the same way.
    let ask = sections("msg/srv/Ask.srv", 2);
    for (detect, ask) in srv.iter().zip(&ask) {
        let mut shared = 0;
        for line in detect {
            if let Some(same) = ask.iter().find(|a| idl_name(a) == idl_name(line)) {
                assert_eq!(line, same, "differs from Ask.srv");
                shared += 1;
            }
        }
        assert!(shared >= 6, "too few fields shared with Ask: {detect:?}");
    }
    for want in [
        "string query",
        "uint32 max_objects 16",
        "bool points false",
        "vision_msgs/Detection2DArray detections",
        "string text",
    ] {
        assert!(
            srv.iter().flatten().any(|l| l == want),
            "Detect.srv lacks {want}"
        );
    }
}

#[test]
fn generated_detect_types_match() {
    use bpu_vlm::msgs::action::Detect as DetectAction;
    use bpu_vlm::msgs::srv::Detect as DetectService;
    let goal = fields(serde_json::to_value(DetectAction::Goal::default()));
    assert_eq!(
        goal,
        fields(serde_json::to_value(DetectService::Request::default()))
    );
    assert!(goal
        .iter()
        .any(|(n, v)| n == "max_objects" && v.as_u64() == Some(16)));
    assert_eq!(
        fields(serde_json::to_value(DetectAction::Result::default())),
        fields(serde_json::to_value(DetectService::Response::default()))
    );
    let feedback = DetectAction::Feedback::default();
    assert_eq!(
        feedback.detections,
        r2r::vision_msgs::msg::Detection2DArray::default()
    );
    assert_eq!(
        DetectService::Response::ERROR_BUSY,
        AskService::Response::ERROR_BUSY
    );
}
