"""SIGINT at a random moment of vlm_node's start-up: the time from the signal to the process's
exit, its distribution, and per run where the node was and where it stopped (BENCHMARKS.md,
"SIGINT during start-up"). Driven by tools/bench/stop-latency.sh; a measurement, not a test.

    source .ros2/setup.bash
    BPU_SIM_TIMING=s100p python3 tools/bench/stop_latency.py target/release/vlm_node \\
        --runs 20 --seed 1 --window 5 -- --ros-args --params-file launch/vlm_params.yaml \\
        -p model_dir:=<PACKAGE> -p prefill_tail:=pads_first

Each run starts a fresh node (its own ROS domain), sends SIGINT a uniformly drawn delay after
the process was spawned (seeded, so a second measurement signals at the same moments) and
times signal -> exit from outside. The node logs with `info,vlm_bpu::open=debug` unless
RUST_LOG says otherwise, so each run can name the start-up step the signal landed in (the
last log line before it) and the boundary the node stopped at.
"""

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

ANSI = re.compile(r'\x1b\[[0-9;]*m')
# A line saying where start-up stopped or got to.
WHERE = ('interrupted before', 'warm-up done', 'vlm_node ready', 'shutdown requested while')
# Log lines that name a start-up step (the one a signal lands in is the last seen before it).
STEP = re.compile(r'open step step="([^"]+)"|(warm-up started)|(vlm_node ready)|'
                  r'(opening BPU package)|(r2r context created)|(calibrating)')


def step_of(line):
    m = STEP.search(line)
    if not m:
        return None
    return next(g for g in m.groups() if g)


def run(node, args, delay, domain):
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain))
    env.setdefault('RUST_LOG', 'info,vlm_bpu::open=debug')
    lines = []  # (monotonic arrival, text)
    spawned = time.monotonic()
    p = subprocess.Popen([node, *args], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)

    def read():
        for raw in p.stderr:
            lines.append((time.monotonic(), ANSI.sub('', raw.rstrip('\n'))))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(max(0.0, spawned + delay - time.monotonic()))
    sent = time.monotonic()
    p.send_signal(signal.SIGINT)
    try:
        code = p.wait(120)
    except subprocess.TimeoutExpired:
        p.kill()
        code = p.wait()
    gone = time.monotonic()
    reader.join(5)
    before = [t for at, t in lines if at <= sent]
    step = next((s for s in map(step_of, reversed(before)) if s), 'before any log line')
    # The worker's own word on where it stopped comes first; the main task's line otherwise.
    texts = [t for _, t in lines]
    where = next((t for w in WHERE for t in texts if w in t), '?').split(': ', 1)[-1]
    return gone - sent, code, sent - spawned, step, where


def percentile(sorted_values, q):
    """Nearest-rank percentile of an ascending list."""
    k = max(0, min(len(sorted_values) - 1, -(-len(sorted_values) * q // 100) - 1))
    return sorted_values[int(k)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('node')
    ap.add_argument('--runs', type=int, default=20)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--window', type=float, default=5.0,
                    help='the signal lands uniformly in [0.2, window] s after spawning')
    # Everything after `--` goes to the node as is (argparse would take `--runs` there too).
    argv = sys.argv[1:]
    cut = argv.index('--') if '--' in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    args = argv[cut + 1:]
    rng = random.Random(a.seed)
    delays = [rng.uniform(0.2, a.window) for _ in range(a.runs)]
    domain = 60 + os.getpid() % 30
    took = []
    for i, delay in enumerate(delays, 1):
        dt, code, since, step, where = run(a.node, args, delay, domain)
        took.append(dt)
        print(f'run {i:2}: signal {since:5.2f} s after spawn, in "{step}": exit {code}, '
              f'{dt:.3f} s after SIGINT; {where[:90]}', flush=True)
    took.sort()
    print(f'{len(took)} runs (seed {a.seed}, window {a.window} s): min {took[0]:.3f} s, '
          f'median {percentile(took, 50):.3f} s, p95 {percentile(took, 95):.3f} s, '
          f'max {took[-1]:.3f} s')


if __name__ == '__main__':
    main()
