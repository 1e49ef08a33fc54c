#!/bin/sh
# Run on an RDK S100 board (or with HBDNN_SYS_HOBOT_INCLUDE / HBDNN_SYS_HOBOT_LIB_DIR pointing
# at an SDK): compiles our declarations against the installed vendor headers and compares
# struct sizes/offsets, constant values and entry-point signatures (tests/board_check.rs).
set -eu
cd "$(dirname "$0")/.."
exec cargo test -p hbdnn-sys --features board-check --test board_check "$@"
