#!/usr/bin/env bash
# The board owner's one command: does bpu_vlm work on this board, how fast, and what to send
# back when it does not (issue 15).
#
#   tools/board-acceptance.sh [--out DIR] PACKAGE_DIR   on an RDK S100P, e.g.
#                                                       /opt/models/qwen35-4b/s100p/ctx4k
#   tools/board-acceptance.sh --sim [--out DIR]         here, on the BPU simulator (CI)
#
# Writes DIR/board-report.md (for a person: send it back), DIR/board-report.json (for tools:
# one object, keys environment, check, parity, contrast, timings, node, each with "pass"
# true / false / null = skipped) and DIR/logs/ (every command's output). Exits 1 when a
# section that ran did not pass, 2 on a usage or setup error. DIR defaults to
# ./board-acceptance-<UTC time>.
#
# Sections (tools/board_acceptance.py; the Markdown is tools/board_report.py):
#   environment  board only: hbDNN/hbUCP libraries and versions, the ION carveout against
#                the package, BPU performance mode and CPU governor (with the commands that
#                set them), BPU/ION device permissions, no other BPU process (bllm) running
#   check        `vlm check --report --json`, sizes and sha256 of the package files
#   parity       first token + 48-token greedy continuation identical with and without the
#                prefill graph (`--no-prefill-graph`) on a prompt longer than one chunk
#   contrast     answers about the bundled photo with and without it differ
#   timings      `vlm bench --json`: decode tok/s, image TTFT, 31-token text TTFT, each
#                beside the seed package's published figure and our ratio to it
#   node         vlm_node on the package over ROS 2: a camera frame, /ask answered with
#                streamed tokens (tools/board_node_peer.py, rclpy)
#
# --sim: parity, contrast, check and node on a tiny simulator package (the tiny-4b fixture);
# timings on a 4B-shaped package without weights under BPU_SIM_TIMING=s100p (the timing
# model, not a measurement); environment skipped.
#
# Setup, each step skipped when already done: the ROS 2 environment (an already sourced one
# that has bpu_vlm_msgs; on x86_64 tools/ros2-bootstrap.sh + .ros2/setup.bash; on the board
# /opt/tros/humble and the colcon workspace this repository sits in), then one release build
# of `vlm` and `vlm_node` (CARGO_TARGET_DIR honoured). BOARD_ACCEPTANCE_DOMAIN picks the
# ROS_DOMAIN_ID of the node section (default: a random one in 40..99, in the namespace
# /board_acceptance, so a robot's own graph is not disturbed).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usage() { sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
SIM=
OUT=
PKG=
while [ $# -gt 0 ]; do
  case "$1" in
    --sim) SIM=1; shift ;;
    --out) OUT=${2:?--out needs a directory}; shift 2 ;;
    --out=*) OUT=${1#--out=}; shift ;;
    -h|--help) usage ;;
    -*) echo "board-acceptance: unknown option $1" >&2; usage ;;
    *) [ -z "$PKG" ] || usage; PKG=$1; shift ;;
  esac
done
if [ -n "$SIM" ] && [ -n "$PKG" ]; then
  echo "board-acceptance: --sim makes its own packages; give no PACKAGE_DIR" >&2; exit 2
fi
if [ -z "$SIM" ]; then
  [ -n "$PKG" ] || { echo "board-acceptance: PACKAGE_DIR is required (or --sim)" >&2; usage; }
  [ -f "$PKG/model.json" ] || { echo "board-acceptance: $PKG has no model.json" >&2; exit 2; }
  PKG=$(cd "$PKG" && pwd)
