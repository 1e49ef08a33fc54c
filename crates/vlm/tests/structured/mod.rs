// Structured output (issue 17), one test body for every backend: `include!`d by
// `crates/vlm/tests/structured_output.rs` (CPU backend on the fixture models' HF weights) and
// `crates/vlm-bpu/tests/structured_output.rs` (sim packages of the same models). Random tiny
// models sampled at temperature 1.0 over many seeds must still answer values that an
// independent validator (the `jsonschema` crate) accepts; a cut answer is `Incomplete`.
//
// Expects in scope: `vlm_testkit as common`.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::Value;
use vlm::assistant::{Assistant, AssistantError, Turn};
use vlm::engine::ConstraintOutcome;
use vlm::sampler::SamplingParams;
use vlm::stream::FinishReason;
use vlm::structured::{JsonSchema, SchemaError};

/// Enums, bounded integers (one may be negative), a bounded array of bounded strings,
/// booleans, a nested object with its own required keys, optional keys, no extra keys.
const SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "verdict": {"enum": ["yes", "no", "unsure"]},
    "count": {"type": "integer", "minimum": 0, "maximum": 20},
    "offset": {"type": "integer", "minimum": -5, "maximum": 5},
    "labels": {
      "type": "array",
      "items": {"type": "string", "minLength": 1, "maxLength": 8},
      "maxItems": 3
    },
    "visible": {"type": "boolean"},
    "box": {
      "type": "object",
      "properties": {
        "x": {"type": "integer", "minimum": 0, "maximum": 1000},
        "y": {"type": "integer", "minimum": 0, "maximum": 1000},
        "kind": {"enum": ["cup", "person"]}
      },
      "required": ["x", "y", "kind"],
      "additionalProperties": false
    },
    "note": {"type": "string", "maxLength": 12}
  },
  "required": ["verdict", "count", "labels", "visible", "box"],
  "additionalProperties": false
}"#;

/// Characters the values of `SCHEMA` are written with; each must be one token of the fixture
/// tokenizer, or a random model could not spell them and every answer would be the same few.
const JSON_CHARS: &str = "{}[]\",:-0123456789abcdefghijklmnopqrstuvwxyz";

fn validator() -> jsonschema::Validator {
    jsonschema::validator_for(&serde_json::from_str(SCHEMA).unwrap()).unwrap()
}

fn schema_turn(schema: &Arc<JsonSchema>, seed: u64, max_new: usize) -> Turn {
    let mut t = Turn::new("Describe the scene as JSON.", max_new);
    t.sampling = SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    t.json_schema = Some(Arc::clone(schema));
    t
}

/// What the answers covered: a constraint that let only a few values through would pass
/// validation vacuously, so the test asks for variety too.
#[derive(Default, Debug)]
struct Seen {
    verdicts: BTreeSet<String>,
    counts: BTreeSet<i64>,
    /// Answers under `{"type":"integer","minimum":-30,"maximum":-10}` (each validated).
    negatives: BTreeSet<i64>,
    optional_present: usize,
    optional_absent: usize,
    label_lens: BTreeSet<usize>,
    booleans: BTreeSet<bool>,
    kinds: BTreeSet<String>,
    max_tokens: usize,
}

impl Seen {
    fn add(&mut self, v: &Value, tokens: usize) {
        self.verdicts.insert(v["verdict"].as_str().unwrap().into());
        self.counts.insert(v["count"].as_i64().unwrap());
        for key in ["offset", "note"] {
            if v.get(key).is_some() {
                self.optional_present += 1;
            } else {
                self.optional_absent += 1;
            }
        }
        self.label_lens
            .insert(v["labels"].as_array().unwrap().len());
        self.booleans.insert(v["visible"].as_bool().unwrap());
        self.kinds.insert(v["box"]["kind"].as_str().unwrap().into());
        self.max_tokens = self.max_tokens.max(tokens);
    }

    fn merge(&mut self, o: Seen) {
        self.verdicts.extend(o.verdicts);
        self.counts.extend(o.counts);
        self.negatives.extend(o.negatives);
        self.optional_present += o.optional_present;
        self.optional_absent += o.optional_absent;
        self.label_lens.extend(o.label_lens);
        self.booleans.extend(o.booleans);
        self.kinds.extend(o.kinds);
        self.max_tokens = self.max_tokens.max(o.max_tokens);
    }

