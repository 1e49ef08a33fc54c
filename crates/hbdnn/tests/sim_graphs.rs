//! Contract graphs of a sim package (built from the committed tiny fixture) run through the
//! wrapper and the simulator's function table, checked against `crates/qwen35` on the CPU
//! path (growing K/V, positions → its own rope tables), an independent code path.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use bpu_sim::package::{make_sim_package, PackageOptions, PrefillIn};
use bpu_sim::{LogitsType, Sim, SimConfig};
use hbdnn::{DeviceBuffer, Graph, PackedModel, Runtime, Sched, TensorSpec};
use qwen35::{window_mask, LogitRows, Pos3, Qwen35Model, SequenceState};

/// Named tolerance of f32 logits between two computation orders.
const F32_TOL: f32 = 1e-4;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/fixtures/models/tiny-sym")
}

fn package(dir: &Path, tweak: impl FnOnce(&mut PackageOptions)) {
    let mut o = PackageOptions::new(&fixture_dir(), dir);
    o.cache_len = 24;
    o.prefill_chunk = 6;
    tweak(&mut o);
    make_sim_package(&o).unwrap();
}

fn runtime() -> (Sim, Runtime) {
    let sim = Sim::new(SimConfig::default());
    sim.install();
    (sim, Runtime::new(bpu_sim::table().unwrap()))
}

/// `model.hbm` and `model_prefill.hbm` of a package, as one packed handle.
fn load_both(rt: &Runtime, dir: &Path) -> PackedModel {
    rt.load(&[dir.join("model.hbm"), dir.join("model_prefill.hbm")])
        .unwrap()
}

/// Decode/prefill buffers plus the two cache sets.
struct Engine {
    decode: Graph,
    fixed: Vec<DeviceBuffer>,
    logits: DeviceBuffer,
    sets: [Vec<DeviceBuffer>; 2],
    phase: usize,
    consumed: usize,
    cl: usize,
    heads: usize,
}

impl Engine {
    fn new(decode: Graph) -> Self {
        let n_cache = decode.inputs().len() - 4;
        let fixed = (0..4).map(|i| decode.alloc_input(i).unwrap()).collect();
        let logits = decode.alloc_output(0).unwrap();
        let sets = [0, 1].map(|_| {
            (0..n_cache)
                .map(|c| decode.alloc_input(4 + c).unwrap())
                .collect()
        });
        let mask = &decode.inputs()[3];
        Self {
            cl: mask.shape[1],
            heads: mask.shape[0],
            decode,
            fixed,
            logits,
            sets,
            phase: 0,
            consumed: 0,
        }
    }

    fn write(buf: &mut DeviceBuffer, spec: &TensorSpec, data: &[f32]) {
        buf.write_tensor(spec, data).unwrap();
        buf.clean().unwrap();
    }

    fn step(&mut self, model: &qwen35::TextModel, x: &[f32], pos: i64) -> Vec<f32> {
        let (cos, sin) = model.rope_tables(&[Pos3::text(pos)]);
        let mask = window_mask(self.consumed, 1, self.cl, self.heads);
        let specs = self.decode.inputs().to_vec();
        for (i, data) in [x, &cos, &sin, &mask].into_iter().enumerate() {
            Self::write(&mut self.fixed[i], &specs[i], data);
        }
        self.run_graph(&self.decode.clone(), 1);
        self.read_logits(&self.decode.outputs()[0].clone())
    }

    fn run_graph(&mut self, g: &Graph, rows: usize) {
        let (a, b) = self.sets.split_at_mut(1);
        let (cur, next) = if self.phase == 0 {
            (&a[0], &mut b[0])
        } else {
            (&b[0], &mut a[0])
        };
        let mut inputs: Vec<&DeviceBuffer> = self.fixed.iter().collect();
        inputs.extend(cur.iter());
        let mut outputs: Vec<&mut DeviceBuffer> = vec![&mut self.logits];
        outputs.extend(next.iter_mut());
        g.run(&inputs, &mut outputs, &Sched::default()).unwrap();
        self.logits.invalidate().unwrap();
        self.phase ^= 1;
        self.consumed += rows;
    }

