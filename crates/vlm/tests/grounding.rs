//! Detections on random tiny models (CPU backend, the fixture models' HF weights): the schema
//! admits exactly the grounding answers; whatever a random model answers, every detection is
//! well-formed and equals the mapping of the numbers in its text; a model held to a known
//! answer gets the known box in pixels with a score.
#![allow(clippy::unwrap_used)]

use vlm_testkit as common;

use serde_json::Value;
use vlm::assistant::Assistant;
use vlm::engine::{CpuOptions, ImageInput};
use vlm::grounding::{
    detections_of_reply, fit_budget, label_score, DetectSpec, Detection, Kind, LiveScores,
    ObjectScanner, LABEL_MAX, MAX_OBJECTS_LIMIT,
};
use vlm::sampler::{DrawnLog, SamplingParams, TokenConstraint, TokenMask};
use vlm::stream::Event;
use vlm::structured::JsonSchemas;
use vlm::vision::RgbImage;

fn open(model: &str) -> Assistant {
    Assistant::open_hf(&common::model_dir(model), CpuOptions::default(), true).unwrap()
}

fn frame(w: usize, h: usize) -> ImageInput {
    let data = (0..w * h * 3).map(|i| (i * 37 % 251) as u8).collect();
    ImageInput::Rgb(RgbImage::new(w, h, data).unwrap())
}

/// Whether the compiled schema admits `text`: fed the longest allowed token that spells the
/// text's next characters at each step (where the grammar forces a key, llguidance allows
/// only its own spelling of it, so one character at a time would not do).
fn admits(schemas: &JsonSchemas, spec: &DetectSpec, text: &str) -> bool {
    let tok = common::tokenizer();
    let schema = spec.schema(schemas).unwrap();
    let eos = [schemas.vocab() as u32 - 1];
    let mut c = schema.constraint(&eos);
    let mut mask = TokenMask::new(schemas.vocab());
    let mut rest = text;
    while !rest.is_empty() {
        c.next_mask(&mut mask).unwrap();
        let best = mask
            .iter()
            .filter(|&i| !eos.contains(&i))
            .filter_map(|i| Some((i, tok.decode(&[i], false).ok()?)))
            .filter(|(_, s)| !s.is_empty() && rest.starts_with(s.as_str()))
            .max_by_key(|(_, s)| s.len());
        let Some((id, piece)) = best else {
            return false;
        };
        c.accept(id).unwrap();
        rest = &rest[piece.len()..];
    }
    c.is_complete()
}

