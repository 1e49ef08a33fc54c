//! ChatML turns as token segments with image slots, M-RoPE positions, tools and tool calls.
//!
//! A turn is rendered the way bllm feeds it (docs/package-contract.md §7): the first turn opens with the
//! system block, a later turn first closes the previous reply (`<|im_end|>\n`, because the
//! eos that ended generation never entered the cache), then the user block with each image
//! as `<|vision_start|>` + an image slot + `<|vision_end|>` before the text, then the
//! assistant opener. Text between markers is tokenised exactly as HF tokenises the rendered
//! template string (special tokens split the text, each piece encoded without added
//! specials), so a prompt equals `apply_chat_template` + `encode` with the image pads
//! replaced by slots. The runtime splices the tower rows into the slots.

use std::sync::Arc;

use serde_json::{Map, Value};
use tokenizers::Tokenizer;

use crate::package::{ChatConfig, ChatFormat, Dialect};

/// Errors of turn building and tool-call parsing.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("the tokenizer has no {0} token")]
    MissingToken(&'static str),
    #[error("chat format {0:?} is not supported (only chatml)")]
    UnsupportedFormat(ChatFormat),
    #[error("a tool must be a JSON object, got {0}")]
    BadTool(String),
    #[error("malformed tool call: {reason}: {block:?}")]
    BadToolCall { reason: String, block: String },
}

/// An M-RoPE position `(t, h, w)`; text tokens use `(p, p, p)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pos3 {
    pub t: u32,
    pub h: u32,
    pub w: u32,
}

impl Pos3 {
    pub fn text(p: u32) -> Self {
        Self { t: p, h: p, w: p }
    }

    /// Largest coordinate (BLLM's `maxPos` bookkeeping).
    pub fn max(&self) -> u32 {
        self.t.max(self.h).max(self.w)
    }
}

/// The rope tables' coordinates (signed, as the HF reference computes them).
impl From<Pos3> for qwen35::Pos3 {
    fn from(p: Pos3) -> Self {
        Self {
            t: i64::from(p.t),
            h: i64::from(p.h),
            w: i64::from(p.w),
        }
    }
}

/// Where the tower's rows go: `grid_h × grid_w` merged rows in raster order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageSlot {
    pub grid_h: u32,
    pub grid_w: u32,
}

impl ImageSlot {
    /// A square bucket of `g × g` merged tokens (10 × 10 for 320 px).
    pub fn square(g: u32) -> Self {
        Self {
            grid_h: g,
            grid_w: g,
        }
    }

    pub fn rows(&self) -> usize {
        self.grid_h as usize * self.grid_w as usize
    }
}

/// A piece of the rendered prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Tokens(Vec<u32>),
    /// The `index`-th image of the turn (order of [`UserTurn::images`]).
    Image {
        index: usize,
        slot: ImageSlot,
    },
}

/// A rendered turn: what to feed, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub segments: Vec<Segment>,
    /// The opener ends inside `<think>`: generated text is reasoning until `</think>`.
    pub starts_in_think: bool,
}

impl Prompt {
    /// Rows this prompt occupies in the cache (text tokens + image rows).
    pub fn rows(&self) -> usize {
        self.segments
            .iter()
            .map(|s| match s {
                Segment::Tokens(t) => t.len(),
                Segment::Image { slot, .. } => slot.rows(),
            })
            .sum()
    }

