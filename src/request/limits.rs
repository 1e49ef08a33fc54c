//! Bounds on what one Ask may carry, checked before any field is parsed, copied, scanned or
//! queued. A request is untrusted: without bounds one client could make the node hold
//! megabytes per queued request, parse a huge `tools_json`, compile a huge `json_schema`, or
//! rescan a huge stop string on every generated token. The counts and sizes are parameters
//! (`max_request_images`, `max_prompt_bytes`, `max_stop_strings`, `max_tools_json_bytes`,
//! `max_json_schema_bytes`); the per-string bounds below are fixed because nothing
//! legitimate comes near them.

use crate::interface::ErrorCode;
use crate::msgs::srv::Ask;
use crate::ros::params::Params;
use crate::serve::failure::Failure;

/// Longest stop string in UTF-8 bytes. The stop filter holds back text up to this length and
/// tests every held-back suffix against every stop string, so the per-token cost grows with
/// it (BENCHMARKS.md gives the cost at 16 strings of this length).
pub const MAX_STOP_STRING_BYTES: usize = 256;

/// Longest `request_id` and `session_id` in bytes: the id goes out in every Token of the
/// answer, and a session id stays in memory as long as its conversation.
pub const MAX_ID_BYTES: usize = 256;

fn over(what: &str, len: usize, unit: &str, max: usize, param: Option<&str>) -> Failure {
    let source = match param {
        Some(p) => format!(" (parameter {p})"),
        None => String::new(),
    };
    Failure::new(
        ErrorCode::InvalidRequest,
        format!("{what} is {len} {unit}, above the limit of {max}{source}"),
    )
}

/// Refuses a request any of whose fields is over its bound, naming the field, the limit and
/// the parameter that sets it.
pub(crate) fn check_sizes(req: &Ask::Request, p: &Params) -> Result<(), Failure> {
    let images = req.images.len().saturating_add(req.compressed_images.len());
    if images > p.max_request_images {
        return Err(over(
            "images + compressed_images",
            images,
            "images",
            p.max_request_images,
            Some("max_request_images"),
        ));
    }
    for (field, text) in [
        ("prompt", &req.prompt),
        ("system_prompt", &req.system_prompt),
    ] {
        if text.len() > p.max_prompt_bytes {
            return Err(over(
                field,
                text.len(),
                "bytes",
                p.max_prompt_bytes,
                Some("max_prompt_bytes"),
            ));
        }
    }
    if req.stop.len() > p.max_stop_strings {
        return Err(over(
            "stop",
            req.stop.len(),
            "strings",
            p.max_stop_strings,
            Some("max_stop_strings"),
        ));
    }
    if let Some((i, s)) = req
        .stop
        .iter()
        .enumerate()
        .find(|(_, s)| s.len() > MAX_STOP_STRING_BYTES)
    {
        return Err(over(
            &format!("stop[{i}]"),
            s.len(),
            "bytes",
            MAX_STOP_STRING_BYTES,
            None,
        ));
    }
    if req.tools_json.len() > p.max_tools_json_bytes {
        return Err(over(
            "tools_json",
            req.tools_json.len(),
            "bytes",
            p.max_tools_json_bytes,
            Some("max_tools_json_bytes"),
        ));
    }
    if req.json_schema.len() > p.max_json_schema_bytes {
        return Err(over(
            "json_schema",
            req.json_schema.len(),
            "bytes",
            p.max_json_schema_bytes,
            Some("max_json_schema_bytes"),
        ));
    }
    for (field, id) in [
        ("request_id", &req.request_id),
        ("session_id", &req.session_id),
    ] {
        if id.len() > MAX_ID_BYTES {
            return Err(over(field, id.len(), "bytes", MAX_ID_BYTES, None));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// A request whose field under test has the given size.
    type Make = Box<dyn Fn(usize) -> Ask::Request>;

    fn params() -> Params {
        Params::from_values(&HashMap::new()).expect("defaults are valid")
    }

    fn message(req: &Ask::Request) -> Option<String> {
        check_sizes(req, &params()).err().map(|f| {
            assert_eq!(f.code, ErrorCode::InvalidRequest);
            f.message
        })
    }

    /// Each bound at its default: the value at the limit passes, one more is refused with a
    /// message naming the field, the limit and its parameter.
    #[test]
    fn each_bound_passes_at_the_limit_and_refuses_one_more() {
        let p = params();
        let cases: Vec<(&str, Make, usize)> = vec![
            (
                "max_request_images",
                Box::new(|n| Ask::Request {
                    images: vec![Default::default(); n - n / 2],
                    compressed_images: vec![Default::default(); n / 2],
                    ..Default::default()
                }),
                p.max_request_images,
            ),
            (
                "max_prompt_bytes",
                Box::new(|n| Ask::Request {
                    prompt: "é".repeat(n / 2) + &"a".repeat(n % 2),
                    ..Default::default()
                }),
                p.max_prompt_bytes,
            ),
            (
                "max_prompt_bytes",
                Box::new(|n| Ask::Request {
                    system_prompt: "s".repeat(n),
                    ..Default::default()
                }),
                p.max_prompt_bytes,
            ),
            (
                "max_stop_strings",
                Box::new(|n| Ask::Request {
                    stop: vec!["x".into(); n],
                    ..Default::default()
                }),
                p.max_stop_strings,
            ),
            (
                "256",
                Box::new(|n| Ask::Request {
                    stop: vec!["ok".into(), "s".repeat(n)],
                    ..Default::default()
                }),
                MAX_STOP_STRING_BYTES,
            ),
            (
                "max_tools_json_bytes",
                Box::new(|n| Ask::Request {
                    tools_json: " ".repeat(n),
                    ..Default::default()
                }),
                p.max_tools_json_bytes,
            ),
            (
                "max_json_schema_bytes",
                Box::new(|n| Ask::Request {
                    json_schema: " ".repeat(n),
                    ..Default::default()
                }),
                p.max_json_schema_bytes,
            ),
            (
                "request_id",
                Box::new(|n| Ask::Request {
                    request_id: "r".repeat(n),
                    ..Default::default()
                }),
                MAX_ID_BYTES,
            ),
            (
                "session_id",
                Box::new(|n| Ask::Request {
                    session_id: "s".repeat(n),
                    ..Default::default()
                }),
                MAX_ID_BYTES,
            ),
        ];
        for (name, make, limit) in cases {
            assert_eq!(message(&make(limit)), None, "{name} at its limit {limit}");
            let m = message(&make(limit + 1)).unwrap_or_else(|| panic!("{name}: not refused"));
            assert!(m.contains(name), "{name}: {m}");
            assert!(m.contains(&limit.to_string()), "{name}: {m}");
        }
    }

    #[test]
    fn limits_follow_the_parameters() {
        let mut p = params();
        p.max_request_images = 0;
        let one = Ask::Request {
            images: vec![Default::default()],
            ..Default::default()
        };
        assert!(check_sizes(&one, &p).is_err());
        p.max_request_images = 1;
        assert!(check_sizes(&one, &p).is_ok());
    }
}
