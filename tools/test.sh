#!/usr/bin/env bash
# The test command (README, .ci/run):  bash tools/test.sh
#
# Phases, each timed against a budget (a cold CI run on 2 cores; over budget warns, never
# fails): ROS 2 bootstrap (idempotent) -> cargo fmt --check -> the shape limits
# (tools/limits.py: file and function lengths, files in src/, README length) -> the board's Python 3.10 checked
# statically (tools/py-compat.sh, vermin) -> cargo clippy -D warnings -> one
# `cargo test --workspace` -> flush-whole: the BPU scenario and state tests again against a
# simulated library that flushes only whole allocations -> aarch64: check of every non-ROS
# crate for the board's target, then the tests that prove the architecture under qemu-user ->
# the board acceptance script in simulator mode (tools/board-acceptance.sh --sim) -> colcon
# build check in a throwaway workspace (tools/colcon-check.sh).
#
# `cargo test` (not nextest): it ships with the toolchain, so a cold machine builds nothing
# extra, and one invocation keeps one target directory. ROS tests isolate themselves
# (random ROS_DOMAIN_ID, unique names), so running in one process per test binary is safe.
#
# Environment: SKIP_COLCON=1 skips the colcon phase (it builds the node a second time in
# its own target directory); CARGO_TARGET_DIR is honoured.
#
#   bash tools/test.sh --only PHASE[,PHASE...]   runs just those phases (names as in the
#                                                summary, e.g. --only aarch64)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

ONLY=
case "${1:-}" in
  --only) ONLY=,${2:?--only needs a phase name},; shift 2 ;;
  --only=*) ONLY=,${1#--only=},; shift ;;
  "") ;;
  *) echo "usage: bash tools/test.sh [--only PHASE[,PHASE...]]" >&2; exit 2 ;;
esac
wanted() { [ -z "$ONLY" ] || [[ $ONLY == *",$1,"* ]]; }