    fn read_logits(&self, spec: &TensorSpec) -> Vec<f32> {
        let rows = spec.shape[spec.rank() - 2];
        let off = (rows - 1) * spec.row_stride();
        let vocab = spec.last_dim();
        match spec.dtype {
            hbdnn::DType::F32 => self.logits.read_rows::<f32>(off, 0, vocab, 1).unwrap(),
            hbdnn::DType::S16 => {
                let s = spec.scale0();
                self.logits
                    .read_rows::<i16>(off, 0, vocab, 1)
                    .unwrap()
                    .iter()
                    .map(|&q| q as f32 * s)
                    .collect()
            }
            other => panic!("logits dtype {other:?}"),
        }
    }

    /// The current cache set as the BPU left it.
    fn cache(&mut self, c: usize) -> Vec<f32> {
        let spec = self.decode.inputs()[4 + c].clone();
        let buf = &mut self.sets[self.phase][c];
        buf.invalidate().unwrap();
        buf.read_tensor::<f32>(&spec).unwrap()
    }
}

fn reference() -> Qwen35Model {
    Qwen35Model::load(&fixture_dir()).unwrap()
}

fn cpu_step(m: &qwen35::TextModel, st: &mut SequenceState, x: &[f32], pos: i64) -> Vec<f32> {
    m.forward(x, &[Pos3::text(pos)], st, LogitRows::Last)
        .unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn tokens() -> Vec<u32> {
    (0..20).map(|i| (i * 37 + 11) % 600).collect()
}

#[test]
fn graph_specs_match_the_contract() {
    let d = tempfile::tempdir().unwrap();
    package(d.path(), |_| {});
    let (_sim, rt) = runtime();
    let m = load_both(&rt, d.path());
    assert_eq!(
        m.graph_names(),
        ["qwen35".to_string(), "qwen35_prefill".to_string()]
    );
    let dec = m.graph("qwen35").unwrap();
    let pre = m.graph("qwen35_prefill").unwrap();
    let cfg = reference().config.text;
    let n_cache = 2 * cfg.layer_types.len();
    assert_eq!(dec.inputs().len(), 4 + n_cache);
    assert_eq!(dec.outputs().len(), 1 + n_cache);
    assert_eq!(dec.inputs()[0].shape, vec![1, cfg.hidden_size]);
    assert_eq!(dec.inputs()[1].shape, vec![1, cfg.rotary_dim]);
    assert_eq!(dec.inputs()[3].shape, vec![cfg.num_attention_heads, 24]);
    assert_eq!(dec.outputs()[0].shape, vec![1, cfg.vocab_size]);
    assert_eq!(pre.inputs()[0].shape, vec![6, cfg.hidden_size]);
    assert_eq!(pre.inputs()[3].shape, vec![cfg.num_attention_heads, 6, 24]);
    assert_eq!(
        pre.outputs()[0].shape,
        vec![1, cfg.vocab_size],
        "last-row logits by default"
    );
    // Multi-row tensors have padded row pitches; the runtime must honour them.
    assert!(pre.inputs()[0].row_stride() > cfg.hidden_size * 4);
    for c in 0..n_cache {
        let (i, o, p) = (
            &dec.inputs()[4 + c],
            &dec.outputs()[1 + c],
            &pre.inputs()[4 + c],
        );
        assert_eq!(
            i.byte_size, o.byte_size,
            "cache {c}: input/output layouts differ"
        );
        assert_eq!(
            (i.byte_size, &i.strides),
            (p.byte_size, &p.strides),
            "cache {c}: decode/prefill differ"
        );
        let window = i.rank() >= 2 && i.shape[0] == 24 && i.strides[0] * 24 == i.byte_size;
        let is_attn = cfg.layer_types[c / 2] == qwen35::LayerType::FullAttention;
        assert_eq!(window, is_attn, "cache {c}: window classification");
    }
    // Conv caches are [conv_dim, 3] f32: 12-byte rows resolved to a 32-byte pitch.
    let conv = &dec.inputs()[5];
    assert_eq!(conv.reported_strides, vec![-1, -1]);
    assert_eq!(conv.strides, vec![32, 4]);
    let vis_m = rt.load(&[d.path().join("visual.hbm")]).unwrap();
    let vis = vis_m.graph("visual").unwrap();
    assert_eq!(vis.inputs()[0].shape, vec![400, 1536]);
    assert_eq!(vis.outputs()[0].shape, vec![100, cfg.hidden_size]);
    let mj: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.path().join("model.json")).unwrap())
            .unwrap();
    for key in [
        "arch",
        "graph",
        "hbm",
        "hbm_prefill",
        "embed",
        "tokenizer",
        "visual",
        "eos",
        "chat",
        "rope_theta",
        "mrope_section",
        "mrope_interleaved",
        "vision",
        "cache_len",
        "prefill_pads",
        "prefill_min_tail",
        "dialect",
        "image_token_id",
    ] {
        assert!(mj.get(key).is_some(), "model.json lacks {key}");
    }
    assert_eq!(mj["eos"], serde_json::json!([602, 600]));
    assert_eq!(
        std::fs::metadata(d.path().join("embed_tokens.bin"))
            .unwrap()
            .len(),
        (cfg.vocab_size * cfg.hidden_size * 2) as u64
    );
}

