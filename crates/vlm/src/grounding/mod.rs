//! "Where is it?": open-vocabulary detection with Qwen3.5's native grounding format.
//!
//! Asked to locate things, Qwen3.5 (as Qwen3-VL) answers a JSON array such as
//! `[{"bbox_2d":[x1,y1,x2,y2],"label":"cup"}]` — or `{"point_2d":[x,y],"label":…}` for points
//! — with coordinates **relative to the image it saw, 0–1000, x before y** (Qwen2.5-VL used
//! absolute pixels of the resized input instead; not this model). This module is everything
//! below a front end:
//!
//! - [`DetectSpec`]: the query, `max_objects` and boxes or points → the prompt
//!   ([`DetectSpec::prompt`]), the JSON schema that constrains the answer
//!   ([`DetectSpec::schema_text`], compiled by [`crate::structured`]), the token budget that
//!   always holds a complete answer ([`DetectSpec::token_budget`], [`fit_budget`]) and the
//!   [`Turn`] that asks it ([`DetectSpec::turn`]).
//! - [`parse`] / [`ObjectScanner`]: the answer's text → [`RawObject`]s (the scanner yields each
//!   object as soon as its JSON object closes, for streamed feedback).
//! - [`to_pixels`] / [`detections`]: the 0–1000 numbers → pixels of the **original frame**
//!   (clamped, reversed corners swapped, empty boxes dropped) as plain [`Detection`]s, each
//!   with a [`score`](Detection::score) from the model's token probabilities
//!   ([`TokenScores`]).
//!
//! Nothing here knows ROS; the node maps a [`Detection`] onto `vision_msgs/Detection2D`.
#![forbid(unsafe_code)]

mod parse;
mod score;

pub use parse::{parse, ObjectScanner, RawObject};
pub use score::{label_score, LiveScores, TokenScores};

use std::sync::Arc;

use serde_json::json;

use crate::assistant::{Reply, Turn};
use crate::engine::ImageInput;
use crate::structured::{JsonSchema, JsonSchemas, SchemaError};

/// `max_objects` when a request leaves it at 0.
pub const DEFAULT_MAX_OBJECTS: usize = 16;
/// The most objects one answer may hold (the schema's `maxItems`; the budget grows with it).
pub const MAX_OBJECTS_LIMIT: usize = 256;
/// What a label may be: short, plain words (no quotes or escapes, so its bytes are its text).
pub const LABEL_PATTERN: &str = "^[A-Za-z0-9 _-]{1,24}$";
/// Longest label [`LABEL_PATTERN`] admits.
pub const LABEL_MAX: usize = 24;
/// Coordinates are relative to the image the tower saw, `0..=SCALE` on each axis.
pub const SCALE: u32 = 1000;

/// Why a detect request or its answer is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GroundingError {
    #[error("the query is empty")]
    EmptyQuery,
    #[error("max_objects must be between 1 and {MAX_OBJECTS_LIMIT}, not {0}")]
    MaxObjects(usize),
    /// The answer's budget does not fit the context window after the prompt.
    #[error("the answer for {max_objects} objects needs up to {budget} tokens after a prompt of {rows} rows, but the context window holds {context}; ask for fewer objects")]
    DoesNotFit {
        max_objects: usize,
        budget: usize,
        rows: usize,
        context: usize,
    },
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// The text is not a complete grounding answer (a cut answer, or free text).
    #[error("the answer is not a grounding array: {0}")]
    Parse(String),
}

/// Boxes (`bbox_2d`) or points (`point_2d`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Boxes,
    Points,
}

impl Kind {
    /// The JSON key of the coordinates.
    pub fn key(self) -> &'static str {
        match self {
            Self::Boxes => "bbox_2d",
            Self::Points => "point_2d",
        }
    }

    /// Numbers per object: x1, y1, x2, y2 or x, y.
    pub fn arity(self) -> usize {
        match self {
            Self::Boxes => 4,
            Self::Points => 2,
        }
    }
}

/// What to find.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetectSpec {
    /// "cups", "the red cup", "people and doors".
    pub query: String,
    pub max_objects: usize,
    pub kind: Kind,
}