#[test]
fn the_schema_admits_grounding_answers_and_nothing_else() {
    let vocab = common::config("tiny-sym").text.vocab_size;
    let schemas = JsonSchemas::new(common::tokenizer(), vocab);
    let b = DetectSpec::new("cups", 2, false).unwrap();
    let long = "a".repeat(LABEL_MAX);
    for ok in [
        "[]".to_string(),
        r#"[{"bbox_2d":[100,200,300,400],"label":"cup"}]"#.into(),
        r#"[{"bbox_2d":[0,0,1000,1000],"label":"red cup_2-b"},{"bbox_2d":[1,2,3,4],"label":"X"}]"#
            .into(),
        format!(r#"[{{"bbox_2d":[1,2,3,4],"label":"{long}"}}]"#),
    ] {
        assert!(admits(&schemas, &b, &ok), "{ok}");
    }
    for bad in [
        r#"[{"bbox_2d":[100,200,300,1001],"label":"cup"}]"#.to_string(),
        r#"[{"bbox_2d":[100,200,300],"label":"cup"}]"#.into(),
        r#"[{"bbox_2d":[1.5,2,3,4],"label":"cup"}]"#.into(),
        r#"[{"bbox_2d":[-1,2,3,4],"label":"cup"}]"#.into(),
        r#"[{"bbox_2d":[1,2,3,4],"label":"cup!"}]"#.into(),
        r#"[{"bbox_2d":[1,2,3,4],"label":""}]"#.into(),
        format!(r#"[{{"bbox_2d":[1,2,3,4],"label":"{long}a"}}]"#),
        r#"[{"bbox_2d":[1,2,3,4],"label":"cup","score":1}]"#.into(),
        r#"[{"point_2d":[1,2],"label":"cup"}]"#.into(),
        r#"[{"bbox_2d":[1,2,3,4],"label":"a"},{"bbox_2d":[1,2,3,4],"label":"b"},{"bbox_2d":[1,2,3,4],"label":"c"}]"#.into(),
        r#"[ {"bbox_2d":[1,2,3,4],"label":"a"}]"#.into(),
    ] {
        assert!(!admits(&schemas, &b, &bad), "{bad}");
    }
    let p = DetectSpec::new("doors", 1, true).unwrap();
    assert!(admits(
        &schemas,
        &p,
        r#"[{"point_2d":[250,750],"label":"door"}]"#
    ));
    assert!(!admits(
        &schemas,
        &p,
        r#"[{"bbox_2d":[1,2,3,4],"label":"door"}]"#
    ));
    // The largest request compiles.
    let max = DetectSpec::new("things", MAX_OBJECTS_LIMIT, false).unwrap();
    max.schema(&schemas).unwrap();
}

/// Numbers of the text mapped by hand: x·W/1000, y·H/1000, clamped, sorted.
fn expected(text: &str, kind: Kind, w: f64, h: f64) -> Vec<(usize, [f64; 4])> {
    let v: Value = serde_json::from_str(text).unwrap();
    let mut out = Vec::new();
    for (i, o) in v.as_array().unwrap().iter().enumerate() {
        let n: Vec<f64> = o[kind.key()]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let sx = |x: f64| (x * w / 1000.0).clamp(0.0, w);
        let sy = |y: f64| (y * h / 1000.0).clamp(0.0, h);
        let b = match kind {
            Kind::Boxes => [
                sx(n[0].min(n[2])),
                sy(n[1].min(n[3])),
                sx(n[0].max(n[2])),
                sy(n[1].max(n[3])),
            ],
            Kind::Points => [sx(n[0]), sy(n[1]), sx(n[0]), sy(n[1])],
        };
        if kind == Kind::Points || (b[2] > b[0] && b[3] > b[1]) {
            out.push((i, b));
        }
    }
    out
}

fn check_well_formed(d: &[Detection], text: &str, spec: &DetectSpec, w: usize, h: usize) {
    assert!(d.len() <= spec.max_objects, "{text}");
    let want = expected(text, spec.kind, w as f64, h as f64);
    assert_eq!(d.len(), want.len(), "{text}");
    for (det, (i, b)) in d.iter().zip(want) {
        let ([x1, y1], [x2, y2]) = det.corners();
        assert_eq!(det.index, i);
        for (got, want) in [x1, y1, x2, y2].into_iter().zip(b) {
            assert!((got - want).abs() <= 1.0, "{text}: {got} vs {want}");
        }
        assert!(x1 >= 0.0 && y1 >= 0.0 && x2 <= w as f64 && y2 <= h as f64);
        match spec.kind {
            Kind::Boxes => assert!(det.size[0] > 0.0 && det.size[1] > 0.0),
            Kind::Points => assert_eq!(det.size, [0.0, 0.0]),
        }
        assert!(det.score > 0.0 && det.score <= 1.0, "{}", det.score);
        assert!(!det.label.is_empty() && det.label.len() <= LABEL_MAX);
    }
}

#[test]
fn random_models_give_well_formed_detections() {
    let mut a = open("tiny-sym");
    let tok = common::tokenizer();
    let schemas = a.json_schemas();
    let mut objects = 0;
    for seed in 0..12u64 {
        let (w, h) = (64 + seed as usize * 8, 48);
        let spec = DetectSpec::new("cups", 1 + seed as usize % 4, seed % 3 == 2).unwrap();
        let mut turn = spec.turn(&schemas, vec![frame(w, h)]).unwrap();
        turn.sampling = SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            ..SamplingParams::default()
        };
        let rows = a.fresh_turn_rows(&turn).unwrap();
        fit_budget(&spec, a.info().context, rows).unwrap();
        let reply = a.ask(None, &turn, &mut |_| {}).unwrap();
        assert!(!reply.is_incomplete(), "{}", reply.completion.text);
        let d = detections_of_reply(&reply, &spec, &tok, w, h).unwrap();
        check_well_formed(&d, &reply.completion.text, &spec, w, h);
        objects += d.len();
    }
    assert!(objects > 0, "random models never found anything");
}

/// Scored while the answer streams (each object when it closes, from the turn's drawn log),
/// an object has the score the complete reply gives it.
#[test]
fn objects_scored_as_they_close_have_the_replys_scores() {
    let mut a = open("tiny-sym");
    let tok = common::tokenizer();
    let schemas = a.json_schemas();
    let mut objects = 0;
    for seed in 0..6u64 {
        let spec = DetectSpec::new("cups", 3, false).unwrap();
        let mut turn = spec.turn(&schemas, vec![frame(64, 48)]).unwrap();
        turn.sampling = SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            ..SamplingParams::default()
        };
        let log = DrawnLog::new();
        turn.drawn_log = Some(log.clone());
        let live = LiveScores::new(log, tok.clone());
        let mut scanner = ObjectScanner::new(spec.kind);
        let mut streamed = Vec::new();
        let reply = a
            .ask(None, &turn, &mut |e| {
                if let Event::Text { text, .. } = e {
                    let closed = scanner.push(&text);
                    let scores = live.scores(scanner.text());
                    for r in closed {
                        streamed.push((r.index, label_score(&r, scores.as_ref())));
                    }
                }
            })
            .unwrap();
        let d = detections_of_reply(&reply, &spec, &tok, 64, 48).unwrap();
        let whole: Vec<(usize, f32)> = d.iter().map(|d| (d.index, d.score)).collect();
        // Empty boxes are dropped from the reply's detections, not from the scanner's.
        streamed.retain(|(i, _)| whole.iter().any(|(j, _)| i == j));
        assert_eq!(streamed, whole, "{}", reply.completion.text);
        assert!(whole.iter().all(|&(_, s)| s > 0.0), "{whole:?}");
        objects += whole.len();
    }
    assert!(objects > 0, "random models never found anything");
}