#[test]
fn decode_steps_match_qwen35_and_window_shifts() {
    let d = tempfile::tempdir().unwrap();
    package(d.path(), |_| {});
    let r = reference();
    let (sim, rt) = runtime();
    {
        let m = rt.load(&[d.path().join("model.hbm")]).unwrap();
        let mut e = Engine::new(m.graph("qwen35").unwrap());
        let mut cpu = r.text.new_state();
        let k_idx = 2 * 3; // layer 3 is the attention layer: caches 6 (K) and 7 (V)
        let ids = tokens();
        let mut prev_k: Vec<f32> = Vec::new();
        for (p, &id) in ids.iter().enumerate() {
            let x = r.text.embed(&[id]).unwrap();
            let bpu = e.step(&r.text, &x, p as i64);
            let cpu_l = cpu_step(&r.text, &mut cpu, &x, p as i64);
            let diff = max_diff(&bpu, &cpu_l);
            assert!(diff <= F32_TOL, "step {p}: max |Δ| = {diff}");
            // Window: right-aligned occupancy, shifted by one row per step.
            let k = e.cache(k_idx);
            let row = k.len() / 24;
            let used = p + 1;
            assert!(
                k[..(24 - used) * row].iter().all(|&v| v == 0.0),
                "step {p}: rows before the window are not zero"
            );
            assert!(k[(24 - used) * row..].iter().any(|&v| v != 0.0));
            if p > 0 {
                assert_eq!(
                    &k[(24 - used) * row..(24 - 1) * row],
                    &prev_k[(24 - p) * row..],
                    "step {p}: shift"
                );
            }
            prev_k = k;
        }
    }
    let s = sim.stats();
    assert_eq!((s.live_buffers, s.live_tasks, s.live_packed), (0, 0, 0));
}

