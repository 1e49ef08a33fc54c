//! A grounding answer's text → its objects, whole ([`parse`]) or as the text streams in
//! ([`ObjectScanner`]), with the byte span of each label for its score.

use std::ops::Range;

use serde_json::{Map, Value};

use super::{GroundingError, Kind};

/// One object of the answer, as the model wrote it.
#[derive(Debug, Clone, PartialEq)]
pub struct RawObject {
    /// Position in the answer's array (0-based).
    pub index: usize,
    pub kind: Kind,
    /// The relative coordinates as written (0–1000 under the schema; free text may go
    /// beyond, which the pixel mapping clamps).
    pub coords: Vec<f64>,
    pub label: String,
    /// Bytes of the object (`{` … `}`) in the answer's text.
    pub span: Range<usize>,
    /// Bytes of the label's characters (inside its quotes) in the answer's text.
    pub label_span: Range<usize>,
}

/// Finds the objects of a JSON array as its text arrives: each object is yielded once its
/// closing brace is seen, so a front end can publish it before the answer ends.
#[derive(Debug, Clone)]
pub struct ObjectScanner {
    kind: Kind,
    text: String,
    /// Bytes of `text` already scanned.
    pos: usize,
    depth: usize,
    in_string: bool,
    escaped: bool,
    start: Option<usize>,
    index: usize,
}

impl ObjectScanner {
    pub fn new(kind: Kind) -> Self {
        Self {
            kind,
            text: String::new(),
            pos: 0,
            depth: 0,
            in_string: false,
            escaped: false,
            start: None,
            index: 0,
        }
    }

    /// The text pushed so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Takes the next piece of the answer's text; returns the objects it completed, in
    /// order. An element that is not an object of this kind (never under the schema) is
    /// skipped but keeps its index.
    pub fn push(&mut self, chunk: &str) -> Vec<RawObject> {
        self.push_checked(chunk)
            .into_iter()
            .filter_map(|r| {
                r.map_err(|e| tracing::debug!(error = %e, "a grounding element was skipped"))
                    .ok()
            })
            .collect()
    }

    fn push_checked(&mut self, chunk: &str) -> Vec<Result<RawObject, String>> {
        self.text.push_str(chunk);
        let mut out = Vec::new();
        let bytes = self.text.as_bytes();
        while self.pos < bytes.len() {
            let b = bytes[self.pos];
            let at = self.pos;
            self.pos += 1;
            if self.in_string {
                match (self.escaped, b) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'[' | b'{' => {
                    self.depth += 1;
                    if b == b'{' && self.depth == 2 {
                        self.start = Some(at);
                    }
                }
                b']' | b'}' => {
                    if b == b'}' && self.depth == 2 {
                        if let Some(start) = self.start.take() {
                            out.push(object(&self.text, start..at + 1, self.kind, self.index));
                            self.index += 1;
                        }
                    }
                    self.depth = self.depth.saturating_sub(1);
                }
                _ => {}
            }
        }
        out
    }
}

/// The object at `span` of `text`.
fn object(text: &str, span: Range<usize>, kind: Kind, index: usize) -> Result<RawObject, String> {
    let slice = &text[span.clone()];
    let map: Map<String, Value> = serde_json::from_str(slice).map_err(|e| e.to_string())?;
    let coords = map
        .get(kind.key())
        .and_then(Value::as_array)
        .ok_or_else(|| format!("element {index} has no `{}` array", kind.key()))?;
    let coords: Vec<f64> = coords.iter().filter_map(Value::as_f64).collect();
    if coords.len() != kind.arity() {
        return Err(format!(
            "element {index}: `{}` needs {} numbers",
            kind.key(),
            kind.arity()
        ));
    }
    let label = map
        .get("label")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("element {index} has no string `label`"))?
        .to_owned();
    let inner = label_span(slice).ok_or_else(|| format!("element {index}: label not found"))?;
    Ok(RawObject {
        index,
        kind,
        coords,
        label,
        span: span.clone(),
        label_span: span.start + inner.start..span.start + inner.end,
    })
}

/// Bytes of the `label` value's characters in one object's text: the first `"label"` that is
/// followed by `:` and a string (a label's value comes after its key, so a value that reads
/// "label" is never taken for the key).
fn label_span(obj: &str) -> Option<Range<usize>> {
    let b = obj.as_bytes();
    let skip_ws = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    let mut from = 0;
    while let Some(k) = obj[from..].find("\"label\"") {
        let key_end = from + k + "\"label\"".len();
        from = from + k + 1;
        let colon = skip_ws(key_end);
        if b.get(colon) != Some(&b':') {
            continue;
        }
        let open = skip_ws(colon + 1);
        if b.get(open) != Some(&b'"') {
            continue;
        }
        let mut i = open + 1;
        while i < b.len() {
            match b[i] {
                b'\\' => i += 2,
                b'"' => return Some(open + 1..i),
                _ => i += 1,
            }
        }
        return None;
    }
    None
}

/// A complete answer → its objects. The text must be one JSON array (surrounding whitespace
/// aside) whose elements are objects of `kind`.
pub fn parse(text: &str, kind: Kind) -> Result<Vec<RawObject>, GroundingError> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| GroundingError::Parse(e.to_string()))?;
    let elements = value
        .as_array()
        .ok_or_else(|| GroundingError::Parse("not an array".into()))?
        .len();
    let mut scanner = ObjectScanner::new(kind);
    let objects = scanner
        .push_checked(text)
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(GroundingError::Parse)?;
    if objects.len() != elements {
        return Err(GroundingError::Parse(format!(
            "{} of {elements} elements are objects",
            objects.len()
        )));
    }
    Ok(objects)
}