    /// Token ids with every image slot expanded to `slot.rows()` copies of `pad` (the HF
    /// `<|image_pad|>` form used by `generate`).
    pub fn ids_with_pad(&self, pad: u32) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.rows());
        for s in &self.segments {
            match s {
                Segment::Tokens(t) => out.extend_from_slice(t),
                Segment::Image { slot, .. } => out.extend(std::iter::repeat_n(pad, slot.rows())),
            }
        }
        out
    }

    /// M-RoPE position of every row, starting at text position `start` (the engine's
    /// `maxPos + 1`, 0 for a fresh context). Returns the positions and the next text
    /// position. An image at `st` gives row `r`, col `c` the position `(st, st+r, st+c)` and
    /// moves the next text position to `st + max(grid_h, grid_w)`.
    pub fn positions(&self, start: u32) -> (Vec<Pos3>, u32) {
        let mut out = Vec::with_capacity(self.rows());
        let mut p = start;
        for s in &self.segments {
            match s {
                Segment::Tokens(t) => {
                    for _ in t {
                        out.push(Pos3::text(p));
                        p += 1;
                    }
                }
                Segment::Image { slot, .. } => {
                    for r in 0..slot.grid_h {
                        for c in 0..slot.grid_w {
                            out.push(Pos3 {
                                t: p,
                                h: p + r,
                                w: p + c,
                            });
                        }
                    }
                    p += slot.grid_h.max(slot.grid_w);
                }
            }
        }
        (out, p)
    }
}

/// One user turn. Images come before the text, as bllm feeds them.
#[derive(Debug, Clone, Default)]
pub struct UserTurn<'a> {
    pub text: &'a str,
    pub images: Vec<ImageSlot>,
    /// Thinking on: plain ChatML appends nothing (the model opens `<think>` itself); the
    /// `qwen3.5` dialect appends `<think>\n`. Off: the empty think block is appended.
    pub thinking: bool,
}

/// First-turn settings.
#[derive(Debug, Clone, Default)]
pub struct SystemOptions {
    /// Replaces the package's `chat.system` when `Some`.
    pub system: Option<String>,
    /// OpenAI-style tool list (`{"type":"function","function":{...}}` objects).
    pub tools: Vec<Value>,
}

/// Ids of the markers the template and the stream need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Markers {
    pub im_start: u32,
    pub im_end: u32,
    pub bos: Option<u32>,
    pub vision_start: Option<u32>,
    pub vision_end: Option<u32>,
    pub think: Option<u32>,
    pub think_end: Option<u32>,
    pub image_pad: Option<u32>,
}

fn first_id(tok: &Tokenizer, names: &[&str]) -> Option<u32> {
    names.iter().find_map(|n| tok.token_to_id(n))
}

/// Renders turns for one package.
#[derive(Clone)]
pub struct ChatTemplate {
    tokenizer: Arc<Tokenizer>,
    markers: Markers,
    system: String,
    dialect: Dialect,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("markers", &self.markers)
            .field("system", &self.system)
            .field("dialect", &self.dialect)
            .finish_non_exhaustive()
    }
}

/// The Qwen3.5 template's instructions after the tool list (official `chat_template`).
const TOOL_INSTRUCTIONS: &str = "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>";

enum Piece<'a> {
    Text(std::borrow::Cow<'a, str>),
    Id(u32),
    Image(usize, ImageSlot),
}