impl DetectSpec {
    /// Checks the request: a query with text, `max_objects` 1..=[`MAX_OBJECTS_LIMIT`] (0
    /// means [`DEFAULT_MAX_OBJECTS`]).
    pub fn new(query: &str, max_objects: usize, points: bool) -> Result<Self, GroundingError> {
        let query = query.trim();
        if query.is_empty() {
            return Err(GroundingError::EmptyQuery);
        }
        let max_objects = if max_objects == 0 {
            DEFAULT_MAX_OBJECTS
        } else {
            max_objects
        };
        if max_objects > MAX_OBJECTS_LIMIT {
            return Err(GroundingError::MaxObjects(max_objects));
        }
        let kind = if points { Kind::Points } else { Kind::Boxes };
        Ok(Self {
            query: query.to_owned(),
            max_objects,
            kind,
        })
    }

    /// The user text: Qwen3.5's grounding request, naming the format it was trained on.
    pub fn prompt(&self) -> String {
        let (what, example) = match self.kind {
            Kind::Boxes => (
                "bbox coordinates",
                r#"[{"bbox_2d": [x1, y1, x2, y2], "label": "name"}]"#,
            ),
            Kind::Points => (
                "point coordinates",
                r#"[{"point_2d": [x, y], "label": "name"}]"#,
            ),
        };
        format!(
            "Locate every instance of the following in the image: {}. Report the {what} in \
             JSON format as {example}, with coordinates relative to the image from 0 to \
             {SCALE}, at most {} objects. Answer [] if there is none.",
            self.query, self.max_objects
        )
    }

    /// The JSON schema of an answer: an array of at most `max_objects` objects, each with its
    /// integer coordinates in `0..=1000` and a label matching [`LABEL_PATTERN`], nothing else.
    pub fn schema_text(&self) -> String {
        let n = self.kind.arity();
        let key = self.kind.key();
        // Written out rather than built as a map: the grammar keeps the properties' order,
        // and the coordinates come first in the format the model was trained on, whether or
        // not serde_json's `preserve_order` is on in the build.
        format!(
            r#"{{"type":"array","maxItems":{max},"items":{{"type":"object","properties":{{"{key}":{{"type":"array","items":{{"type":"integer","minimum":0,"maximum":{SCALE}}},"minItems":{n},"maxItems":{n}}},"label":{{"type":"string","pattern":"{pat}"}}}},"required":["{key}","label"],"additionalProperties":false}}}}"#,
            max = self.max_objects,
            pat = LABEL_PATTERN,
        )
    }

    /// Tokens that always hold a complete answer: every token the schema admits carries at
    /// least one byte (the token table never allows an empty one), the output is compact,
    /// and the longest answer is `max_objects` of the longest object (4-digit numbers, a
    /// 24-character label), the separators, the brackets — plus one for the end.
    pub fn token_budget(&self) -> usize {
        let label = "x".repeat(LABEL_MAX);
        let numbers = vec![SCALE; self.kind.arity()];
        let numbers = json!(numbers).to_string();
        let object = format!(r#"{{"{}":{numbers},"label":"{label}"}}"#, self.kind.key());
        // `[` `]`, the objects, a `,` between two, the end token.
        let n = self.max_objects;
        2 + n * object.len() + n.saturating_sub(1) + 1
    }

    /// Compiles [`DetectSpec::schema_text`] (cached per text by `schemas`).
    pub fn schema(&self, schemas: &JsonSchemas) -> Result<Arc<JsonSchema>, GroundingError> {
        Ok(schemas.compile(&self.schema_text())?)
    }

    /// The turn that asks it about `images` (one image; empty when the image is already in
    /// the state, as with a primed frame): the prompt, the compiled schema, the budget as
    /// `max_new_tokens`, thinking off, greedy decoding, token probabilities recorded for the
    /// scores. A front end sets its deadline, cancel flag, start time and system prompt, then
    /// checks the window with [`fit_budget`].
    pub fn turn(
        &self,
        schemas: &JsonSchemas,
        images: Vec<ImageInput>,
    ) -> Result<Turn, GroundingError> {
        Ok(Turn {
            images,
            json_schema: Some(self.schema(schemas)?),
            token_probs: true,
            ..Turn::new(self.prompt(), self.token_budget())
        })
    }
}

/// Checks that `budget` answer tokens fit the `context` window after a prompt of `rows` rows
/// ([`crate::assistant::Assistant::fresh_turn_rows`]), so an answer is never cut short by
/// the window: an error names the numbers instead of a result that does not parse.
pub fn fit_budget(spec: &DetectSpec, context: usize, rows: usize) -> Result<usize, GroundingError> {
    let budget = spec.token_budget();
    if rows.saturating_add(budget) > context {
        return Err(GroundingError::DoesNotFit {
            max_objects: spec.max_objects,
            budget,
            rows,
            context,
        });
    }
    Ok(budget)
}

/// One object found, in pixels of the original frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Detection {
    /// Position of the object in the model's answer (0-based; a dropped object leaves a gap,
    /// so the id always points at the same object of `text`).
    pub index: usize,
    pub label: String,
    /// The model's probability of the label's tokens (geometric mean, [`TokenScores`]): how
    /// sure the model was of the words, not a calibrated detection confidence. 0 when no
    /// probabilities were recorded.
    pub score: f32,
    pub kind: Kind,
    /// Box centre or the point, in pixels (x right, y down, origin at the frame's top-left
    /// corner, a pixel's centre at +0.5).
    pub center: [f64; 2],
    /// Box width and height in pixels; 0 × 0 for a point.
    pub size: [f64; 2],
}

