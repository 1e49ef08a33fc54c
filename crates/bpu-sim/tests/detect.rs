//! Package classification: sim containers vs real `.hbm`, decided before any library loads.
#![allow(clippy::unwrap_used)]

use bpu_sim::{
    inspect_package, Container, DetectError, GraphDesc, GraphKind, Implementation, TensorDesc,
};

fn sim_file(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let t = TensorDesc {
        shape: vec![1, 4],
        dtype: 7,
        strides: vec![-1, -1],
        scale: vec![],
    };
    let c = Container {
        header: bpu_sim::container::Header {
            graphs: vec![GraphDesc {
                name: "g".into(),
                kind: GraphKind::Affine { mul: 1.0, add: 0.0 },
                inputs: vec![t.clone()],
                outputs: vec![t],
                compile_cores: 1,
            }],
            config: None,
            has_weights: true,
            march: None,
        },
        payload: vec![],
    };
    let p = dir.join(name);
    c.write(&p).unwrap();
    p
}

fn board_file(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    let bytes: Vec<u8> = (0..8192u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn sim_and_board_sets() {
    let d = tempfile::tempdir().unwrap();
    let a = sim_file(d.path(), "model.hbm");
    let b = sim_file(d.path(), "visual.hbm");
    assert_eq!(
        inspect_package(&[&a, &b], None).unwrap(),
        Implementation::Sim
    );
    let r = board_file(d.path(), "real.hbm");
    assert_eq!(inspect_package(&[&r], None).unwrap(), Implementation::Board);
    assert_eq!(
        inspect_package(&[&r], Some(Implementation::Board)).unwrap(),
        Implementation::Board
    );
}

#[test]
fn mixed_sets_and_contradictions_name_the_file() {
    let d = tempfile::tempdir().unwrap();
    let a = sim_file(d.path(), "model.hbm");
    let r = board_file(d.path(), "model_prefill.hbm");
    let e = inspect_package(&[&a, &r], None).unwrap_err();
    assert!(matches!(e, DetectError::Mixed { .. }));
    assert!(e.to_string().contains("model_prefill.hbm"), "{e}");
    let e = inspect_package(&[&a], Some(Implementation::Board)).unwrap_err();
    assert!(matches!(e, DetectError::Contradiction { .. }));
    assert!(e.to_string().contains("model.hbm"), "{e}");
    assert!(matches!(
        inspect_package::<&std::path::Path>(&[], None),
        Err(DetectError::Empty)
    ));
}

#[test]
fn garbage_is_rejected_naming_the_file() {
    let d = tempfile::tempdir().unwrap();
    let text = d.path().join("notes.hbm");
    std::fs::write(&text, "x".repeat(10_000)).unwrap();
    let tiny = d.path().join("tiny.hbm");
    std::fs::write(&tiny, [0u8, 1, 2, 3]).unwrap();
    let good = sim_file(d.path(), "cut.hbm");
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(&good, &bytes[..bytes.len() - 10]).unwrap();
    let missing = d.path().join("missing.hbm");
    for (p, name) in [
        (&text, "notes.hbm"),
        (&tiny, "tiny.hbm"),
        (&good, "cut.hbm"),
        (&missing, "missing.hbm"),
    ] {
        let e = inspect_package(&[p], None).unwrap_err();
        assert!(e.to_string().contains(name), "{e}");
    }
    let mut v = std::fs::read(sim_file(d.path(), "v2.hbm")).unwrap();
    v[8] = 9;
    std::fs::write(d.path().join("v2.hbm"), v).unwrap();
    let e = inspect_package(&[d.path().join("v2.hbm")], None).unwrap_err();
    assert!(e.to_string().contains("version 9"), "{e}");
}