impl ChatTemplate {
    /// Marker ids come from `chat` when the manifest sets them, else from the tokenizer.
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        chat: &ChatConfig,
        dialect: Dialect,
    ) -> Result<Self, ChatError> {
        if chat.format != ChatFormat::ChatMl {
            return Err(ChatError::UnsupportedFormat(chat.format));
        }
        let tok = &tokenizer;
        let markers = Markers {
            im_start: chat
                .im_start
                .or_else(|| tok.token_to_id("<|im_start|>"))
                .ok_or(ChatError::MissingToken("<|im_start|>"))?,
            im_end: chat
                .im_end
                .or_else(|| tok.token_to_id("<|im_end|>"))
                .ok_or(ChatError::MissingToken("<|im_end|>"))?,
            bos: chat.bos,
            vision_start: first_id(tok, &["<|vision_bos|>", "<|vision_start|>"]),
            vision_end: first_id(tok, &["<|vision_eos|>", "<|vision_end|>"]),
            think: tok.token_to_id("<think>"),
            think_end: tok.token_to_id("</think>"),
            image_pad: tok.token_to_id("<|image_pad|>"),
        };
        Ok(Self {
            tokenizer,
            markers,
            system: chat.system.clone(),
            dialect,
        })
    }

    pub fn markers(&self) -> &Markers {
        &self.markers
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    pub fn dialect(&self) -> &Dialect {
        &self.dialect
    }

    /// Text of the first turn's system block (tools first, then the system prompt, as the
    /// Qwen3.5 template renders them).
    pub fn system_text(&self, opts: &SystemOptions) -> Result<String, ChatError> {
        let system = opts.system.as_deref().unwrap_or(&self.system);
        if opts.tools.is_empty() {
            return Ok(system.to_string());
        }
        let mut s =
            String::from("# Tools\n\nYou have access to the following functions:\n\n<tools>");
        for tool in &opts.tools {
            if !tool.is_object() {
                return Err(ChatError::BadTool(tool.to_string()));
            }
            s.push('\n');
            s.push_str(&to_json_python(tool));
        }
        s.push_str("\n</tools>");
        s.push_str(TOOL_INSTRUCTIONS);
        let system = system.trim();
        if !system.is_empty() {
            s.push_str("\n\n");
            s.push_str(system);
        }
        Ok(s)
    }

    /// Renders one turn. `first` opens the conversation with the system block (`system`
    /// must then be `Some`); otherwise the previous reply is closed first.
    pub fn render(
        &self,
        first: Option<&SystemOptions>,
        turn: &UserTurn<'_>,
    ) -> Result<Prompt, ChatError> {
        let mut pieces: Vec<Piece<'_>> = Vec::new();
        match first {
            Some(opts) => self.push_system(opts, &mut pieces)?,
            None => {
                pieces.push(Piece::Id(self.markers.im_end));
                pieces.push(Piece::Text("\n".into()));
            }
        }
        self.push_user(turn, pieces)
    }

    /// Tokens of the first turn's system block alone. Followed by
    /// [`ChatTemplate::render_after_system`] it gives exactly the tokens of
    /// `render(Some(opts), turn)`, so the block can be prefilled once and restored per turn.
    pub fn system_prefix(&self, opts: &SystemOptions) -> Result<Vec<u32>, ChatError> {
        let mut pieces = Vec::new();
        self.push_system(opts, &mut pieces)?;
        match self.tokenize(pieces)?.as_slice() {
            [Segment::Tokens(ids)] => Ok(ids.clone()),
            _ => Ok(Vec::new()),
        }
    }

    /// The first user turn after a separately fed [`ChatTemplate::system_prefix`].
    pub fn render_after_system(&self, turn: &UserTurn<'_>) -> Result<Prompt, ChatError> {
        self.push_user(turn, Vec::new())
    }

    fn push_system<'a>(
        &'a self,
        opts: &SystemOptions,
        pieces: &mut Vec<Piece<'a>>,
    ) -> Result<(), ChatError> {
        let m = &self.markers;
        if let Some(b) = m.bos {
            pieces.push(Piece::Id(b));
        }
        pieces.push(Piece::Id(m.im_start));
        pieces.push(Piece::Text(
            format!("system\n{}", self.system_text(opts)?).into(),
        ));
        pieces.push(Piece::Id(m.im_end));
        pieces.push(Piece::Text("\n".into()));
        Ok(())
    }

    fn push_user<'a>(
        &'a self,
        turn: &UserTurn<'a>,
        mut pieces: Vec<Piece<'a>>,
    ) -> Result<Prompt, ChatError> {
        let m = &self.markers;
        pieces.push(Piece::Id(m.im_start));
        pieces.push(Piece::Text("user\n".into()));
        if !turn.images.is_empty() {
            let vs = m
                .vision_start
                .ok_or(ChatError::MissingToken("<|vision_start|>"))?;
            let ve = m
                .vision_end
                .ok_or(ChatError::MissingToken("<|vision_end|>"))?;
            for (i, slot) in turn.images.iter().enumerate() {
                pieces.push(Piece::Id(vs));
                pieces.push(Piece::Image(i, *slot));
                pieces.push(Piece::Id(ve));
            }
        }
        pieces.push(Piece::Text(turn.text.into()));
        pieces.push(Piece::Id(m.im_end));
        pieces.push(Piece::Text("\n".into()));
        pieces.push(Piece::Id(m.im_start));
        pieces.push(Piece::Text("assistant\n".into()));
        if !turn.thinking {
            pieces.push(Piece::Text("<think>\n\n</think>\n\n".into()));
        } else if self.dialect == Dialect::Qwen35 {
            pieces.push(Piece::Text("<think>\n".into()));
        }
        let segments = self.tokenize(pieces)?;
        let starts_in_think = self.ends_inside_think(&segments);
        Ok(Prompt {
            segments,
            starts_in_think,
        })
    }

    /// Tokens of an assistant reply replayed into the context (prefill only), so the context
    /// reads as if the model had produced it; the next turn closes it.
    pub fn reply_tokens(&self, reply: &str) -> Result<Vec<u32>, ChatError> {
        self.encode(reply)
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, ChatError> {
        if text.is_empty() {
            return Ok(Vec::new());
        }
        self.tokenizer
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| ChatError::Tokenizer(e.to_string()))
    }

    fn tokenize(&self, pieces: Vec<Piece<'_>>) -> Result<Vec<Segment>, ChatError> {
        let mut segments = Vec::new();
        let mut ids: Vec<u32> = Vec::new();
        let mut text = String::new();
        for piece in pieces {
            match piece {
                Piece::Text(t) => text.push_str(&t),
                Piece::Id(id) => {
                    ids.extend(self.encode(&text)?);
                    text.clear();
                    ids.push(id);
                }
                Piece::Image(index, slot) => {
                    ids.extend(self.encode(&text)?);
                    text.clear();
                    segments.push(Segment::Tokens(std::mem::take(&mut ids)));
                    segments.push(Segment::Image { index, slot });
                }
            }
        }
        ids.extend(self.encode(&text)?);
        segments.push(Segment::Tokens(ids));
        segments.retain(|s| !matches!(s, Segment::Tokens(t) if t.is_empty()));
        Ok(segments)
    }

    fn ends_inside_think(&self, segments: &[Segment]) -> bool {
        let (Some(open), Some(close)) = (self.markers.think, self.markers.think_end) else {
            return false;
        };
        let Some(Segment::Tokens(last)) = segments.last() else {
            return false;
        };
        // Only the opener after the last `<|im_start|>` counts.
        let opener = match last.iter().rposition(|&t| t == self.markers.im_start) {
            Some(i) => &last[i..],
            None => &last[..],
        };
        opener.iter().rev().find(|&&t| t == open || t == close) == Some(&open)
    }
}

