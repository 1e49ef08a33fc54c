//! ION pool preflight: the package's `.hbm` files each go into one contiguous `ion_carveout`
//! buffer, and an allocation the pool cannot serve can crash the board (BLLM's notes) — so the
//! sizes are compared with the pool before anything is loaded, and again (with the two cache
//! sets) before any buffer is allocated.
//!
//! Board: every device-tree `reserved-memory` node whose name starts with `ion` is read
//! (`reg`: big-endian cells, no root needed) and reported. The pool is *identified* when
//! exactly one of them is an `ion_carveout*` node with a readable size (the S600 layout; the
//! S100P's is not yet confirmed). What happens then is [`PoolCheck`]'s choice: `strict`
//! refuses a pool identified and too small, and one that cannot be identified; `warn` (the
//! default) never refuses — both become a warning naming the fix — because the node names
//! are only confirmed on another SoC and a reading that looks too small may be a misreading;
//! `off` checks nothing. The buffers counted are the cache sets (two, or three with
//! [`BpuOptions::keep_set`](crate::BpuOptions::keep_set)) and the graphs' I/O.
//! Simulator: the pool of the calling thread's instance (`BPU_SIM_POOL_MB`), always exact.

use std::path::{Path, PathBuf};

use bpu_sim::Implementation;

use super::BpuError;

/// Env var: the device-tree `reserved-memory` folder to read (tests, unusual boards).
pub const DT_ENV: &str = "VLM_DT_RESERVED_MEMORY";
/// Where the live device tree exposes the reserved-memory nodes.
pub const DT_DEFAULT: &str = "/sys/firmware/devicetree/base/reserved-memory";
/// The exact fix for a board pool too small for the published 4B package.
pub const ION_FIX: &str =
    "sudo /usr/hobot/bin/hb_switch_ion.sh bpu_first && sudo reboot (the 4B package needs bpu_first)";

/// What the ION preflight does ([`BpuOptions::pool_check`](crate::BpuOptions::pool_check),
/// `--pool-check`, the node's `bpu_pool_check`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PoolCheck {
    /// Refuse when the pool is too small, and when it cannot be identified with certainty.
    Strict,
    /// Never refuse: a pool identified and too small is a warning naming the fix
    /// (`hb_switch_ion.sh`), one that cannot be identified a warning naming what was found.
    #[default]
    Warn,
    /// No preflight (a load the pool cannot hold still fails with the ION advice).
    Off,
}

impl PoolCheck {
    /// The spelling of flags and parameters.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolCheck::Strict => "strict",
            PoolCheck::Warn => "warn",
            PoolCheck::Off => "off",
        }
    }
}

impl std::fmt::Display for PoolCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for PoolCheck {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "strict" => Ok(PoolCheck::Strict),
            "warn" => Ok(PoolCheck::Warn),
            "off" => Ok(PoolCheck::Off),
            other => Err(format!("{other:?} is not strict, warn or off")),
        }
    }
}

/// One device-tree `reserved-memory` node whose name starts with `ion`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IonNode {
    /// The node's name (`ion_carveout@a0000000`).
    pub name: String,
    /// Its size from `reg`, or why it could not be read.
    pub size: Result<u64, String>,
}

impl std::fmt::Display for IonNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.size {
            Ok(n) => write!(f, "{} {n} bytes ({:.2} GiB)", self.name, *n as f64 / GIB),
            Err(e) => write!(f, "{} (size unreadable: {e})", self.name),
        }
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// Bytes the board loader is expected to take from the carveout for a `.hbm` of `len` bytes:
/// the file plus 0.1 % plus 2 MiB (observed on an S600: a 2,463,911,336-byte file asked for
/// 2,465,267,712 bytes, +0.055 %).
pub fn with_load_margin(len: u64) -> u64 {
    len + len / 1000 + (2 << 20)
}

/// Pool bytes a `.hbm` of `len` bytes takes when loaded: the board loader asks for slightly
/// more than the file (S600: +1.3 MB on 2.46 GB); the simulator takes the file size exactly.
pub(crate) fn load_bytes(implementation: Implementation, len: u64) -> u64 {
    match implementation {
        Implementation::Board => with_load_margin(len),
        Implementation::Sim => len,
    }
}

