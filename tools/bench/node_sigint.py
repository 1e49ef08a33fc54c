"""SIGINT while vlm_node loads or warms up a package: the time from the signal to the
process's exit, the exit code, and where the node says it stopped (BENCHMARKS.md).

    source .ros2/setup.bash
    BPU_SIM_TIMING=s100p python3 tools/bench/node_sigint.py target/release/vlm_node <PACKAGE>

Each run starts a fresh node (`-p model_dir:=<PACKAGE>`, its own ROS domain), waits for a
log line, waits a given delay, sends SIGINT and times the exit. By default the delays are
spread every 0.5 s from 0.25 s after `r2r context created`, covering the load and the whole
warm-up; `--at "<log text>" <s> ...` picks other moments. A measurement, not a test: the
node tests assert the order of events (tests/node_shutdown.rs).
"""

import argparse
import os
import re
import signal
import subprocess
import threading
import time

ANSI = re.compile(r'\x1b\[[0-9;]*m')
WHERE = ('interrupted before', 'warm-up done', 'vlm_node ready')


def run(node, package, marker, delay, domain):
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain))
    p = subprocess.Popen([node, '--ros-args', '-p', f'model_dir:={package}'], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = []
    seen = threading.Event()

    def read():
        for raw in p.stderr:
            line = ANSI.sub('', raw.rstrip('\n'))
            lines.append(line)
            if marker in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    start = time.monotonic()
    if not seen.wait(120):
        p.kill()
        raise SystemExit(f'vlm_node never logged {marker!r}')
    time.sleep(delay)
    sent = time.monotonic()
    p.send_signal(signal.SIGINT)
    code = p.wait(60)
    gone = time.monotonic()
    reader.join(5)
    where = next((l.split(': ', 1)[-1] for l in lines if any(w in l for w in WHERE)), '?')
    return gone - sent, code, sent - start, where


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('node')
    ap.add_argument('package')
    ap.add_argument('--at', nargs='+', metavar=('TEXT', 'DELAY'),
                    help='log text to wait for, then the delays in seconds')
    a = ap.parse_args()
    if a.at:
        moments = [(a.at[0], float(d)) for d in a.at[1:]]
    else:
        moments = [('r2r context created', 0.25 + 0.5 * i) for i in range(21)]
    domain = 60 + os.getpid() % 30
    took = []
    for marker, delay in moments:
        dt, code, since, where = run(a.node, a.package, marker, delay, domain)
        took.append(dt)
        print(f'signal {since:5.2f} s after start: exit {code}, {dt:.3f} s after SIGINT; '
              f'{where[:100]}', flush=True)
    took.sort()
    print(f'{len(took)} runs: median {took[len(took) // 2]:.3f} s, max {took[-1]:.3f} s')


if __name__ == '__main__':
    main()
