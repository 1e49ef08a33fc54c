#!/usr/bin/env bash
# Stop latency at start-up (BENCHMARKS.md, "SIGINT during start-up"): release vlm_node on the
# 4B-shaped ctx4k package without weights under the simulator's S100P timing model, started
# as a new user would (launch/vlm_params.yaml, prefill_tail pads_first), RUNS times; each run
# gets SIGINT at a seeded random moment in the first WINDOW seconds and the time from the
# signal to the process's exit is measured. Prints each run and min/median/p95/max. Not a test.
#   bash tools/bench/stop-latency.sh [RUNS] [SEED] [WINDOW]
# PROFILE=debug measures a debug build instead (much slower start-up; say so with its figures).
# NODE=/path/to/vlm_node times that binary instead of building (e.g. a copy of an older build,
# for a before/after comparison on the same package).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
bash tools/ros2-bootstrap.sh >/dev/null
# shellcheck disable=SC1091
source .ros2/setup.bash
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
PROFILE=${PROFILE:-release}
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE
PKG="$ROOT/.cache/bench/q4b-ctx4k-pads-first"
FLAGS=()
[ "$PROFILE" = release ] && FLAGS=(--release)
if [ -z "${NODE:-}" ]; then
  cargo build "${FLAGS[@]}" -p bpu_vlm --bin vlm_node
fi
if [ ! -f "$PKG/model.json" ]; then
  cargo build "${FLAGS[@]}" -p vlm-cli --bin vlm
  "$BIN/vlm" make-sim-package --config tools/bench/configs/qwen35-4b.json --no-weights \
    --tokenizer tools/fixtures/tokenizer.json --cache-len 4096 \
    --prefill-pads --prefill-min-tail 5 --pad-layout first --out "$PKG"
fi
echo "$(git rev-parse --short HEAD) $(date -u '+%F %H:%M UTC') $PROFILE; $(uptime)"
BPU_SIM_TIMING=s100p .ros2/venv/bin/python tools/bench/stop_latency.py "${NODE:-$BIN/vlm_node}" \
  --runs "${1:-20}" --seed "${2:-1}" --window "${3:-5}" -- \
  --ros-args --params-file launch/vlm_params.yaml -p model_dir:="$PKG" -p prefill_tail:=pads_first
uptime