/// What is known about the pool the package will draw from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolReading {
    /// Free bytes; `None` = could not be read (the preflight only warns).
    pub available: Option<u64>,
    /// Where the number came from, or why it is missing.
    pub source: String,
    /// The fix to print when the pool is too small.
    pub fix: String,
    /// `available: None` because there is no limit (an unlimited simulator pool), not
    /// because the size could not be read: no warning.
    pub unlimited: bool,
    /// Every `ion*` reserved-memory node seen (board only).
    pub nodes: Vec<IonNode>,
}

impl PoolReading {
    /// What was found, for messages: the `ion*` nodes, or that there were none.
    pub fn found(&self) -> String {
        if self.nodes.is_empty() {
            "no ion* reserved-memory node".to_owned()
        } else {
            let nodes: Vec<String> = self.nodes.iter().map(ToString::to_string).collect();
            nodes.join(", ")
        }
    }
}

/// The pool `implementation` draws from.
pub(crate) fn reading(implementation: Implementation) -> PoolReading {
    match implementation {
        Implementation::Sim => sim_pool(),
        Implementation::Board => board_pool(),
    }
}

/// The pool left for buffers once `loaded` bytes of `.hbm` are in: the simulator is read
/// again (it counts what it gave out), while a board's reading is the carveout size from the
/// device tree, which does not move, so the loads are subtracted from it.
pub(crate) fn after_load(
    implementation: Implementation,
    before: &PoolReading,
    loaded: u64,
) -> PoolReading {
    match implementation {
        Implementation::Sim => sim_pool(),
        Implementation::Board => PoolReading {
            available: before.available.map(|a| a.saturating_sub(loaded)),
            ..before.clone()
        },
    }
}

/// The simulator's pool (`None` in the instance = unlimited).
pub fn sim_pool() -> PoolReading {
    let sim = bpu_sim::Sim::current();
    match sim.pool_available() {
        Some(a) => PoolReading {
            available: Some(a),
            source: format!("simulator pool ({})", bpu_sim::config::POOL_ENV),
            fix: format!(
                "raise {} (on a board: {ION_FIX})",
                bpu_sim::config::POOL_ENV
            ),
            unlimited: false,
            nodes: Vec::new(),
        },
        None => PoolReading {
            available: None,
            source: format!(
                "simulator pool unlimited ({} unset)",
                bpu_sim::config::POOL_ENV
            ),
            fix: String::new(),
            unlimited: true,
            nodes: Vec::new(),
        },
    }
}

/// The board's pool from the device tree at `VLM_DT_RESERVED_MEMORY` or [`DT_DEFAULT`].
pub fn board_pool() -> PoolReading {
    let dir = std::env::var_os(DT_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DT_DEFAULT), PathBuf::from);
    board_pool_at(&dir)
}

/// The pool described by the `reserved-memory` folder `dir`: identified when exactly one
/// `ion_carveout*` node with a readable size is there.
pub fn board_pool_at(dir: &Path) -> PoolReading {
    let nodes = match ion_nodes(dir) {
        Ok(n) => n,
        Err(reason) => {
            return PoolReading {
                available: None,
                source: reason,
                fix: ION_FIX.to_owned(),
                unlimited: false,
                nodes: Vec::new(),
            }
        }
    };
    let carveouts: Vec<&IonNode> = nodes
        .iter()
        .filter(|n| n.name.starts_with("ion_carveout"))
        .collect();
    let (available, source) = match carveouts.as_slice() {
        [one] => match &one.size {
            Ok(size) => (Some(*size), format!("{}/{}/reg", dir.display(), one.name)),
            Err(e) => (None, format!("{}: size unreadable: {e}", one.name)),
        },
        [] => (None, format!("{}: no ion_carveout node", dir.display())),
        many => (
            None,
            format!(
                "{}: {} ion_carveout nodes; which one the loader draws from is unknown",
                dir.display(),
                many.len()
            ),
        ),
    };
    PoolReading {
        available,
        source,
        fix: ION_FIX.to_owned(),
        unlimited: false,
        nodes,
    }
}

/// Every node of `dir` whose name starts with `ion`, sorted by name, with its size.
pub fn ion_nodes(dir: &Path) -> Result<Vec<IonNode>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut nodes: Vec<IonNode> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            name.starts_with("ion").then(|| IonNode {
                size: reg_size(&e.path().join("reg")),
                name,
            })
        })
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(nodes)
}

