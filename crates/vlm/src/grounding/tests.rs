use super::*;
use crate::vision::{resize_bicubic, RgbImage};

fn boxes(text: &str, w: usize, h: usize) -> Vec<Detection> {
    detections(text, Kind::Boxes, w, h, None).unwrap()
}

fn corners(d: &Detection) -> [f64; 4] {
    let ([x1, y1], [x2, y2]) = d.corners();
    [x1, y1, x2, y2]
}

#[test]
fn a_box_of_100_200_300_400_maps_to_pixels_of_the_frame() {
    let d = boxes(r#"[{"bbox_2d":[100,200,300,400],"label":"cup"}]"#, 640, 480);
    assert_eq!(d.len(), 1);
    assert_eq!(corners(&d[0]), [64.0, 96.0, 192.0, 192.0]);
    assert_eq!(d[0].center, [128.0, 144.0]);
    assert_eq!(d[0].size, [128.0, 96.0]);
    assert_eq!((d[0].label.as_str(), d[0].index), ("cup", 0));
    assert_eq!(d[0].kind, Kind::Boxes);
}

#[test]
fn y_scales_by_the_height_and_x_by_the_width() {
    // A tall frame: a wrong axis would show at once.
    let d = boxes(r#"[{"bbox_2d":[0,0,500,500],"label":"a"}]"#, 200, 800);
    assert_eq!(corners(&d[0]), [0.0, 0.0, 100.0, 400.0]);
}

#[test]
fn beyond_the_frame_is_clamped_and_reversed_corners_swapped() {
    let d = boxes(
        r#"[{"bbox_2d":[900,100,1100,300],"label":"a"},{"bbox_2d":[300,400,100,200],"label":"b"}]"#,
        640,
        480,
    );
    assert_eq!(corners(&d[0]), [576.0, 48.0, 640.0, 144.0]);
    assert_eq!(corners(&d[1]), [64.0, 96.0, 192.0, 192.0]);
    let p = detections(
        r#"[{"point_2d":[1200,-5],"label":"p"}]"#,
        Kind::Points,
        640,
        480,
        None,
    )
    .unwrap();
    assert_eq!((p[0].center, p[0].size), ([640.0, 0.0], [0.0, 0.0]));
}

#[test]
fn empty_boxes_are_dropped_and_ids_keep_the_answer_order() {
    let d = boxes(
        r#"[{"bbox_2d":[100,100,100,300],"label":"flat"},{"bbox_2d":[10,20,30,20],"label":"thin"},{"bbox_2d":[1000,0,1200,100],"label":"out"},{"bbox_2d":[0,0,1,1],"label":"tiny"}]"#,
        640,
        480,
    );
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].index, d[0].label.as_str()), (3, "tiny"));
    assert!(to_pixels(
        &parse(r#"[{"bbox_2d":[0,0,9,9],"label":"x"}]"#, Kind::Boxes).unwrap()[0],
        0,
        10,
        1.0
    )
    .is_none());
}

#[test]
fn points_map_each_axis() {
    let p = detections(
        r#"[{"point_2d":[250,750],"label":"door"}]"#,
        Kind::Points,
        640,
        480,
        None,
    )
    .unwrap();
    assert_eq!(p[0].center, [160.0, 360.0]);
    assert_eq!(corners(&p[0]), [160.0, 360.0, 160.0, 360.0]);
}

#[test]
fn parsing_keeps_labels_and_their_byte_spans() {
    let text = r#"[{"bbox_2d":[1,2,3,4],"label":"red cup"},{"label":"label","bbox_2d":[5,6,7,8]}]"#;
    let r = parse(text, Kind::Boxes).unwrap();
    assert_eq!(r.len(), 2);
    assert_eq!(&text[r[0].label_span.clone()], "red cup");
    assert_eq!(&text[r[1].label_span.clone()], "label");
    assert_eq!(r[1].coords, vec![5.0, 6.0, 7.0, 8.0]);
    assert_eq!(
        &text[r[1].span.clone()],
        r#"{"label":"label","bbox_2d":[5,6,7,8]}"#
    );
    // With whitespace, as free text might have it.
    let spaced = "[ {\"bbox_2d\": [1, 2, 3, 4], \"label\" : \"cup\"} ]";
    let s = parse(spaced, Kind::Boxes).unwrap();
    assert_eq!(&spaced[s[0].label_span.clone()], "cup");
    assert_eq!(parse("[]", Kind::Boxes).unwrap(), vec![]);
}

#[test]
fn parsing_refuses_what_is_not_a_complete_answer() {
    for bad in [
        r#"[{"bbox_2d":[1,2,3,4],"label":"cup"}"#,
        r#"{"bbox_2d":[1,2,3,4],"label":"cup"}"#,
        r#"[{"bbox_2d":[1,2,3],"label":"cup"}]"#,
        r#"[{"point_2d":[1,2],"label":"cup"}]"#,
        r#"[{"bbox_2d":[1,2,3,4]}]"#,
        r#"[{"bbox_2d":[1,2,3,4],"label":"cup"},7]"#,
        "cups are on the table",
    ] {
        assert!(
            matches!(parse(bad, Kind::Boxes), Err(GroundingError::Parse(_))),
            "{bad}"
        );
    }
}

