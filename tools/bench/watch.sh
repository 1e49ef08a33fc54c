#!/usr/bin/env bash
# Watch benchmark (BENCHMARKS.md, "Standing questions"): release vlm_node on the 4B-shaped
# ctx4k package without weights under the simulator's S100P timing model
# (prefill_tail pads_first), a 640x480 noisy camera at 10 Hz; tools/bench/watch.py once with
# two watches and once with none, the same seeded ask moments. Not a test.
#   bash tools/bench/watch.sh [SWITCHES] [SEED] ["2 0"]    (the watch counts to run with)
#   NO_ASKS=1 leaves the asks out (the time from a switch to the evaluations alone).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
# shellcheck source=tools/bench/s100p-node.sh
source tools/bench/s100p-node.sh
for WATCHES in ${3:-2 0}; do
  BPU_SIM_TIMING=s100p RUST_LOG=${RUST_LOG:-warn} "$BIN/vlm_node" --ros-args \
    --params-file launch/vlm_params.yaml -p model_dir:="$PKG" -p prefill_tail:=pads_first \
    -p bpu_timeout_s:=60.0 -p diagnostics_period_s:=0.2 &
  PID=$!
  trap 'kill -INT $PID 2>/dev/null || true' EXIT
  .ros2/venv/bin/python tools/bench/watch.py --watches "$WATCHES" --switches "${1:-8}" \
    --seed "${2:-1}" --label "watches=$WATCHES" ${NO_ASKS:+--no-asks}
  kill -INT "$PID"
  trap - EXIT
  wait "$PID"
done