/// `json.dumps(value, ensure_ascii=False)` as the HF template's `tojson` prints it
/// (`", "` and `": "` separators, keys in document order, non-ASCII kept).
pub fn to_json_python(v: &Value) -> String {
    let mut s = String::new();
    write_json_python(v, &mut s);
    s
}

fn write_json_python(v: &Value, out: &mut String) {
    match v {
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_json_python(x, out);
            }
            out.push(']');
        }
        Value::Object(o) => {
            out.push('{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(": ");
                write_json_python(x, out);
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// A structured tool call parsed from a `<tool_call>` block.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: Map<String, Value>,
}

impl ToolCall {
    /// OpenAI-style `{"name": ..., "arguments": {...}}`.
    pub fn to_json(&self) -> Value {
        serde_json::json!({ "name": self.name, "arguments": self.arguments })
    }
}

/// JSON-schema type(s) of a tool parameter, if the tool list declares it.
fn param_types<'a>(tools: &'a [Value], function: &str, param: &str) -> Option<Vec<&'a str>> {
    let tool = tools.iter().find_map(|t| {
        let f = t.get("function").unwrap_or(t);
        (f.get("name")?.as_str()? == function).then_some(f)
    })?;
    let ty = tool
        .get("parameters")?
        .get("properties")?
        .get(param)?
        .get("type")?;
    match ty {
        Value::String(s) => Some(vec![s.as_str()]),
        Value::Array(a) => Some(a.iter().filter_map(Value::as_str).collect()),
        _ => None,
    }
}