#[test]
fn the_scanner_yields_each_object_when_it_closes() {
    let text = r#"[{"bbox_2d":[1,2,3,4],"label":"a}b"},{"bbox_2d":[5,6,7,8],"label":"c"}]"#;
    let mut s = ObjectScanner::new(Kind::Boxes);
    let mut seen = Vec::new();
    for (i, ch) in text.char_indices() {
        for o in s.push(ch.encode_utf8(&mut [0; 4])) {
            seen.push((i, o.label));
        }
    }
    let first_end = text.find(r#""},"#).unwrap() + 1;
    assert_eq!(
        seen,
        vec![(first_end, "a}b".into()), (text.len() - 2, "c".into())]
    );
    assert_eq!(s.text(), text);
}

#[test]
fn scores_are_the_geometric_mean_of_the_label_tokens() {
    let text = r#"[{"bbox_2d":[1,2,3,4],"label":"red cup"}]"#;
    let label = parse(text, Kind::Boxes).unwrap()[0].label_span.clone();
    // Tokens: everything before the label, `red`, ` cup`, the rest.
    let spans = vec![
        0..label.start,
        label.start..label.start + 3,
        label.start + 3..label.end,
        label.end..text.len(),
    ];
    let s = TokenScores::from_parts(spans, vec![0.1, 0.5, 0.8, 0.2]);
    assert!((s.geometric_mean(label.clone()) - (0.5f32 * 0.8).sqrt()).abs() < 1e-6);
    let d = detections(text, Kind::Boxes, 10, 10, Some(&s)).unwrap();
    assert!((d[0].score - 0.4f32.sqrt()).abs() < 1e-6);
    assert_eq!(s.geometric_mean(100..101), 0.0);
}

#[test]
fn the_spec_checks_the_request_and_bounds_the_answer() {
    assert_eq!(
        DetectSpec::new("  ", 3, false),
        Err(GroundingError::EmptyQuery)
    );
    assert_eq!(
        DetectSpec::new("cups", 0, false).unwrap().max_objects,
        DEFAULT_MAX_OBJECTS
    );
    assert!(matches!(
        DetectSpec::new("cups", MAX_OBJECTS_LIMIT + 1, false),
        Err(GroundingError::MaxObjects(_))
    ));
    let b = DetectSpec::new("cups", 2, false).unwrap();
    let longest = format!(
        r#"[{{"bbox_2d":[1000,1000,1000,1000],"label":"{0}"}},{{"bbox_2d":[1000,1000,1000,1000],"label":"{0}"}}]"#,
        "x".repeat(LABEL_MAX)
    );
    // One token per byte at worst, and the end token.
    assert_eq!(b.token_budget(), longest.len() + 1);
    let p = DetectSpec::new("doors", 1, true).unwrap();
    assert_eq!(p.kind, Kind::Points);
    assert!(p.prompt().contains("point_2d") && p.prompt().contains("doors"));
    assert!(b.prompt().contains("bbox_2d") && b.prompt().contains("1000"));
    let schema: serde_json::Value = serde_json::from_str(&b.schema_text()).unwrap();
    assert_eq!(schema["maxItems"], 2);
    assert_eq!(
        schema["items"]["properties"]["label"]["pattern"],
        LABEL_PATTERN
    );
    assert_eq!(fit_budget(&b, 1000, 100), Ok(b.token_budget()));
    assert!(matches!(
        fit_budget(&b, b.token_budget() + 99, 100),
        Err(GroundingError::DoesNotFit { .. })
    ));
}

/// The tower sees the frame resized to its square bucket with each axis scaled on its own
/// (`crate::vision::preprocess` calls `resize_bicubic(img, side, side)`), so a feature at a
/// fraction of the frame's width and height sits at the same fractions of the bucket: the
/// 0–1000 coordinates of the bucket are fractions of the original frame.
#[test]
fn the_bucket_stretches_each_axis_on_its_own() {
    let (w, h, side) = (160, 40, 32);
    // White where 25% ≤ x < 50% and 50% ≤ y < 75%, black elsewhere.
    let mut data = vec![0u8; w * h * 3];
    for y in h / 2..h * 3 / 4 {
        for x in w / 4..w / 2 {
            data[(y * w + x) * 3..(y * w + x) * 3 + 3].fill(255);
        }
    }
    let img = RgbImage::new(w, h, data).unwrap();
    let b = resize_bicubic(&img, side, side).unwrap();
    let px = |x: usize, y: usize| b.data[(y * side + x) * 3];
    // Inside the same fractions of the bucket (away from the filter's edge ringing): white.
    for y in side / 2 + 2..side * 3 / 4 - 2 {
        for x in side / 4 + 2..side / 2 - 2 {
            assert!(px(x, y) > 200, "({x},{y}) = {}", px(x, y));
        }
    }
    // Outside them: black.
    for (x, y) in [
        (side / 4 - 3, side * 5 / 8),
        (side / 2 + 2, side * 5 / 8),
        (side * 3 / 8, side / 2 - 3),
        (side * 3 / 8, side * 3 / 4 + 2),
    ] {
        assert!(px(x, y) < 40, "({x},{y}) = {}", px(x, y));
    }
}