fi
OUT=${OUT:-$PWD/board-acceptance-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# A fresh report each run: nothing of an earlier run may be read as this one's.
rm -rf "$OUT/logs" "$OUT/board-report.md" "$OUT/board-report.json"
mkdir -p "$OUT/logs"

SETUP=()
T_STEP=0
step_start() { T_STEP=$(date +%s); echo "[board-acceptance] $*"; }
step_done() { SETUP+=("$1=$(($(date +%s) - T_STEP))"); }

# --------------------------------------------------------------------------- ROS 2
have_msgs() { python3 -c 'import bpu_vlm_msgs.srv' >/dev/null 2>&1; }
PEER_PY=python3
step_start "ROS 2 environment"
set +u  # ROS setup scripts read unset variables
if [ -n "${ROS_DISTRO:-}" ] && have_msgs; then
  echo "[board-acceptance] using the sourced ROS 2 $ROS_DISTRO"
elif [ "$(uname -m)" = x86_64 ]; then
  bash "$ROOT/tools/ros2-bootstrap.sh" >"$OUT/logs/00-ros2-bootstrap.log" 2>&1 || {
    echo "board-acceptance: tools/ros2-bootstrap.sh failed, see $OUT/logs/00-ros2-bootstrap.log" >&2
    exit 2
  }
  # shellcheck disable=SC1091
  source "$ROOT/.ros2/setup.bash"
elif [ -f /opt/tros/humble/setup.bash ]; then
  # shellcheck disable=SC1091
  source /opt/tros/humble/setup.bash
  # The colcon workspace this repository sits in (README: ~/ros_ws/src/bpu_vlm) has the
  # bpu_vlm_msgs the node and the peer need.
  WS=$(cd "$ROOT/../.." && pwd)
  if [ -f "$WS/install/setup.bash" ]; then
    # shellcheck disable=SC1091
    source "$WS/install/setup.bash"
  fi
fi
set -u
if [ -x "$ROOT/.ros2/venv/bin/python" ] && [[ ${AMENT_PREFIX_PATH:-} == *"$ROOT/.ros2"* ]]; then
  PEER_PY=$ROOT/.ros2/venv/bin/python
fi
if [ -z "${ROS_DISTRO:-}" ] || ! "$PEER_PY" -c 'import bpu_vlm_msgs.srv' >/dev/null 2>&1; then
  echo "board-acceptance: no ROS 2 with bpu_vlm_msgs: build the workspace as README \"On the" \
    "board\" says, then source /opt/tros/humble/setup.bash and <workspace>/install/setup.bash" >&2
  exit 2
fi
step_done ros2

# --------------------------------------------------------------------------- builds
step_start "release build of vlm and vlm_node"
(cd "$ROOT" && cargo build --release -p vlm-cli --bin vlm -p bpu_vlm --bin vlm_node) \
  >"$OUT/logs/00-cargo-build.log" 2>&1 || {
  tail -20 "$OUT/logs/00-cargo-build.log" >&2
  echo "board-acceptance: the release build failed, see $OUT/logs/00-cargo-build.log" >&2
  exit 2
}
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
step_done build

PHOTO=$ROOT/tools/fixtures/images/scene_a.png
ARGS=(--out "$OUT" --vlm "$BIN/vlm" --node "$BIN/vlm_node" --peer-python "$PEER_PY"
      --photo "$PHOTO")
if [ -n "$SIM" ]; then
  step_start "simulator packages"
  mkdir -p "$OUT/packages"
  rm -rf "$OUT/packages/tiny-4b" "$OUT/packages/q4b-ctx4k"
  "$BIN/vlm" make-sim-package --hf "$ROOT/tools/fixtures/models/tiny-4b" \
    --tokenizer "$ROOT/tools/fixtures/tokenizer.json" --out "$OUT/packages/tiny-4b" \
    >"$OUT/logs/00-make-sim-package.log" 2>&1
  # The published ctx4k layout with the 2026-11 padded tail (prefill_min_tail 5); without
  # weights the pad layout cannot be calibrated, so the timings name it (BENCHMARKS.md).
  "$BIN/vlm" make-sim-package --config "$ROOT/tools/bench/configs/qwen35-4b.json" --no-weights \
    --tokenizer "$ROOT/tools/fixtures/tokenizer.json" --cache-len 4096 \
    --prefill-pads --prefill-min-tail 5 --pad-layout first --out "$OUT/packages/q4b-ctx4k" \
    >>"$OUT/logs/00-make-sim-package.log" 2>&1
  step_done sim_packages
  ARGS+=(--sim --package "$OUT/packages/tiny-4b" --timing-package "$OUT/packages/q4b-ctx4k"
         --repeats 1 --max-new 8 --node-timeout 120)
else
  ARGS+=(--package "$PKG")
fi

# The setup steps' times, for the report (a real JSON writer, not string pasting).
python3 -c 'import json, sys; json.dump({k: int(v) for k, v in (a.split("=") for a in sys.argv[2:])}, open(sys.argv[1], "w"))' \
  "$OUT/logs/setup.json" "${SETUP[@]}"
exec "$PEER_PY" "$ROOT/tools/board_acceptance.py" "${ARGS[@]}" --setup "$OUT/logs/setup.json"