/// Parses the inside of a `<tool_call>…</tool_call>` block: the Qwen3.5 XML form
/// (`<function=NAME>` with `<parameter=KEY>\nVALUE\n</parameter>` entries) or the JSON form
/// (`{"name": ..., "arguments": {...}}`). XML values are strings unless the tool's schema
/// declares a non-string type, in which case they are read as JSON (kept as the string if
/// that fails), mirroring how the template printed them (`tojson` for non-strings).
pub fn parse_tool_call(block: &str, tools: &[Value]) -> Result<ToolCall, ChatError> {
    let bad = |reason: &str| ChatError::BadToolCall {
        reason: reason.to_string(),
        block: block.to_string(),
    };
    let body = block.trim();
    if body.starts_with('{') {
        let v: Value =
            serde_json::from_str(body).map_err(|e| bad(&format!("invalid JSON ({e})")))?;
        let name = v
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("no \"name\""))?
            .to_string();
        let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(o)) => o.clone(),
            Some(Value::String(s)) => match serde_json::from_str(s) {
                Ok(Value::Object(o)) => o,
                _ => return Err(bad("\"arguments\" is not a JSON object")),
            },
            Some(_) => return Err(bad("\"arguments\" is not an object")),
        };
        return Ok(ToolCall { name, arguments });
    }
    let rest = body
        .strip_prefix("<function=")
        .ok_or_else(|| bad("expected <function=NAME> or a JSON object"))?;
    let end = rest
        .find('>')
        .ok_or_else(|| bad("unterminated <function="))?;
    let name = rest[..end].trim().to_string();
    if name.is_empty() {
        return Err(bad("empty function name"));
    }
    let mut rest = &rest[end + 1..];
    if let Some(i) = rest.find("</function>") {
        rest = &rest[..i];
    }
    let mut arguments = Map::new();
    while let Some(i) = rest.find("<parameter=") {
        let after = &rest[i + "<parameter=".len()..];
        let close = after
            .find('>')
            .ok_or_else(|| bad("unterminated <parameter="))?;
        let key = after[..close].trim().to_string();
        let body = &after[close + 1..];
        // A value ends at its closing tag, or at the next parameter if the tag is missing.
        let stop = [body.find("</parameter>"), body.find("<parameter=")]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(body.len());
        let mut value = &body[..stop];
        value = value.strip_prefix('\n').unwrap_or(value);
        value = value.strip_suffix('\n').unwrap_or(value);
        let typed = match param_types(tools, &name, &key) {
            Some(types) if !types.contains(&"string") => {
                serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string()))
            }
            _ => Value::String(value.to_string()),
        };
        arguments.insert(key, typed);
        rest = body[stop..]
            .strip_prefix("</parameter>")
            .unwrap_or(&body[stop..]);
    }
    Ok(ToolCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_follow_the_contract_for_an_image_block() {
        let p = Prompt {
            segments: vec![
                Segment::Tokens(vec![1, 2, 3]),
                Segment::Image {
                    index: 0,
                    slot: ImageSlot::square(10),
                },
                Segment::Tokens(vec![4, 5]),
            ],
            starts_in_think: false,
        };
        let (pos, next) = p.positions(7);
        assert_eq!(pos.len(), 105);
        assert_eq!(pos[2], Pos3::text(9));
        let st = 10;
        assert_eq!(
            pos[3],
            Pos3 {
                t: st,
                h: st,
                w: st
            }
        );
        // row 3, col 7 of the merged grid is row 3*10+7 of the block
        assert_eq!(
            pos[3 + 37],
            Pos3 {
                t: st,
                h: st + 3,
                w: st + 7
            }
        );
        assert_eq!(
            pos[3 + 99],
            Pos3 {
                t: st,
                h: st + 9,
                w: st + 9
            }
        );
        // <|vision_end|> (the next text token) sits at st + G.
        assert_eq!(pos[103], Pos3::text(st + 10));
        assert_eq!(next, st + 12);
        assert_eq!(p.ids_with_pad(9).len(), 105);
        // Non-square grids advance by the longer side.
        let q = Prompt {
            segments: vec![Segment::Image {
                index: 0,
                slot: ImageSlot {
                    grid_h: 2,
                    grid_w: 3,
                },
            }],
            starts_in_think: false,
        };
        let (pos, next) = q.positions(0);
        assert_eq!(pos[5], Pos3 { t: 0, h: 1, w: 2 });
        assert_eq!(next, 3);
    }

    #[test]
    fn python_tojson_spacing_and_order() {
        let v: Value = serde_json::from_str(
            r#"{"type":"function","function":{"name":"move","description":"Déplace \"x\"\n","parameters":{"b":[1,2.5,true,null],"a":{}}}}"#,
        )
        .unwrap();
        assert_eq!(
            to_json_python(&v),
            r#"{"type": "function", "function": {"name": "move", "description": "Déplace \"x\"\n", "parameters": {"b": [1, 2.5, true, null], "a": {}}}}"#
        );
    }

    fn tools() -> Vec<Value> {
        serde_json::from_str(
            r#"[{"type":"function","function":{"name":"move","parameters":{"type":"object",
            "properties":{"direction":{"type":"string"},"meters":{"type":"number"},
            "opts":{"type":["object","null"]}}}}}]"#,
        )
        .unwrap()
    }

    #[test]
    fn xml_tool_calls_are_typed_by_schema() {
        let block = "\n<function=move>\n<parameter=direction>\nleft\n</parameter>\n<parameter=meters>\n1.5\n</parameter>\n<parameter=opts>\n{\"fast\": true}\n</parameter>\n<parameter=note>\n001\nline2\n</parameter>\n</function>\n";
        let call = parse_tool_call(block, &tools()).unwrap();
        assert_eq!(call.name, "move");
        assert_eq!(
            Value::Object(call.arguments.clone()),
            serde_json::json!({"direction":"left","meters":1.5,"opts":{"fast":true},"note":"001\nline2"})
        );
        assert_eq!(
            call.to_json(),
            serde_json::json!({"name":"move","arguments":{"direction":"left","meters":1.5,"opts":{"fast":true},"note":"001\nline2"}})
        );
        // A string-typed "1.5" stays a string; a missing closing tag ends at the next parameter.
        let call = parse_tool_call(
            "<function=move><parameter=direction>1.5<parameter=meters>2</function>",
            &tools(),
        )
        .unwrap();
        assert_eq!(call.arguments["direction"], Value::String("1.5".into()));
        assert_eq!(call.arguments["meters"], serde_json::json!(2));
        // Without a schema nothing is guessed.
        let call = parse_tool_call(
            "<function=stop>\n<parameter=n>\n2\n</parameter>\n</function>",
            &[],
        )
        .unwrap();
        assert_eq!(call.arguments["n"], Value::String("2".into()));
        let call = parse_tool_call("<function=ping>\n</function>", &[]).unwrap();
        assert!(call.arguments.is_empty());
    }

    #[test]
    fn json_tool_calls_and_errors() {
        let call =
            parse_tool_call(r#" {"name": "move", "arguments": {"meters": 2}} "#, &[]).unwrap();
        assert_eq!(call.name, "move");
        assert_eq!(call.arguments["meters"], serde_json::json!(2));
        let call = parse_tool_call(r#"{"name": "move", "arguments": "{\"m\": 1}"}"#, &[]).unwrap();
        assert_eq!(call.arguments["m"], serde_json::json!(1));
        for bad in [
            "",
            "hello",
            "{\"arguments\":{}}",
            "{not json",
            "<function=>",
            "<function=x",
        ] {
            assert!(parse_tool_call(bad, &[]).is_err(), "{bad:?}");
        }
    }
}
