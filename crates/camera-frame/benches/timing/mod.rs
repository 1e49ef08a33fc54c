//! The timing loop both camera-frame benches share: median and minimum wall time of repeated
//! runs, and the CPU time per run summed over all threads (from `/proc/self/stat`), which
//! stays meaningful when other processes share the cores.

use std::time::{Duration, Instant};

/// Process CPU time (user + system, all threads) in clock ticks, if the platform shows it.
fn cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Clock ticks per second of `/proc/self/stat` (USER_HZ, 100 on every Linux ABI in use).
const TICKS_PER_SEC: f64 = 100.0;

pub fn time(name: &str, iters: usize, mut f: impl FnMut()) {
    f(); // warm-up: page in buffers, start rayon's pool
    let cpu0 = cpu_ticks();
    let mut runs: Vec<Duration> = (0..iters)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    let cpu = match (cpu0, cpu_ticks()) {
        (Some(a), Some(b)) => format!(
            "{:>8.3} ms",
            (b - a) as f64 / TICKS_PER_SEC * 1e3 / iters as f64
        ),
        _ => "       ?".to_owned(),
    };
    runs.sort();
    println!(
        "{name:<44} wall median {:>8.3} ms  min {:>8.3} ms  cpu/run {cpu}  ({iters} runs, {} threads)",
        runs[iters / 2].as_secs_f64() * 1e3,
        runs[0].as_secs_f64() * 1e3,
        rayon::current_num_threads()
    );
}
