#!/usr/bin/env bash
# The test command (README, .ci/run):  bash tools/test.sh
#
# Phases, each timed: ROS 2 bootstrap (idempotent) -> cargo fmt --check -> cargo clippy
# -D warnings -> one `cargo test --workspace` -> aarch64 cross-check of the non-ROS crates
# -> colcon build check in a throwaway workspace (tools/colcon-check.sh).
#
# `cargo test` (not nextest): it ships with the toolchain, so a cold machine builds nothing
# extra, and one invocation keeps one target directory. ROS tests isolate themselves
# (random ROS_DOMAIN_ID, unique names), so running in one process per test binary is safe.
#
# Environment: SKIP_COLCON=1 skips the colcon phase (it builds the node a second time in
# its own target directory); CARGO_TARGET_DIR is honoured.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

SUMMARY=()
T_ALL=$(date +%s)
phase() { # phase NAME CMD...
  local name=$1 t0 rc
  shift
  echo
  echo "=== [$name] $*"
  t0=$(date +%s)
  set +e
  "$@"
  rc=$?
  set -e
  local dt=$(($(date +%s) - t0))
  SUMMARY+=("$(printf '%-12s %5ds  %s' "$name" "$dt" "$([ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)")")")
  echo "=== [$name] ${dt}s, exit $rc"
  if [ $rc != 0 ]; then
    print_summary
    exit $rc
  fi
}
TEST_LOG=$ROOT/.cache/test-output.log
print_summary() {
  echo
  echo "=== phase times"
  printf '%s\n' "${SUMMARY[@]}"
  echo "total        $(($(date +%s) - T_ALL))s"
  echo "disk         $(du -sh "$ROOT/target" "$ROOT/.cache" "$ROOT/.ros2" 2>/dev/null | awk '{ printf "%s %s  ", $2, $1 }' | sed "s|$ROOT/||g")"
  # One closing line over every test binary of the cargo test phase (cargo prints one
  # "test result" line per binary, the last of which is often a doc-test binary with 0 tests).
  if [ -f "$TEST_LOG" ]; then
    awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1); if ($i ~ /^ignored;?$/) s += $(i-1) } }
         END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$TEST_LOG"
  fi
}
run_tests() {
  mkdir -p "$(dirname "$TEST_LOG")"
  cargo test --workspace 2>&1 | tee "$TEST_LOG"
}

need_root_apt() { # need_root_apt PKG...: installs the Debian packages that are missing
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} = 0 ] && return 0
  [ "$(id -u)" = 0 ] || { echo "missing Debian packages: ${missing[*]}" >&2; return 1; }
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

cross_check() {
  need_root_apt gcc-aarch64-linux-gnu libc6-dev-arm64-cross
  rustup target list --installed | grep -qx aarch64-unknown-linux-gnu || rustup target add aarch64-unknown-linux-gnu
  # cc-rs and bindgen need the cross compiler and the arm64 sysroot; the linker is set in
  # .cargo/config.toml.
  CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
    AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar \
    BINDGEN_EXTRA_CLANG_ARGS_aarch64_unknown_linux_gnu="--sysroot=/usr/aarch64-linux-gnu -I/usr/aarch64-linux-gnu/include" \
    cargo check --target aarch64-unknown-linux-gnu \
    -p hbdnn-sys -p hbdnn -p bpu-sim -p qwen35 -p vlm -p vlm-bpu -p vlm-cli -p camera-frame
}

ensure_rust_components() {
  cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
  cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
}

# A full run from a fresh clone peaks at about 3 GB (target/, .cache/colcon-check/, .ros2/); a
# full disk shows up as an obscure link error deep in the test phase, so say it up front.
NEED_GB=4
free_gb=$(df -Pk "$ROOT" | awk 'NR == 2 { print int($4 / 1048576) }')
echo "[test] ${free_gb} GB free on $(df -P "$ROOT" | awk 'NR == 2 { print $6 }') (a fresh run needs about ${NEED_GB})"
if [ "${free_gb:-0}" -lt "$NEED_GB" ]; then
  echo "[test] WARNING: less than ${NEED_GB} GB free; the build may fail with 'No space left on device'" >&2
fi

phase bootstrap bash tools/ros2-bootstrap.sh
# shellcheck disable=SC1091
source .ros2/setup.bash
phase rust-tools ensure_rust_components
phase fmt cargo fmt --all --check
phase clippy cargo clippy --workspace --all-targets -- -D warnings
rm -f "$TEST_LOG"
phase test run_tests
phase aarch64 cross_check
if [ -z "${SKIP_COLCON:-}" ]; then
  phase colcon bash tools/colcon-check.sh
fi
print_summary