impl Detection {
    /// Top-left and bottom-right corners in pixels.
    pub fn corners(&self) -> ([f64; 2], [f64; 2]) {
        let [cx, cy] = self.center;
        let [w, h] = self.size;
        ([cx - w / 2.0, cy - h / 2.0], [cx + w / 2.0, cy + h / 2.0])
    }
}

/// One relative coordinate → pixels of a `size`-pixel axis, clamped to the frame.
///
/// The tower sees the frame resized straight to its square bucket (320 px for the
/// packaged models), each axis on its own — aspect not kept (`crate::vision::preprocess`) —
/// so a relative coordinate of the bucket is the same fraction of the original axis:
/// `x · W / 1000` and `y · H / 1000`. `tests::the_bucket_stretches_each_axis_on_its_own`
/// proves the stretch on the resize the preprocessing uses.
fn axis(v: f64, size: usize) -> f64 {
    (v * size as f64 / f64::from(SCALE)).clamp(0.0, size as f64)
}

/// A raw object's numbers → pixels of a `width × height` frame: clamped to the frame,
/// reversed corners swapped; `None` for a box with no width or height (after clamping) or a
/// frame with no pixels.
pub fn to_pixels(raw: &RawObject, width: usize, height: usize, score: f32) -> Option<Detection> {
    if width == 0 || height == 0 {
        return None;
    }
    let c = &raw.coords;
    let (center, size) = match (raw.kind, c.len()) {
        (Kind::Boxes, 4) => {
            let (x1, x2) = (axis(c[0], width), axis(c[2], width));
            let (y1, y2) = (axis(c[1], height), axis(c[3], height));
            let (x1, x2) = (x1.min(x2), x1.max(x2));
            let (y1, y2) = (y1.min(y2), y1.max(y2));
            let size = [x2 - x1, y2 - y1];
            if size[0] <= 0.0 || size[1] <= 0.0 {
                return None;
            }
            ([(x1 + x2) / 2.0, (y1 + y2) / 2.0], size)
        }
        (Kind::Points, 2) => ([axis(c[0], width), axis(c[1], height)], [0.0, 0.0]),
        _ => return None,
    };
    Some(Detection {
        index: raw.index,
        label: raw.label.clone(),
        score,
        kind: raw.kind,
        center,
        size,
    })
}

/// A complete answer's text → detections in pixels of a `width × height` frame, each scored
/// by `scores` (0 without).
pub fn detections(
    text: &str,
    kind: Kind,
    width: usize,
    height: usize,
    scores: Option<&TokenScores>,
) -> Result<Vec<Detection>, GroundingError> {
    let raw = parse(text, kind)?;
    Ok(raw
        .iter()
        .filter_map(|r| to_pixels(r, width, height, label_score(r, scores)))
        .collect())
}

/// [`detections`] of a reply to [`DetectSpec::turn`]: an answer cut short is an error, the
/// scores come from the reply's token probabilities.
pub fn detections_of_reply(
    reply: &Reply,
    spec: &DetectSpec,
    tokenizer: &tokenizers::Tokenizer,
    width: usize,
    height: usize,
) -> Result<Vec<Detection>, GroundingError> {
    if reply.is_incomplete() {
        return Err(GroundingError::Parse("the answer was cut short".into()));
    }
    let c = &reply.completion;
    let scores = TokenScores::new(tokenizer, &c.tokens, &reply.token_probs, &c.text);
    detections(&c.text, spec.kind, width, height, scores.as_ref())
}

#[cfg(test)]
mod tests;