    fn assert_varied(&self) {
        assert_eq!(self.verdicts.len(), 3, "{self:?}");
        assert!(self.counts.len() >= 4, "{self:?}");
        assert!(self.negatives.len() >= 2, "{self:?}");
        assert!(
            self.optional_present > 0 && self.optional_absent > 0,
            "{self:?}"
        );
        assert!(self.label_lens.len() >= 3, "{self:?}");
        assert_eq!(self.booleans.len(), 2, "{self:?}");
        assert_eq!(self.kinds.len(), 2, "{self:?}");
    }
}

/// No whitespace outside strings: the compact form that bounds a value's length.
fn compact(json: &str) -> bool {
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        match (in_string, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, false, '"') => in_string = !in_string,
            (false, _, c) if c.is_whitespace() => return false,
            _ => {}
        }
    }
    true
}

/// The fixture tokenizer has a one-character token for every character `SCHEMA`'s values
/// need, so the random models can spell any of them.
fn assert_tokenizer_spells_json(a: &Assistant) {
    let tok = a.template().tokenizer();
    for c in JSON_CHARS.chars() {
        let ids = tok.encode(c.to_string(), false).unwrap().get_ids().to_vec();
        assert_eq!(ids.len(), 1, "{c:?} is not one token: {ids:?}");
        assert_eq!(tok.decode(&ids, false).unwrap(), c.to_string());
    }
}

/// `seeds` answers at temperature 1.0 (and one greedy, one with the model card's sampling):
/// every one a complete value, ended by the constraint (`stop`), that the independent
/// validator accepts.
fn answers_validate(a: &mut Assistant, seeds: std::ops::Range<u64>) -> Seen {
    assert_tokenizer_spells_json(a);
    let schema = a.json_schemas().compile(SCHEMA).unwrap();
    let validator = validator();
    let mut seen = Seen::default();
    let mut turns: Vec<Turn> = seeds.map(|s| schema_turn(&schema, s, 160)).collect();
    let mut greedy = schema_turn(&schema, 0, 160);
    greedy.sampling = SamplingParams::default();
    let mut card = schema_turn(&schema, 99, 160);
    card.sampling = SamplingParams {
        seed: Some(99),
        ..SamplingParams::qwen35_non_thinking()
    };
    turns.extend([greedy, card]);
    for t in &turns {
        let r = a.ask(None, t, &mut |_| {}).unwrap();
        let c = &r.completion;
        let seed = r.seed;
        assert_eq!(
            r.constraint,
            Some(ConstraintOutcome::Complete),
            "seed {seed}: {:?}",
            c.text
        );
        assert_eq!(
            c.finish_reason,
            FinishReason::Stop,
            "seed {seed}: {:?}",
            c.text
        );
        assert!(c.reasoning.is_empty(), "seed {seed}: thinking is off");
        let v: Value = serde_json::from_str(&c.text)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}: {:?}", c.text));
        if let Err(e) = validator.validate(&v) {
            panic!("seed {seed}: {e}: {}", c.text);
        }
        assert!(compact(&c.text), "seed {seed}: not compact: {:?}", c.text);
        seen.add(&v, c.tokens.len());
    }
    let negative = a
        .json_schemas()
        .compile(r#"{"type":"integer","minimum":-30,"maximum":-10}"#)
        .unwrap();
    for seed in 0..4 {
        let r = a
            .ask(None, &schema_turn(&negative, seed, 8), &mut |_| {})
            .unwrap();
        let n: i64 = r.completion.text.parse().unwrap();
        assert!((-30..=-10).contains(&n), "{n}");
        seen.negatives.insert(n);
    }
    seen
}

/// Thinking on: the think block is free (the `</think>` token made likely with a bias, or a
/// random model would think for hundreds of tokens), the value starts at the answer's first
/// token and validates.
fn thinking_then_value(a: &mut Assistant, seeds: std::ops::Range<u64>) {
    let schema = a.json_schemas().compile(SCHEMA).unwrap();
    let think_end = a.template().markers().think_end.unwrap();
    let validator = validator();
    let mut reasoned = 0;
    for seed in seeds {
        let mut t = schema_turn(&schema, seed, 200);
        t.thinking = true;
        t.sampling.logit_bias = vec![(think_end, 4.0)];
        let r = a.ask(None, &t, &mut |_| {}).unwrap();
        let c = &r.completion;
        assert_eq!(
            r.constraint,
            Some(ConstraintOutcome::Complete),
            "seed {seed}: {c:?}"
        );
        assert!(c.tokens.contains(&think_end), "seed {seed}");
        let v: Value = serde_json::from_str(&c.text)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}: {:?}", c.text));
        assert!(validator.is_valid(&v), "seed {seed}: {}", c.text);
        reasoned += usize::from(!c.reasoning.is_empty());
    }
    assert!(reasoned > 0, "no answer had reasoning text");
}