# Seconds per phase on a cold CI run (fresh clone, 2 cores; docs/testing.md, "Budgets
# and measured times"), about 1.3x the measured time. Over budget prints a warning: the whole command must
# stay under 45 minutes (TOTAL_BUDGET), and a phase that grows is where to look first.
declare -A BUDGET=(
  [bootstrap]=150 [rust-tools]=60 [fmt]=30 [limits]=15 [py-compat]=60 [clippy]=450 [test]=920 [flush-whole]=30 [run]=120 [aarch64]=440
  [acceptance]=560 [colcon]=780
)
TOTAL_BUDGET=2700
for p in ${ONLY//,/ }; do
  [ -n "${BUDGET[$p]:-}" ] || { echo "unknown phase '$p' (phases: ${!BUDGET[*]})" >&2; exit 2; }
done

SUMMARY=()
T_ALL=$(date +%s)
OVER=()
phase() { # phase NAME CMD...: runs CMD unless --only leaves NAME out; times it against BUDGET
  local name=$1 t0 rc
  shift
  wanted "$name" || return 0
  local budget=${BUDGET[$name]:-0}
  echo
  echo "=== [$name] $*  (budget ${budget}s)"
  t0=$(date +%s)
  set +e
  "$@"
  rc=$?
  set -e
  local dt=$(($(date +%s) - t0)) note=
  if [ "$budget" -gt 0 ] && [ "$dt" -gt "$budget" ]; then
    note="  OVER BUDGET by $((dt - budget))s"
    OVER+=("$name")
    echo "[test] WARNING: phase $name took ${dt}s, over its ${budget}s budget" >&2
  fi
  SUMMARY+=("$(printf '%-12s %5ds  budget %5ds  %s%s' "$name" "$dt" "$budget" "$([ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)")" "$note")")
  echo "=== [$name] ${dt}s (budget ${budget}s), exit $rc"
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
  local total=$(($(date +%s) - T_ALL))
  printf '%-12s %5ds  budget %5ds%s\n' total "$total" "$TOTAL_BUDGET" \
    "$([ "$total" -gt "$TOTAL_BUDGET" ] && echo "  OVER BUDGET by $((total - TOTAL_BUDGET))s")"
  if [ ${#OVER[@]} -gt 0 ]; then
    echo "WARNING: over budget: ${OVER[*]} (a warning, not a failure; docs/testing.md)"
  fi
  echo "disk         $(du -sh "$ROOT/target" "$ROOT/.cache" "$ROOT/.ros2" 2>/dev/null | awk '{ printf "%s %s  ", $2, $1 }' | sed "s|$ROOT/||g")"
  # One closing line over every test binary of the cargo test phase (cargo prints one
  # "test result" line per binary, the last of which is often a doc-test binary with 0 tests).
  if wanted test && [ -f "$TEST_LOG" ]; then
    awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1); if ($i ~ /^ignored;?$/) s += $(i-1) } }
         END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$TEST_LOG"
  fi
}
run_tests() {
  mkdir -p "$(dirname "$TEST_LOG")"
  cargo test --workspace 2>&1 | tee "$TEST_LOG"
}

# The BPU backend's scenario suite (every backend's scenarios, bpu_sim.rs) and its state tests
# (kept and parked sets, image prefill, padded tails) rerun with BPU_SIM_FLUSH=whole: the
# simulated library then refuses every CLEAN or INVALIDATE that is not a whole allocation, as
# a libhbucp might, so the backend must find that at open and flush whole buffers without
# losing a CPU write. The test binaries are those the test phase built: same `--workspace`
# (cargo unifies features over the packages of an invocation; another list would rebuild the
# shared dependencies), nothing compiles here.
FLUSH_WHOLE_TESTS=(--test bpu_sim --test held_state --test frame_priming --test prefill_tail)
flush_whole_phase() {
  BPU_SIM_FLUSH=whole cargo test --workspace "${FLUSH_WHOLE_TESTS[@]}"
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

# The board's CPU architecture (RDK S100P: Cortex-A78AE cores, aarch64). Every non-ROS crate
# is checked for the board's target (c_char sign and similar FFI traps), then the tests that
# prove the architecture run under qemu-user: FFI struct layouts, the bf16 kernels with the
# NEON path asserted as the one the run-time dispatch takes, the simulator graphs against the
# CPU reference, and one BPU-backend generation against the HF goldens. Nothing here needs
# ROS. qemu has no Cortex-A78AE model; cortex-a76 is the same ARMv8.2-A core generation with
# the same user-visible features (Advanced SIMD, FP16, dot product, LSE, RCpc; no SVE), so
# run-time feature detection sees what it sees on the board.
AARCH64_TARGET=aarch64-unknown-linux-gnu
AARCH64_CRATES=(hbdnn-sys hbdnn bllm-manifest bpu-sim qwen35 vlm vlm-bpu vlm-cli camera-frame annotate)
AARCH64_QEMU_CPU=cortex-a76
aarch64_phase() ( # a subshell: the cross-build environment stays inside this phase
  set -euo pipefail
  need_root_apt gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
  rustup target list --installed | grep -qx "$AARCH64_TARGET" || rustup target add "$AARCH64_TARGET"
  # cc-rs and bindgen need the cross compiler and the arm64 sysroot; the linker is set in
  # .cargo/config.toml. Test binaries run under qemu-user with the cross sysroot's dynamic
  # loader and libraries, without the host's (ROS) library path.
  export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
  export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
  export BINDGEN_EXTRA_CLANG_ARGS_aarch64_unknown_linux_gnu="--sysroot=/usr/aarch64-linux-gnu -I/usr/aarch64-linux-gnu/include"
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu -U LD_LIBRARY_PATH"
  export QEMU_CPU=$AARCH64_QEMU_CPU
  # the dispatch under test must choose by itself
  unset QWEN35_BF16_ISA
  local pkgs=() c
  for c in "${AARCH64_CRATES[@]}"; do pkgs+=(-p "$c"); done
  echo "--- [aarch64] cargo check of every non-ROS crate"
  cargo check --target "$AARCH64_TARGET" "${pkgs[@]}"

  # One build of every test binary run below, then one `cargo test` per group with the same
  # package list: cargo unifies features over the packages of an invocation, so a different
  # list would rebuild the shared dependencies (gemm, rayon, ...) with other features.
  local test_pkgs=(-p hbdnn-sys -p hbdnn -p qwen35 -p vlm-bpu)
  echo "--- [aarch64] build of the tests that run under qemu"
  cargo test --target "$AARCH64_TARGET" "${test_pkgs[@]}" --no-run \
    --lib --test layout --test kernel_path --test sim_graphs --test bpu_sim
  local results=()
  qemu_tests() { # qemu_tests WHAT MIN_PASSED CARGO_TEST_ARGS...: fails on a failed test,
    # and when fewer than MIN_PASSED tests ran (a test filter that no longer matches)
    local what=$1 min=$2 log rc n t0
    shift 2
    log=$(mktemp)
    echo "--- [aarch64] under qemu-aarch64 -cpu $QEMU_CPU: $what: cargo test $*"
    t0=$(date +%s)
    set +e
    cargo test --target "$AARCH64_TARGET" "${test_pkgs[@]}" "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    set -e
    n=$(awk '/^test result:/ { for (i = 1; i <= NF; i++) if ($i ~ /^passed;?$/) p += $(i-1) } END { print p + 0 }' "$log")
    rm -f "$log"
    local line
    line=$(printf '%-34s %3d passed  %4ds' "$what" "$n" "$(($(date +%s) - t0))")
    if [ "$rc" != 0 ]; then
      results+=("$line  FAILED (cargo test exit $rc)")
      return "$rc"
    fi
    if [ "$n" -lt "$min" ]; then
      results+=("$line  FAILED: at least $min expected (a test filter that matches nothing?)")
      return 1
    fi
    results+=("$line")
  }
  # Every group runs; the phase fails at the end if one failed.
  local failed=()
  qemu_tests "hbdnn-sys struct layouts" 5 --test layout || failed+=(layouts)
  qemu_tests "qwen35 kernels (every bf16 path)" 6 --lib -- kernels:: || failed+=(kernels)
  qemu_tests "qwen35 dispatch takes NEON" 1 --test kernel_path || failed+=(neon-dispatch)
  qemu_tests "hbdnn simulator graphs" 8 --test sim_graphs || failed+=(sim-graphs)
  # One BPU-backend generation (a simulator package of the tiny-sym fixture) checked against
  # the HF goldens' greedy tokens and the CPU reference's logits; the filter also matches
  # the test's former name (..._cpu_backend).
  qemu_tests "vlm-bpu generation vs HF goldens" 1 --test bpu_sim -- golden_cases_match_the_cpu ||
    failed+=(bpu-goldens)
  echo "--- [aarch64] under qemu-aarch64 -cpu $QEMU_CPU:"
  printf '  %s\n' "${results[@]}"
  if [ ${#failed[@]} -gt 0 ]; then
    echo "[aarch64] FAILED under qemu: ${failed[*]}" >&2
    return 1
  fi
)

# The board owner's command in simulator mode (issue 15): release builds of vlm and vlm_node
# in target/release (~7 min cold on 2 cores; the sections themselves take ~12 s), a tiny simulator
# package for check/parity/contrast/node, a 4B-shaped one under BPU_SIM_TIMING=s100p for the
# timings. The script exits non-zero when a section fails; the report must also hold the seven
# sections with every one that ran passed, so a script that stopped checking fails here too.
ACCEPTANCE_OUT=$ROOT/.cache/board-acceptance
acceptance_phase() {
  bash tools/board-acceptance.sh --sim --out "$ACCEPTANCE_OUT" || return
  python3 - "$ACCEPTANCE_OUT/board-report.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
want = ['probe', 'environment', 'check', 'parity', 'contrast', 'timings', 'node']
assert list(doc) == want, f'sections {list(doc)}, expected {want} in this order'
assert doc['environment']['pass'] is None, 'environment must be skipped under --sim'
bad = [k for k in want if k != 'environment' and doc[k]['pass'] is not True]
assert not bad, f'sections that did not pass: {bad}'
steps = doc['probe']['steps']
assert steps and all(s['pass'] is True for s in steps), f'probe steps: {steps}'
names = [s['name'] for s in steps]
for n in ('flush_whole', 'flush_range', 'decode', 'prefill', 'tower'):
    assert n in names, f'probe step {n} missing from {names}'
ka = doc['contrast']['known_answer']
assert ka['pass'] is None and isinstance(ka['answer'], str) and ka['expect'] == 'cat', \
    f'contrast.known_answer under --sim: {ka}'
for k in ('decode_tok_s', 'image_ttft_s', 'text_ttft_s'):
    m = doc['timings'][k]
    assert m['value'] > 0 and m['published'] > 0 and m['ratio'] > 0, f'timings.{k}: {m}'
print('[acceptance] board-report.json: every section ran and passed (environment skipped)')
PY
  [ -s "$ACCEPTANCE_OUT/board-report.md" ] || { echo "[acceptance] no board-report.md" >&2; return 1; }
}

ensure_rust_components() {
  cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
  cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
}

# A full run from a fresh clone peaks at about 5 GB (target/, of which the aarch64 tests
# take 0.5 GB and the acceptance phase's release build 1.5 GB, .cache/colcon-check/, .ros2/);
# a full disk shows up as an obscure link error deep in the test phase, so say it up front.
NEED_GB=5
free_gb=$(df -Pk "$ROOT" | awk 'NR == 2 { print int($4 / 1048576) }')
echo "[test] ${free_gb} GB free on $(df -P "$ROOT" | awk 'NR == 2 { print $6 }') (a fresh run needs about ${NEED_GB})"
if [ "${free_gb:-0}" -lt "$NEED_GB" ]; then
  echo "[test] WARNING: less than ${NEED_GB} GB free; the build may fail with 'No space left on device'" >&2
fi

phase bootstrap bash tools/ros2-bootstrap.sh
# (with --only, phases that need no ROS run without a bootstrapped tree)
if wanted bootstrap || [ -f .ros2/setup.bash ]; then
  # shellcheck disable=SC1091
  source .ros2/setup.bash
fi
phase rust-tools ensure_rust_components
phase fmt cargo fmt --all --check
phase limits python3 tools/limits.py
phase py-compat bash tools/py-compat.sh
phase clippy cargo clippy --workspace --all-targets -- -D warnings
wanted test && rm -f "$TEST_LOG"
phase test run_tests
phase flush-whole flush_whole_phase
# The README's run command, as a newcomer types it (its build is the test phase's binary).
phase run bash tools/run.sh
phase aarch64 aarch64_phase
phase acceptance acceptance_phase
if [ -z "${SKIP_COLCON:-}" ]; then
  phase colcon bash tools/colcon-check.sh
fi
print_summary