/// Two prefill chunks must equal 2N decode steps: logits, every cache, and the next step.
fn check_prefill(r: &Qwen35Model, dec: Graph, pre: &Graph) {
    let ids = tokens();
    let n = pre.inputs()[0].shape[0];
    let cl = pre.inputs()[3].shape[2];
    // Stepping: one decode run per row.
    let mut step = Engine::new(dec.clone());
    let mut stepped = Vec::new();
    for (p, &id) in ids[..2 * n].iter().enumerate() {
        stepped = step.step(&r.text, &r.text.embed(&[id]).unwrap(), p as i64);
    }
    // Prefill: two chunks of N rows on the same kind of cache buffers.
    let mut e = Engine::new(dec);
    let mut fixed: Vec<DeviceBuffer> = (0..4).map(|i| pre.alloc_input(i).unwrap()).collect();
    std::mem::swap(&mut e.fixed, &mut fixed);
    let mut logits = pre.alloc_output(0).unwrap();
    std::mem::swap(&mut e.logits, &mut logits);
    for chunk in 0..2 {
        let rows = &ids[chunk * n..(chunk + 1) * n];
        let x = r.text.embed(rows).unwrap();
        let pos: Vec<Pos3> = (0..n).map(|j| Pos3::text((chunk * n + j) as i64)).collect();
        let (cos, sin) = r.text.rope_tables(&pos);
        let mask = window_mask(e.consumed, n, cl, e.heads);
        let specs = pre.inputs().to_vec();
        for (i, data) in [&x, &cos, &sin, &mask].into_iter().enumerate() {
            Engine::write(&mut e.fixed[i], &specs[i], data);
        }
        e.run_graph(pre, n);
    }
    let got = e.read_logits(&pre.outputs()[0]);
    let diff = max_diff(&got, &stepped);
    assert!(diff <= F32_TOL, "prefill vs stepping: {diff}");
    for c in 0..pre.inputs().len() - 4 {
        let a = e.cache(c);
        let b = step.cache(c);
        assert!(max_diff(&a, &b) <= F32_TOL, "cache {c}");
    }
    // Decoding continues identically after a prefill.
    std::mem::swap(&mut e.fixed, &mut fixed);
    std::mem::swap(&mut e.logits, &mut logits);
    let x = r.text.embed(&[ids[2 * n]]).unwrap();
    let a = e.step(&r.text, &x, (2 * n) as i64);
    let b = step.step(&r.text, &x, (2 * n) as i64);
    assert!(max_diff(&a, &b) <= F32_TOL);
}

#[test]
fn prefill_chunk_equals_decode_steps() {
    let d = tempfile::tempdir().unwrap();
    package(d.path(), |_| {});
    let r = reference();
    let (sim, rt) = runtime();
    {
        let m = load_both(&rt, d.path());
        check_prefill(
            &r,
            m.graph("qwen35").unwrap(),
            &m.graph("qwen35_prefill").unwrap(),
        );
    }
    let s = sim.stats();
    assert_eq!(
        (s.live_buffers, s.live_tasks, s.live_packed, s.pool_used),
        (0, 0, 0, 0)
    );
}

#[test]
fn prefill_variants_equal_decode_steps() {
    let r = reference();
    let (_sim, rt) = runtime();
    // Prefill graph inside model.hbm, one mask plane, all-row logits.
    let d = tempfile::tempdir().unwrap();
    package(d.path(), |o| {
        o.prefill_in = PrefillIn::Model;
        o.mask_heads_one = true;
        o.prefill_logits_all = true;
    });
    assert!(!d.path().join("model_prefill.hbm").exists());
    let m = rt.load(&[d.path().join("model.hbm")]).unwrap();
    let pre = m.graph("qwen35_prefill").unwrap();
    assert_eq!(pre.inputs()[3].shape, vec![1, 6, 24]);
    assert_eq!(pre.outputs()[0].shape, vec![6, 640]);
    check_prefill(&r, m.graph("qwen35").unwrap(), &pre);
    // Both: model.hbm carries an older all-rows graph, model_prefill.hbm the last-row one;
    // loaded as separate packed handles, each is a valid prefill graph.
    let d = tempfile::tempdir().unwrap();
    package(d.path(), |o| o.prefill_in = PrefillIn::Both);
    let main = rt.load(&[d.path().join("model.hbm")]).unwrap();
    let newer = rt.load(&[d.path().join("model_prefill.hbm")]).unwrap();
    assert_eq!(
        main.graph_names(),
        ["qwen35".to_string(), "qwen35_prefill".to_string()]
    );
    assert_eq!(
        main.graph("qwen35_prefill").unwrap().outputs()[0].shape,
        vec![6, 640]
    );
    let pre = newer.graph("qwen35_prefill").unwrap();
    assert_eq!(pre.outputs()[0].shape, vec![1, 640]);
    check_prefill(&r, main.graph("qwen35").unwrap(), &pre);
    check_prefill(
        &r,
        main.graph("qwen35").unwrap(),
        &main.graph("qwen35_prefill").unwrap(),
    );
}

