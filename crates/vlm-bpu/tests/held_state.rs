//! A decode state pinned on the device (`Device::pin`, with `BpuOptions::keep_set`): it
//! survives other runs, restores and resets in its own cache set, and `switch_to_pinned`
//! continues from it exactly as from the uninterrupted state; a newer pin replaces it; without
//! a third set (not asked for, or not to be had from the pool) nothing is pinned and the
//! backend works as before. A stashed state (`Device::stash`) stays in its set until a run or
//! a restore needs the set, and is taken up again exactly, from there or from its host copy.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use bpu_sim::{Sim, SimConfig};
use vlm::engine::{Backend, Device};
use vlm_bpu::{BpuBackend, BpuOptions};
use vlm_testkit::{continue_greedy, feed_text, golden_case, sim_package};

fn open(dir: &Path, keep_set: bool) -> BpuBackend {
    let opts = BpuOptions {
        no_vision: true,
        keep_set,
        ..BpuOptions::default()
    };
    BpuBackend::open(dir, &opts).unwrap()
}

#[test]
fn a_pinned_state_survives_other_work_and_continues_unchanged() {
    let d = tempfile::tempdir().unwrap();
    sim_package("tiny-sym", d.path(), |o| o.cache_len = 64);
    let mut b = open(d.path(), true);
    let k = golden_case("tiny-sym", "text_32");
    feed_text(&mut b, &k.ids[..7]);
    let id = b.pin().unwrap();
    let straight = continue_greedy(&mut b, 10);
    let (consumed, max_pos) = (7, Some(6));

    // Other work in every way the state can change: runs, a reset, a restore of another
    // state, more runs on it.
    b.reset().unwrap();
    feed_text(&mut b, &k.ids);
    let other = b.snapshot().unwrap();
    b.reset().unwrap();
    feed_text(&mut b, &k.ids[..3]);
    b.restore(&other).unwrap();
    continue_greedy(&mut b, 3);

    assert!(b.switch_to_pinned(id));
    assert_eq!((b.consumed(), b.max_pos()), (consumed, max_pos));
    assert_eq!(continue_greedy(&mut b, 10), straight);
    // Again, after that continuation wrote other sets: still there.
    assert!(b.switch_to_pinned(id));
    assert_eq!(continue_greedy(&mut b, 10), straight);
    // A restore while the kept state is current goes elsewhere, and leaves it kept.
    assert!(b.switch_to_pinned(id));
    b.restore(&other).unwrap();
    assert_eq!(b.consumed(), k.ids.len());
    assert!(b.switch_to_pinned(id));
    assert_eq!(continue_greedy(&mut b, 10), straight);

    // A newer keep replaces it.
    let newer = b.pin().unwrap();
    assert_ne!(newer, id);
    assert!(!b.switch_to_pinned(id));
    assert!(b.switch_to_pinned(newer));
}

#[test]
fn without_a_third_set_nothing_is_pinned() {
    let d = tempfile::tempdir().unwrap();
    sim_package("tiny-sym", d.path(), |o| o.cache_len = 64);
    let sim = Sim::new(SimConfig::defaults_with_env_flush().unwrap());
    sim.install();
    let used = |keep: bool| {
        let b = open(d.path(), keep);
        let used = sim.stats().pool_used;
        drop(b);
        used
    };
    let (two, three) = (used(false), used(true));
    assert!(
        three > two,
        "a third set takes pool memory: {two} vs {three}"
    );

    let mut b = open(d.path(), false);
    assert_eq!(b.pin(), None, "not asked for");
    drop(b);

    // Room for the graphs and two sets only: the backend opens without the third.
    sim.set_pool(Some((two + three) / 2));
    let mut b = open(d.path(), true);
    assert_eq!(b.pin(), None, "not to be had");
    let k = golden_case("tiny-sym", "text_32");
    feed_text(&mut b, &k.ids);
    assert_eq!(b.consumed(), k.ids.len());
}

#[test]
fn a_stashed_state_is_copied_out_only_when_its_set_is_needed() {
    let d = tempfile::tempdir().unwrap();
    sim_package("tiny-sym", d.path(), |o| o.cache_len = 64);
    let mut b = open(d.path(), true);
    let k = golden_case("tiny-sym", "text_32");
    feed_text(&mut b, &k.ids[..7]);
    let kept = b.pin().unwrap();
    b.reset().unwrap();
    feed_text(&mut b, &k.ids[..12]);
    let reference = b.snapshot().unwrap();
    let want = {
        let mut r = open_plain(d.path());
        r.restore(&reference).unwrap();
        continue_greedy(&mut r, 12)
    };

    // Parked, then taken up again with nothing in between: a switch of sets.
    let id = b.stash().unwrap();
    assert!(b.take_stash(id).unwrap());
    assert!(!b.take_stash(id).unwrap(), "taken up once");

    // Parked while the kept state answers: its first run has a free set, the second needs
    // the parked one, which moves to the host only then.
    let id = b.stash().unwrap();
    assert!(b.switch_to_pinned(kept));
    continue_greedy(&mut b, 1);
    assert!(b.stash_on_device());
    continue_greedy(&mut b, 1);
    assert!(!b.stash_on_device());
    assert!(b.take_stash(id).unwrap());
    assert_eq!((b.consumed(), b.max_pos()), (12, Some(11)));
    assert_eq!(continue_greedy(&mut b, 6)[..], want[..6]);

    // A reset and a restore leave a parked state alone too.
    let id = b.stash().unwrap();
    b.reset().unwrap();
    feed_text(&mut b, &k.ids[..3]);
    b.restore(&reference).unwrap();
    feed_text(&mut b, &k.ids[..2]);
    assert!(b.take_stash(id).unwrap());
    assert_eq!(continue_greedy(&mut b, 6)[..], want[6..]);
}

fn open_plain(dir: &Path) -> BpuBackend {
    open(dir, false)
}
