#!/usr/bin/env bash
# The board owner's one command: does bpu_vlm work on this board, how fast, and what to send
# back when it does not (issue 15).
#
#   tools/board-acceptance.sh [--out DIR] PACKAGE_DIR   on an RDK S100P, e.g.
#                                                       /opt/models/qwen35-4b/s100p/ctx4k
#   tools/board-acceptance.sh --sim [--out DIR]         here, on the BPU simulator (CI)
#
# Writes DIR/board-report.md (for a person: send it back), DIR/board-report.json (for tools:
# one object, keys probe, environment, check, parity, contrast, timings, node, each with
# "pass" true / false / null = skipped) and DIR/logs/ (every command's output). Exits 1 when a
# section that ran did not pass, 2 on a usage or setup error. DIR defaults to
# ./board-acceptance-<UTC time>; a non-empty DIR an earlier run did not write is refused.
# Run it as the user who runs the node, not with sudo (refused unless --allow-root).
#
# Sections (tools/board_acceptance.py; the Markdown is tools/board_report.py):
#   probe        `vlm probe` in a child process, step by step, each step's start synced to
#                logs/probe.jsonl before it runs (a crash names the step and the signal):
#                libraries, symbols, each .hbm loaded, every graph's I/O, a whole and a range
#                flush, one decode, prefill and tower call; with the vendor headers installed
#                (/usr/include/hobot or HBDNN_SYS_HOBOT_INCLUDE) also hbdnn-sys/board-check.sh
#   environment  board only: hbDNN/hbUCP libraries and versions, the ION carveout against
#                the package, BPU performance mode and CPU governor (with the commands that
#                set them), BPU/ION device permissions, no other BPU process (bllm) running
#   check        `vlm check --report --json`, sizes and sha256 of the package files
#   parity       first token + 48-token greedy continuation identical with and without the
#                prefill graph (`--no-prefill-graph`) on a prompt longer than one chunk
#   contrast     answers about the bundled photo with and without it differ; beside it
#                known_answer: "What animal is this?" about a real cat photo
#                (tools/fixtures/images/chelsea.png) must contain "cat" on a board
#   timings      `vlm bench --json`: decode tok/s, image TTFT, 31-token text TTFT, each
#                beside the seed package's published figure and our ratio to it
#   node         vlm_node on the package over ROS 2: a camera frame, /ask answered with
#                streamed tokens (tools/board_node_peer.py, rclpy)
#
# --sim: probe, parity, contrast, check and node on a tiny simulator package (the tiny-4b fixture);
# timings on a 4B-shaped package without weights under BPU_SIM_TIMING=s100p (the timing
# model, not a measurement); environment skipped.
#
# Setup, each step skipped when already done: the ROS 2 environment (an already sourced one
# that has bpu_vlm_msgs; on x86_64 tools/ros2-bootstrap.sh + .ros2/setup.bash; on the board
# /opt/tros/humble and the colcon workspace this repository sits in), then one release build
# of `vlm` (CARGO_TARGET_DIR honoured) and of `vlm_node` unless the workspace's install/ has
# one no older than the sources (always under --sim). BOARD_ACCEPTANCE_DOMAIN picks the
# ROS_DOMAIN_ID of the node section (default: a random one in 40..99, in the namespace
# /board_acceptance, so a robot's own graph is not disturbed).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usage() { sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
SIM=
ALLOW_ROOT=
OUT=
PKG=
while [ $# -gt 0 ]; do
  case "$1" in
    --sim) SIM=1; shift ;;
    --allow-root) ALLOW_ROOT=1; shift ;;
    --out) OUT=${2:?--out needs a directory}; shift 2 ;;
    --out=*) OUT=${1#--out=}; shift ;;
    -h|--help) usage ;;
    -*) echo "board-acceptance: unknown option $1" >&2; usage ;;
    *) [ -z "$PKG" ] || usage; PKG=$1; shift ;;
  esac