#[test]
fn no_weights_package_runs_on_timing_only() {
    let d = tempfile::tempdir().unwrap();
    package(d.path(), |o| o.no_weights = true);
    let (sim, rt) = runtime();
    sim.set_timing(Some(bpu_sim::TimingModel {
        decode: std::time::Duration::from_millis(40),
        ..Default::default()
    }));
    let m = rt.load(&[d.path().join("model.hbm")]).unwrap();
    let mut e = Engine::new(m.graph("qwen35").unwrap());
    let r = reference();
    let t0 = std::time::Instant::now();
    let l = e.step(&r.text, &vec![0.0; 64], 0);
    assert!(t0.elapsed() >= std::time::Duration::from_millis(40));
    assert_eq!(l.len(), 640);
    // The fixed synthetic logits: LM-shaped, not a constant row.
    assert!(l.iter().all(|&v| (-2.0..14.0).contains(&v)), "{l:?}");
    assert!(l.iter().any(|&v| v < -1.0) && l.iter().any(|&v| v > 1.0));
    let embed = std::fs::metadata(d.path().join("embed_tokens.bin"))
        .unwrap()
        .len();
    assert_eq!(embed, 640 * 64 * 2);
    assert!(std::fs::metadata(d.path().join("model.hbm")).unwrap().len() < 64 * 1024);
}

#[test]
fn s16_logits_dequantise_within_half_a_step() {
    let d = tempfile::tempdir().unwrap();
    package(d.path(), |o| {
        o.logits = LogitsType::S16;
        o.mask_heads_one = true;
        o.prefill_in = PrefillIn::None;
    });
    let r = reference();
    let (_sim, rt) = runtime();
    let m = rt.load(&[d.path().join("model.hbm")]).unwrap();
    assert_eq!(m.graph_names(), ["qwen35".to_string()]);
    let mut e = Engine::new(m.graph("qwen35").unwrap());
    assert_eq!(e.heads, 1);
    let spec = e.decode.outputs()[0].clone();
    assert_eq!(spec.dtype, hbdnn::DType::S16);
    let scale = spec.scale0();
    let mut cpu = r.text.new_state();
    for (p, &id) in tokens()[..5].iter().enumerate() {
        let x = r.text.embed(&[id]).unwrap();
        let got = e.step(&r.text, &x, p as i64);
        let want = cpu_step(&r.text, &mut cpu, &x, p as i64);
        let diff = max_diff(&got, &want);
        assert!(diff <= scale / 2.0 + 1e-4, "step {p}: {diff} > {scale}/2");
    }
}

#[test]
fn visual_graph_matches_the_tower() {
    let d = tempfile::tempdir().unwrap();
    package(d.path(), |_| {});
    let r = reference();
    let (_sim, rt) = runtime();
    let m = rt.load(&[d.path().join("visual.hbm")]).unwrap();
    let g = m.graph("visual").unwrap();
    let px: Vec<f32> = (0..400 * 1536usize)
        .map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let mut inp = g.alloc_input(0).unwrap();
    let mut out = g.alloc_output(0).unwrap();
    inp.write_tensor(&g.inputs()[0], &px).unwrap();
    inp.clean().unwrap();
    g.run(&[&inp], &mut [&mut out], &Sched::default()).unwrap();
    out.invalidate().unwrap();
    let got = out.read_tensor::<f32>(&g.outputs()[0]).unwrap();
    let want = r
        .vision
        .as_ref()
        .unwrap()
        .forward(&px, &[qwen35::ImageGrid { t: 1, h: 20, w: 20 }])
        .unwrap();
    assert!(max_diff(&got, &want) <= F32_TOL);
}