/// `max_new_tokens` ends the value: `Incomplete`, `length`, a partial text that does not
/// parse — never a complete-looking answer.
fn cut_answer_is_incomplete(a: &mut Assistant) {
    let schema = a.json_schemas().compile(SCHEMA).unwrap();
    for seed in 0..4 {
        let r = a
            .ask(None, &schema_turn(&schema, seed, 4), &mut |_| {})
            .unwrap();
        let c = &r.completion;
        assert!(r.is_incomplete(), "seed {seed}: {c:?}");
        assert_eq!(c.finish_reason, FinishReason::Length);
        assert!(c.text.starts_with('{'), "{:?}", c.text);
        assert!(
            serde_json::from_str::<Value>(&c.text).is_err(),
            "{:?}",
            c.text
        );
    }
}

/// A conversation whose turns carry a schema, none, then another schema.
fn schema_per_turn(a: &mut Assistant) {
    let schemas = a.json_schemas();
    let gate = schemas.compile(r#"{"enum": ["yes", "no"]}"#).unwrap();
    let count = schemas
        .compile(r#"{"type":"object","properties":{"count":{"type":"integer","minimum":0,"maximum":9}},"required":["count"],"additionalProperties":false}"#)
        .unwrap();
    let mut t = schema_turn(&gate, 5, 20);
    t.keep = true;
    let r1 = a.ask(None, &t, &mut |_| {}).unwrap();
    assert!(
        matches!(r1.completion.text.as_str(), "\"yes\"" | "\"no\""),
        "{:?}",
        r1.completion.text
    );
    let mut free = Turn::new("And why?", 12);
    free.keep = true;
    let r2 = a.ask(r1.conversation.as_ref(), &free, &mut |_| {}).unwrap();
    assert_eq!(r2.constraint, None);
    let mut t = schema_turn(&count, 6, 20);
    t.keep = true;
    let r3 = a.ask(r2.conversation.as_ref(), &t, &mut |_| {}).unwrap();
    let v: Value = serde_json::from_str(&r3.completion.text).unwrap();
    assert!(
        v["count"].as_i64().is_some_and(|n| (0..=9).contains(&n)),
        "{v}"
    );
    assert_eq!(r3.conversation.unwrap().turns(), 3);
}

/// Refusals before anything runs: schemas that are not JSON, not schemas, use what cannot be
/// enforced, or come with tools or stop strings.
fn refusals(a: &mut Assistant) {
    let schemas = a.json_schemas();
    let err = |text: &str| schemas.compile(text).unwrap_err();
    assert_eq!(err("  "), SchemaError::Empty);
    assert!(matches!(err("{\"type\": "), SchemaError::NotJson(_)));
    assert_eq!(err("[1]"), SchemaError::NotASchema("an array"));
    assert_eq!(
        err(r#"{"type":"object","x-guidance":{"whitespace_flexible":true}}"#),
        SchemaError::Reserved("x-guidance")
    );
    assert!(matches!(
        err(r#"{"type":"string","if":{"minLength":2}}"#),
        SchemaError::Unsupported(_)
    ));
    assert!(matches!(
        err(r#"{"$ref":"https://example.invalid/s.json"}"#),
        SchemaError::Unsupported(_)
    ));
    assert!(matches!(err("false"), SchemaError::Unsupported(_)));
    let schema = schemas.compile(r#"{"type":"boolean"}"#).unwrap();
    let mut t = schema_turn(&schema, 1, 8);
    t.stop = vec!["}".into()];
    assert!(matches!(
        a.ask(None, &t, &mut |_| {}),
        Err(AssistantError::Schema(SchemaError::Conflict(
            "stop strings"
        )))
    ));
    let mut t = schema_turn(&schema, 1, 8);
    t.tools = vec![serde_json::json!({"type": "function", "function": {"name": "look"}})];
    assert!(matches!(
        a.ask(None, &t, &mut |_| {}),
        Err(AssistantError::Schema(SchemaError::Conflict("tools")))
    ));
    // Compiled once per text: the same text is the same compiled schema.
    assert!(Arc::ptr_eq(
        &schema,
        &schemas.compile(r#"{"type":"boolean"}"#).unwrap()
    ));
}
