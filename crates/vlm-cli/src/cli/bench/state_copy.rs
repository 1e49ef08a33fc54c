//! Host time of the decode-state copies an ask may wait for (`vlm bench --host-overhead`): a
//! snapshot (a stopped priming set aside), the same into a kept snapshot's memory, and a
//! restore (a primed frame, a cached system block, a session), of a state the size of a
//! primed image turn.

use std::time::Instant;

use serde_json::{json, Value};
use vlm::chat::Pos3;
use vlm::engine::{Backend, Engine};
use vlm_bpu::BpuBackend;

use super::median;

/// Rows of the measured state: a 4B priming (system block, user header, image block).
const ROWS: usize = 122;

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

pub(super) fn state_copies(
    engine: &mut Engine<BpuBackend>,
    repeats: usize,
) -> anyhow::Result<Value> {
    let b = engine.backend_mut();
    b.reset()?;
    let (vocab, context) = (b.info().vocab, b.info().context);
    let n = ROWS.min(context / 2).max(1);
    let ids: Vec<u32> = (0..n).map(|i| (i % vocab.max(1)) as u32).collect();
    let mut rows = Vec::new();
    b.embed(&ids, &mut rows)?;
    let positions: Vec<Pos3> = (0..n as u32).map(Pos3::text).collect();
    b.step(&rows, &positions)?;
    let (mut fresh, mut reusing, mut restore) = (Vec::new(), Vec::new(), Vec::new());
    let mut spare = b.snapshot()?;
    let bytes = spare.size_bytes();
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        drop(b.snapshot()?);
        fresh.push(ms(t));
        let t = Instant::now();
        let blob = b.snapshot_reusing(spare)?;
        reusing.push(ms(t));
        let t = Instant::now();
        b.restore(&blob)?;
        restore.push(ms(t));
        spare = blob;
    }
    b.reset()?;
    Ok(json!({
        "rows": n,
        "bytes": bytes,
        "snapshot_ms": median(&fresh),
        "snapshot_reusing_ms": median(&reusing),
        "restore_ms": median(&restore),
    }))
}