/// The padded-tail variant (docs/package-contract.md §4.4, inferred protocol): a chunk of t real rows + pads,
/// followed by the runtime's K/V fix-up, equals t decode steps.
#[test]
fn padded_prefill_tail_equals_decode_steps() {
    let d = tempfile::tempdir().unwrap();
    package(d.path(), |o| {
        o.prefill_pads = true;
        o.prefill_min_tail = Some(3);
    });
    let mj: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.path().join("model.json")).unwrap())
            .unwrap();
    assert_eq!(
        (
            mj["prefill_pads"].as_bool(),
            mj["prefill_min_tail"].as_u64()
        ),
        (Some(true), Some(3))
    );
    let r = reference();
    let (_sim, rt) = runtime();
    let m = load_both(&rt, d.path());
    let dec = m.graph("qwen35").unwrap();
    let pre = m.graph("qwen35_prefill").unwrap();
    let (n, cl, t) = (6usize, 24usize, 4usize);
    let ids = tokens();
    let mut step = Engine::new(dec.clone());
    let mut stepped = Vec::new();
    for (p, &id) in ids[..n + t].iter().enumerate() {
        stepped = step.step(&r.text, &r.text.embed(&[id]).unwrap(), p as i64);
    }
    let mut e = Engine::new(dec);
    let mut fixed: Vec<DeviceBuffer> = (0..4).map(|i| pre.alloc_input(i).unwrap()).collect();
    std::mem::swap(&mut e.fixed, &mut fixed);
    let mut logits = pre.alloc_output(0).unwrap();
    std::mem::swap(&mut e.logits, &mut logits);
    for (start, real) in [(0, n), (n, t)] {
        let mut x = r.text.embed(&ids[start..start + real]).unwrap();
        x.resize(n * 64, 0.0);
        let mut pos: Vec<Pos3> = (0..real).map(|j| Pos3::text((start + j) as i64)).collect();
        pos.resize(n, Pos3::text(0));
        let (cos, sin) = r.text.rope_tables(&pos);
        let mut mask = window_mask(e.consumed, n, cl, e.heads);
        for h in 0..e.heads {
            for j in real..n {
                mask[(h * n + j) * cl..(h * n + j + 1) * cl].fill(qwen35::MASK_NEG);
            }
        }
        let specs = pre.inputs().to_vec();
        for (i, data) in [&x, &cos, &sin, &mask].into_iter().enumerate() {
            Engine::write(&mut e.fixed[i], &specs[i], data);
        }
        e.run_graph(&pre, real);
        // Host fix-up: move each K/V window right by the pad count, zero the front.
        let pad = n - real;
        if pad > 0 {
            for c in 0..pre.inputs().len() - 4 {
                let spec = pre.inputs()[4 + c].clone();
                if !(spec.shape[0] == cl && spec.strides[0] * cl == spec.byte_size) {
                    continue;
                }
                let s0 = spec.strides[0];
                let buf = &mut e.sets[e.phase][c];
                buf.invalidate().unwrap();
                let bytes = buf.as_mut_bytes();
                bytes.copy_within(0..(cl - pad) * s0, pad * s0);
                bytes[..pad * s0].fill(0);
                buf.clean().unwrap();
            }
        }
    }
    let got = e.read_logits(&pre.outputs()[0]);
    assert!(max_diff(&got, &stepped) <= F32_TOL, "padded tail logits");
    for c in 0..pre.inputs().len() - 4 {
        assert!(
            max_diff(&e.cache(c), &step.cache(c)) <= F32_TOL,
            "cache {c}"
        );
    }
    std::mem::swap(&mut e.fixed, &mut fixed);
    std::mem::swap(&mut e.logits, &mut logits);
    let x = r.text.embed(&[ids[n + t]]).unwrap();
    let a = e.step(&r.text, &x, (n + t) as i64);
    let b = step.step(&r.text, &x, (n + t) as i64);
    assert!(max_diff(&a, &b) <= F32_TOL);
}
