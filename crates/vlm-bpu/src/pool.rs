//! ION pool preflight: the package's `.hbm` files each go into one contiguous `ion_carveout`
//! buffer, and an allocation the pool cannot serve can crash the board (BLLM's notes) — so the
//! sizes are compared with the pool before anything is loaded, and again (with the two cache
//! sets) before any buffer is allocated.
//!
//! Board: the carveout size is read from the device tree (`reserved-memory/ion_carveout*/reg`,
//! big-endian cells, no root needed). The node names are S600 readings not yet confirmed on an
//! S100P, so when no node can be read the preflight warns and goes on. Simulator: the pool of
//! the calling thread's instance (`BPU_SIM_POOL_MB`).

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
        },
        None => PoolReading {
            available: None,
            source: format!(
                "simulator pool unlimited ({} unset)",
                bpu_sim::config::POOL_ENV
            ),
            fix: String::new(),
            unlimited: true,
        },
    }
}

/// The board's `ion_carveout` size from the device tree at `VLM_DT_RESERVED_MEMORY` or
/// [`DT_DEFAULT`].
pub fn board_pool() -> PoolReading {
    let dir = std::env::var_os(DT_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DT_DEFAULT), PathBuf::from);
    match carveout_size(&dir) {
        Ok((node, size)) => PoolReading {
            available: Some(size),
            source: format!("{}/reg", node.display()),
            fix: ION_FIX.to_owned(),
            unlimited: false,
        },
        Err(reason) => PoolReading {
            available: None,
            source: reason,
            fix: ION_FIX.to_owned(),
            unlimited: false,
        },
    }
}

/// Size of the first `ion_carveout*` node under `dir`: `reg` holds big-endian 32-bit cells,
/// `[addr_hi addr_lo size_hi size_lo]` (two address and two size cells) or `[addr size]`.
pub fn carveout_size(dir: &Path) -> Result<(PathBuf, u64), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut nodes: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("ion_carveout"))
        })
        .collect();
    nodes.sort();
    let node = nodes
        .into_iter()
        .next()
        .ok_or_else(|| format!("{}: no ion_carveout node", dir.display()))?;
    let reg = node.join("reg");
    let bytes = std::fs::read(&reg).map_err(|e| format!("{}: {e}", reg.display()))?;
    let cells: Vec<u64> = bytes
        .chunks_exact(4)
        .map(|c| u64::from(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
        .collect();
    let size = match (bytes.len() % 4, cells.as_slice()) {
        (0, [_, _, hi, lo]) => (hi << 32) | lo,
        (0, [_, size]) => *size,
        _ => {
            return Err(format!(
                "{}: {} bytes is not a [addr size] cell pair",
                reg.display(),
                bytes.len()
            ))
        }
    };
    Ok((node, size))
}

/// Refuses when `needed` bytes cannot fit `pool`; warns when the pool is unknown.
pub fn check(what: &str, needed: u64, pool: &PoolReading, file: &Path) -> Result<(), BpuError> {
    match pool.available {
        Some(avail) if needed > avail => Err(BpuError::Pool {
            path: file.to_owned(),
            what: what.to_owned(),
            needed,
            available: avail,
            source_desc: pool.source.clone(),
            fix: pool.fix.clone(),
        }),
        Some(avail) => {
            tracing::info!(what, needed, available = avail, source = %pool.source, "ION pool preflight passed");
            Ok(())
        }
        None if pool.unlimited => Ok(()),
        None => {
            tracing::warn!(
                what,
                needed,
                reason = %pool.source,
                "ION pool size unknown: cannot check that the package fits before loading it"
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn carveout_reg_cells_are_read_big_endian() {
        let d = tempfile::tempdir().unwrap();
        let node = d.path().join("ion_carveout@a0000000");
        std::fs::create_dir(&node).unwrap();
        std::fs::create_dir(d.path().join("ion_reserved@80000000")).unwrap();
        // 0x1_0000_0000 + 0x2000_0000 = 4.5 GiB.
        let cells = [0u32, 0xa000_0000, 1, 0x2000_0000];
        let bytes: Vec<u8> = cells.iter().flat_map(|c| c.to_be_bytes()).collect();
        std::fs::write(node.join("reg"), bytes).unwrap();
        let (n, size) = carveout_size(d.path()).unwrap();
        assert_eq!(n, node);
        assert_eq!(size, (1 << 32) + 0x2000_0000);
        std::fs::write(node.join("reg"), [0u8; 6]).unwrap();
        assert!(carveout_size(d.path()).unwrap_err().contains("reg"));
        assert!(carveout_size(&d.path().join("nope")).is_err());
    }

    #[test]
    fn the_load_margin_covers_the_observed_request() {
        assert!(with_load_margin(2_463_911_336) >= 2_465_267_712);
    }
}
