#!/usr/bin/env bash
# Checks the board build (README "On the board") here: runs the documented colcon
# command in a throwaway workspace, .cache/colcon-check/ (never in the repo root, own cargo
# target directory under its build/), against the PyPI ROS 2 from tools/ros2-bootstrap.sh,
# then checks what was installed.
#
#   bash tools/colcon-check.sh          (after bash tools/ros2-bootstrap.sh)
#
# The workspace is kept between runs so the cargo build is incremental; its src/ copy is
# refreshed every run (file times are kept, so unchanged sources don't rebuild).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WS=${COLCON_CHECK_WS:-$ROOT/.cache/colcon-check}
R2=$ROOT/.ros2
[ -f "$R2/setup.bash" ] || { echo "run bash tools/ros2-bootstrap.sh first" >&2; exit 1; }

echo "[colcon-check] workspace $WS"
rm -rf "$WS/src" "$WS/install"
mkdir -p "$WS/src/bpu_vlm"
# The repository's files as a fresh clone has them (tracked + new, not ignored).
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
    tar --null -T - -cf -) | tar -C "$WS/src/bpu_vlm" -xf -
else
  tar -C "$ROOT" --exclude=./target --exclude=./.ros2 --exclude=./.cache --exclude=./.git -cf - . |
    tar -C "$WS/src/bpu_vlm" -xf -
fi

cd "$WS"
# shellcheck disable=SC1091
source "$R2/setup.bash"
# Like the board: the ROS installation only; bpu_vlm_msgs must come from this workspace.
# The board's distribution has vision_msgs; here the bootstrap's stand-in plays that part.
export AMENT_PREFIX_PATH=$R2/install/vision_msgs:$R2/venv CMAKE_PREFIX_PATH=$R2/install/vision_msgs:$R2/venv
unset PYTHONPATH
# The documented command (README), plus what the PyPI ROS needs here: its Python for
# rosidl, no tests. The board adds `--release`; a dev build keeps this check quicker.
colcon build --base-paths src/bpu_vlm src/bpu_vlm/msg src/bpu_vlm/client --cargo-args --bin vlm_node \
  --cmake-args -DPython3_EXECUTABLE="$R2/venv/bin/python" -DBUILD_TESTING=OFF \
  --event-handlers console_direct- console_cohesion- summary+ status-

echo "[colcon-check] checking the install space"
fail=0
for f in \
  install/bpu_vlm/lib/bpu_vlm/vlm_node \
  install/bpu_vlm/share/bpu_vlm/package.xml \
  install/bpu_vlm/share/bpu_vlm/launch/vlm.launch.py \
  install/bpu_vlm/share/bpu_vlm/launch/vlm_camera.launch.py \
  install/bpu_vlm/share/bpu_vlm/launch/vlm_params.yaml \
  install/bpu_vlm/share/bpu_vlm/launch/fastdds_large_frames.xml \
  install/bpu_vlm/share/ament_index/resource_index/packages/bpu_vlm \
  install/bpu_vlm_msgs/share/bpu_vlm_msgs/msg/Token.msg \
  install/bpu_vlm_msgs/share/bpu_vlm_msgs/srv/Ask.srv \
  install/bpu_vlm_msgs/share/bpu_vlm_msgs/action/Ask.action \
  install/bpu_vlm_msgs/share/bpu_vlm_msgs/srv/Detect.srv \
  install/bpu_vlm_msgs/share/bpu_vlm_msgs/action/Detect.action \
  install/bpu_vlm_msgs/share/ament_index/resource_index/packages/bpu_vlm_msgs \
  install/bpu_vlm_client/share/ament_index/resource_index/packages/bpu_vlm_client \
  install/bpu_vlm_client/lib/python*/site-packages/bpu_vlm_client/client.py; do
  if [ -e "$f" ]; then echo "  ok  $f"; else echo "  MISSING $f"; fail=1; fi
done
# Only these three packages: the crates under crates/ and hbdnn-sys/ stay out of discovery,
# and so does the vision_msgs stand-in (tools/vision_msgs/COLCON_IGNORE).
pkgs=$(colcon list --base-paths src/bpu_vlm src/bpu_vlm/msg src/bpu_vlm/client --names-only | sort | tr '\n' ' ')
[ "$pkgs" = "bpu_vlm bpu_vlm_client bpu_vlm_msgs " ] ||
  { echo "  colcon found: $pkgs (want: bpu_vlm bpu_vlm_client bpu_vlm_msgs)"; fail=1; }
pkgs=$(colcon list --base-paths src --names-only | sort | tr '\n' ' ')
[ "$pkgs" = "bpu_vlm " ] || { echo "  colcon list --base-paths src found: $pkgs (want: bpu_vlm)"; fail=1; }
pkgs=$(colcon list --base-paths src/bpu_vlm/tools --names-only | tr '\n' ' ')
[ -z "$pkgs" ] || { echo "  colcon list --base-paths src/bpu_vlm/tools found: $pkgs (want: none)"; fail=1; }

# `ros2 launch` is not installable here: check the installed launch file statically and
# run the unit test of its node_kwargs (the same checks tests/node.rs runs on the source).
for t in check_launch.py test_launch_args.py; do
  out=$("$R2/venv/bin/python" src/bpu_vlm/tests/peers/$t install/bpu_vlm/share/bpu_vlm/launch/vlm.launch.py 2>&1) &&
    [[ $out == *"PEER OK"* ]] && echo "  ok  $t on the installed vlm.launch.py" ||
    { echo "$out"; echo "  FAILED $t on the installed vlm.launch.py"; fail=1; }
done
exit $fail
