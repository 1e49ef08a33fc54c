//! The Ask action (`msg/action/Ask.action`) carries exactly what the Ask service does: its
//! Goal has the fields of `Ask.Request`, its Result those of `Ask.Response` (same order,
//! types, defaults and constants), and its Feedback is one `bpu_vlm_msgs/Token`. Checked on
//! the IDL text and on the types r2r generates from it (field names and default values).
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