/// The fixture held to one answer: a schema whose only value is the (100,200,300,400) box (the
/// model still chooses how to spell it in tokens, with its own probabilities).
#[test]
fn a_model_held_to_a_known_answer_gets_the_known_box() {
    let mut a = open("tiny-4b");
    let tok = common::tokenizer();
    let spec = DetectSpec::new("cups", 4, false).unwrap();
    let answer = r#"[{"bbox_2d":[100,200,300,400],"label":"cup"}]"#;
    let held = format!(r#"{{"const":{answer}}}"#);
    let mut turn = spec.turn(&a.json_schemas(), vec![frame(640, 480)]).unwrap();
    turn.json_schema = Some(a.json_schemas().compile(&held).unwrap());
    let reply = a.ask(None, &turn, &mut |_| {}).unwrap();
    assert_eq!(reply.completion.text, answer);
    assert!(reply.token_probs.len() >= reply.completion.tokens.len());
    let d = detections_of_reply(&reply, &spec, &tok, 640, 480).unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].corners(), ([64.0, 96.0], [192.0, 192.0]));
    assert_eq!(d[0].label, "cup");
    assert!(d[0].score > 0.0 && d[0].score <= 1.0, "{}", d[0].score);
}

#[test]
fn a_budget_beyond_the_window_is_refused() {
    let a = open("tiny-sym");
    let spec = DetectSpec::new("cups", MAX_OBJECTS_LIMIT, false).unwrap();
    let turn = spec.turn(&a.json_schemas(), vec![frame(64, 48)]).unwrap();
    let rows = a.fresh_turn_rows(&turn).unwrap();
    assert!(rows > 0);
    let err = fit_budget(&spec, a.info().context, rows).unwrap_err();
    assert!(err.to_string().contains("fewer objects"), "{err}");
}