/// The size in a `reg` property: big-endian 32-bit cells, `[addr_hi addr_lo size_hi
/// size_lo]` (two address and two size cells) or `[addr size]`.
fn reg_size(reg: &Path) -> Result<u64, String> {
    let bytes = std::fs::read(reg).map_err(|e| format!("{}: {e}", reg.display()))?;
    let cells: Vec<u64> = bytes
        .chunks_exact(4)
        .map(|c| u64::from(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
        .collect();
    match (bytes.len() % 4, cells.as_slice()) {
        (0, [_, _, hi, lo]) => Ok((hi << 32) | lo),
        (0, [_, size]) => Ok(*size),
        _ => Err(format!(
            "{}: {} bytes is not a [addr size] cell pair",
            reg.display(),
            bytes.len()
        )),
    }
}

/// Cache sets the buffers hold: the two a run ping-pongs between, and the optional third
/// one a kept state lives in ([`BpuOptions::keep_set`](crate::BpuOptions::keep_set)).
pub fn cache_sets(keep_set: bool) -> u64 {
    if keep_set {
        3
    } else {
        2
    }
}

/// Whether an identified pool is known to be too small for `needed` bytes.
pub fn known_too_small(needed: u64, pool: &PoolReading) -> bool {
    pool.available.is_some_and(|a| needed > a)
}

/// The preflight of `needed` bytes against `pool`, as `mode` says: `strict` refuses a pool
/// too small or not identified; `warn` only warns in both cases; `off` checks nothing.
/// `Ok(Some(warning))` carries the warning (already logged) for reports.
pub fn check(
    what: &str,
    needed: u64,
    pool: &PoolReading,
    file: &Path,
    mode: PoolCheck,
) -> Result<Option<String>, BpuError> {
    if mode == PoolCheck::Off {
        tracing::debug!(what, needed, "ION pool preflight off");
        return Ok(None);
    }
    match pool.available {
        Some(avail) if needed > avail => {
            let refusal = BpuError::Pool {
                path: file.to_owned(),
                what: what.to_owned(),
                needed,
                available: avail,
                source_desc: pool.source.clone(),
                fix: pool.fix.clone(),
            };
            if mode == PoolCheck::Strict {
                return Err(refusal);
            }
            // The reading may be wrong (its node names are not confirmed on every SoC): the
            // board is trusted, and the user told what to run if the load then fails.
            let msg = refusal.to_string();
            let prefix = format!("{}: ", file.display());
            let w = format!(
                "{}; loading anyway under --pool-check warn (strict refuses)",
                msg.strip_prefix(&prefix).unwrap_or(&msg)
            );
            tracing::warn!(file = %file.display(), "{w}");
            Ok(Some(w))
        }
        Some(avail) => {
            tracing::info!(what, needed, available = avail, source = %pool.source, "ION pool preflight passed");
            Ok(None)
        }
        None if pool.unlimited => Ok(None),
        None if mode == PoolCheck::Strict => Err(BpuError::PoolUnknown {
            path: file.to_owned(),
            what: what.to_owned(),
            needed,
            reason: pool.source.clone(),
            found: pool.found(),
        }),
        None => {
            let w = format!(
                "{what} need {needed} bytes; ION pool not identified with certainty ({}; \
                 found: {}): loading without the preflight (--pool-check strict refuses instead)",
                pool.source,
                pool.found()
            );
            tracing::warn!(file = %file.display(), "{w}");
            Ok(Some(w))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn node(dir: &Path, name: &str, cells: Option<&[u32]>) {
        let n = dir.join(name);
        std::fs::create_dir(&n).unwrap();
        if let Some(c) = cells {
            let bytes: Vec<u8> = c.iter().flat_map(|c| c.to_be_bytes()).collect();
            std::fs::write(n.join("reg"), bytes).unwrap();
        }
    }

    #[test]
    fn every_ion_node_is_read_and_one_carveout_identifies_the_pool() {
        let d = tempfile::tempdir().unwrap();
        // 0x1_0000_0000 + 0x2000_0000 = 4.5 GiB.
        node(
            d.path(),
            "ion_carveout@a0000000",
            Some(&[0, 0xa000_0000, 1, 0x2000_0000]),
        );
        node(
            d.path(),
            "ion_reserved@80000000",
            Some(&[0x8000_0000, 0x4000_0000]),
        );
        node(d.path(), "ion_cma@70000000", None);
        node(d.path(), "bpu_region@60000000", Some(&[0, 1]));
        let r = board_pool_at(d.path());
        assert_eq!(r.available, Some((1 << 32) + 0x2000_0000));
        assert!(
            r.source.ends_with("ion_carveout@a0000000/reg"),
            "{}",
            r.source
        );
        let names: Vec<&str> = r.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "ion_carveout@a0000000",
                "ion_cma@70000000",
                "ion_reserved@80000000"
            ]
        );
        assert_eq!(r.nodes[2].size, Ok(0x4000_0000));
        let found = r.found();
        assert!(
            found.contains("ion_reserved@80000000 1073741824 bytes (1.00 GiB)"),
            "{found}"
        );
        assert!(
            found.contains("ion_cma@70000000 (size unreadable"),
            "{found}"
        );
    }

    #[test]
    fn a_pool_not_identified_with_certainty_says_what_was_found() {
        let d = tempfile::tempdir().unwrap();
        node(
            d.path(),
            "ion_reserved@80000000",
            Some(&[0x8000_0000, 0x4000_0000]),
        );
        let r = board_pool_at(d.path());
        assert_eq!(r.available, None);
        assert!(r.source.contains("no ion_carveout node"), "{}", r.source);
        assert!(r.found().contains("ion_reserved@80000000"));
        node(d.path(), "ion_carveout@a0000000", Some(&[0, 0x1000]));
        node(d.path(), "ion_carveout@b0000000", Some(&[0, 0x2000]));
        let r = board_pool_at(d.path());
        assert_eq!(r.available, None);
        assert!(r.source.contains("2 ion_carveout nodes"), "{}", r.source);
        let bad = tempfile::tempdir().unwrap();
        node(bad.path(), "ion_carveout@a0000000", None);
        std::fs::write(bad.path().join("ion_carveout@a0000000/reg"), [0u8; 6]).unwrap();
        let r = board_pool_at(bad.path());
        assert_eq!(r.available, None);
        assert!(
            r.source.contains("not a [addr size] cell pair"),
            "{}",
            r.source
        );
        let r = board_pool_at(&d.path().join("nope"));
        assert!(r.available.is_none() && r.nodes.is_empty());
    }

    #[test]
    fn the_three_modes() {
        let f = Path::new("model.hbm");
        let known = PoolReading {
            available: Some(100),
            source: "test".into(),
            fix: ION_FIX.into(),
            unlimited: false,
            nodes: Vec::new(),
        };
        let unknown = PoolReading {
            available: None,
            ..known.clone()
        };
        for mode in [PoolCheck::Strict, PoolCheck::Warn] {
            assert!(matches!(check("x", 100, &known, f, mode), Ok(None)));
        }
        // Too small: `strict` refuses, naming the fix; `warn` loads with a warning naming it.
        let e = check("x", 101, &known, f, PoolCheck::Strict).unwrap_err();
        assert!(matches!(e, BpuError::Pool { .. }), "{e}");
        assert!(e.to_string().contains("hb_switch_ion.sh bpu_first"), "{e}");
        let w = check("x", 101, &known, f, PoolCheck::Warn)
            .unwrap()
            .unwrap();
        assert!(
            w.contains("hb_switch_ion.sh bpu_first") && w.contains("loading anyway"),
            "{w}"
        );
        assert!(matches!(
            check("x", 101, &known, f, PoolCheck::Off),
            Ok(None)
        ));
        let w = check("x", 101, &unknown, f, PoolCheck::Warn)
            .unwrap()
            .unwrap();
        assert!(w.contains("not identified"), "{w}");
        assert!(matches!(
            check("x", 101, &unknown, f, PoolCheck::Off),
            Ok(None)
        ));
        let e = check("x", 101, &unknown, f, PoolCheck::Strict).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("cannot be identified") && msg.contains("--pool-check warn"),
            "{msg}"
        );
        assert_eq!(PoolCheck::default(), PoolCheck::Warn);
        for m in [PoolCheck::Strict, PoolCheck::Warn, PoolCheck::Off] {
            assert_eq!(m.as_str().parse::<PoolCheck>(), Ok(m));
        }
        assert!("loose".parse::<PoolCheck>().is_err());
    }

    #[test]
    fn the_load_margin_covers_the_observed_request() {
        assert!(with_load_margin(2_463_911_336) >= 2_465_267_712);
    }
}