done
# Not under sudo: it builds with cargo, and sudo drops ~/.cargo/bin from PATH (secure_path)
# and would leave target/ and DIR owned by root. The one root-only read, the BPU
# performance-mode registers, goes through `sudo -n` (or the report prints the commands).
# A root login (the board's root user, a CI container) owns what it builds: it runs, with a
# note that it does not test a non-root user's device permissions.
if [ "$(id -u)" = 0 ] && [ -z "$ALLOW_ROOT" ]; then
  if [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
    echo "board-acceptance: run this as $SUDO_USER, not with sudo (a root build leaves target/" \
      "and the report owned by root, and sudo's PATH has no ~/.cargo/bin). It reads the BPU" \
      "performance-mode registers with 'sudo -n' when sudo needs no password, and otherwise" \
      "prints the commands that read them. --allow-root runs it under sudo anyway." >&2
    exit 2
  fi
  echo "[board-acceptance] note: running as root; the report's device permissions are root's," \
    "not those of the user who will run the node" >&2
fi
if [ -n "$SIM" ] && [ -n "$PKG" ]; then
  echo "board-acceptance: --sim makes its own packages; give no PACKAGE_DIR" >&2; exit 2
fi
if [ -z "$SIM" ]; then
  [ -n "$PKG" ] || { echo "board-acceptance: PACKAGE_DIR is required (or --sim)" >&2; usage; }
  [ -f "$PKG/model.json" ] || { echo "board-acceptance: $PKG has no model.json" >&2; exit 2; }
  PKG=$(cd "$PKG" && pwd)
fi
OUT=${OUT:-$PWD/board-acceptance-$(date -u +%Y%m%d-%H%M%S)}
# The run empties logs/ (and, with --sim, packages/) of DIR: only in a directory this script
# made. A non-empty DIR without the marker (say `--out ~`) is refused, never cleaned. Runs
# before the marker existed left logs/setup.json, which counts as the marker.
MARKER=.board-acceptance-out
if [ -d "$OUT" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ] && [ ! -f "$OUT/$MARKER" ] \
  && [ ! -f "$OUT/logs/setup.json" ]; then
  echo "board-acceptance: --out $OUT is not empty and was not written by this script" \
    "(no $MARKER in it): give a new or empty directory" >&2
  exit 2
fi
mkdir -p "$OUT" || { echo "board-acceptance: cannot create $OUT" >&2; exit 2; }
OUT=$(cd "$OUT" && pwd)
printf 'written by tools/board-acceptance.sh, which empties logs/ and packages/ here\n' \
  >"$OUT/$MARKER" || { echo "board-acceptance: cannot write to $OUT" >&2; exit 2; }
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
# ROS setup scripts read unset variables and run commands that may fail on the way: with
# set -eu on they could end this script with no word. Each source is checked instead.
set +eu
source_ros() {
  # shellcheck disable=SC1090
  source "$1" || {
    echo "board-acceptance: sourcing $1 failed (exit $?); run it in a shell to see why" >&2
    exit 2
  }
}
if [ -n "${ROS_DISTRO:-}" ] && have_msgs; then
  echo "[board-acceptance] using the sourced ROS 2 $ROS_DISTRO"
elif [ "$(uname -m)" = x86_64 ]; then
  bash "$ROOT/tools/ros2-bootstrap.sh" >"$OUT/logs/00-ros2-bootstrap.log" 2>&1 || {
    echo "board-acceptance: tools/ros2-bootstrap.sh failed, see $OUT/logs/00-ros2-bootstrap.log" >&2
    exit 2
  }
  source_ros "$ROOT/.ros2/setup.bash"
elif [ -f /opt/tros/humble/setup.bash ]; then
  source_ros /opt/tros/humble/setup.bash
  # The colcon workspace this repository sits in (README: ~/ros_ws/src/bpu_vlm) has the
  # bpu_vlm_msgs the node and the peer need.
  WS=$(cd "$ROOT/../.." && pwd)
  if [ -f "$WS/install/setup.bash" ]; then
    source_ros "$WS/install/setup.bash"
  fi
fi
set -eu
if [ -x "$ROOT/.ros2/venv/bin/python" ] && [[ ${AMENT_PREFIX_PATH:-} == *"$ROOT/.ros2"* ]]; then
  PEER_PY=$ROOT/.ros2/venv/bin/python
fi
if [ -z "${ROS_DISTRO:-}" ] || ! "$PEER_PY" -c 'import bpu_vlm_msgs.srv' >/dev/null 2>&1; then
  echo "board-acceptance: no ROS 2 with bpu_vlm_msgs: build the workspace as README \"On the" \
    "board\" says, then source /opt/tros/humble/setup.bash and <workspace>/install/setup.bash" >&2
  exit 2
fi
# The node section's rclpy peer (tools/board_node_peer.py) shares tests/peers/node_peer.py,
# which needs OpenCV and numpy; a fresh board image may have neither.
if ! "$PEER_PY" -c 'import cv2, numpy' >/dev/null 2>&1; then
  echo "board-acceptance: $PEER_PY cannot import cv2 and numpy (the node section's ROS 2 peer" \
    "needs them): sudo apt install python3-opencv python3-numpy" >&2
  exit 2
fi
step_done ros2

# --------------------------------------------------------------------------- builds
# On the board, the vlm_node colcon built for the workspace (README "On the board") is the
# one a user launches: reuse it unless a source is newer, and build only `vlm` (no r2r, no
# message bindings). --sim (CI) always builds both from this checkout.
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
NODE=$BIN/vlm_node
BUILD=(-p vlm-cli --bin vlm -p bpu_vlm --bin vlm_node)
if [ -z "$SIM" ]; then
  INSTALLED=$(cd "$ROOT/../.." && pwd)/install/bpu_vlm/lib/bpu_vlm/vlm_node
  if [ -x "$INSTALLED" ]; then
    NEWER=$(find "$ROOT/src" "$ROOT/crates" "$ROOT/msg" "$ROOT/Cargo.toml" "$ROOT/Cargo.lock" \
      -newer "$INSTALLED" -type f -print -quit 2>/dev/null || true)
    if [ -z "$NEWER" ]; then
      NODE=$INSTALLED
      BUILD=(-p vlm-cli --bin vlm)
      echo "[board-acceptance] using the workspace's $INSTALLED"
    else
      echo "[board-acceptance] $INSTALLED is older than $NEWER: building vlm_node here too" \
        "(rerun the README's colcon build to use the workspace's again)"
    fi
  fi
fi
command -v cargo >/dev/null || {
  echo "board-acceptance: no cargo on PATH (install Rust with rustup, README \"On the board\")" >&2
  exit 2
}
step_start "release build of ${BUILD[*]}"
(cd "$ROOT" && cargo build --release "${BUILD[@]}") \
  >"$OUT/logs/00-cargo-build.log" 2>&1 || {
  tail -20 "$OUT/logs/00-cargo-build.log" >&2
  echo "board-acceptance: the release build failed, see $OUT/logs/00-cargo-build.log" >&2
  exit 2
}
step_done build

PHOTO=$ROOT/tools/fixtures/images/scene_a.png
ARGS=(--out "$OUT" --vlm "$BIN/vlm" --node "$NODE" --peer-python "$PEER_PY"
      --photo "$PHOTO")
if [ -n "$SIM" ]; then
  step_start "simulator packages"
  SIM_LOG=$OUT/logs/00-make-sim-package.log
  sim_failed() {
    tail -20 "$SIM_LOG" >&2
    echo "board-acceptance: vlm make-sim-package ($1) failed, see $SIM_LOG" >&2
    exit 2
  }
  mkdir -p "$OUT/packages" || { echo "board-acceptance: cannot create $OUT/packages" >&2; exit 2; }
  rm -rf "$OUT/packages/tiny-4b" "$OUT/packages/q4b-ctx4k"
  "$BIN/vlm" make-sim-package --hf "$ROOT/tools/fixtures/models/tiny-4b" \
    --tokenizer "$ROOT/tools/fixtures/tokenizer.json" --out "$OUT/packages/tiny-4b" \
    >"$SIM_LOG" 2>&1 || sim_failed tiny-4b
  # The published ctx4k layout with the 2026-11 padded tail (prefill_min_tail 5); without
  # weights the pad layout cannot be calibrated, so the timings name it (BENCHMARKS.md).
  "$BIN/vlm" make-sim-package --config "$ROOT/tools/bench/configs/qwen35-4b.json" --no-weights \
    --tokenizer "$ROOT/tools/fixtures/tokenizer.json" --cache-len 4096 \
    --prefill-pads --prefill-min-tail 5 --pad-layout first --out "$OUT/packages/q4b-ctx4k" \
    >>"$SIM_LOG" 2>&1 || sim_failed q4b-ctx4k
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
