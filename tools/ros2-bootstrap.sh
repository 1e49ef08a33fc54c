#!/usr/bin/env bash
# ROS 2 Jazzy for x86_64 dev/CI machines, from the ros-python-wheels PyPI wheels, into .ros2/.
#
#   bash tools/ros2-bootstrap.sh        # then: source .ros2/setup.bash
#
# What it does (each step skipped when its stamp says it is up to date, so a second run
# takes seconds and downloads nothing):
#   1. apt packages the build needs (checked with dpkg first; installed only when missing)
#   2. .ros2/venv with every wheel pinned in tools/ros2-requirements.txt
#   3. the three fix-ups the wheels need (see below)
#   4. builds a stand-in for Humble's vision_msgs (tools/vision_msgs: no wheel has it) into
#      .ros2/install/vision_msgs, its own prefix, then msg/ (bpu_vlm_msgs) with CMake +
#      ament_cmake + rosidl into .ros2/install
#   5. writes .ros2/setup.bash
#   6. installs client/ (the Python package bpu_vlm_client) into .ros2/venv
#
# Environment:
#   PY=/path/to/python3.X   interpreter for the venv (CPython 3.11-3.13; default: the first
#                           of python3.13, python3.12, python3.11, python3 that qualifies)
#   SKIP_APT=1              never call apt-get (fail with the list of missing packages instead)
#
# The board does not use this: it builds with colcon against TogetheROS Humble (README).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
R2=$ROOT/.ros2
VENV=$R2/venv
PREFIX=$R2/install
# Its own prefix inside .ros2/install: tools/colcon-check.sh puts it beside the wheels as
# part of "the ROS installation" without exposing the bpu_vlm_msgs built here.
VPREFIX=$PREFIX/vision_msgs
LOCK=$ROOT/tools/ros2-requirements.txt
# Bump when the fix-up or msg build logic below changes, so existing trees are redone.
LOGIC_VERSION=1

T0=$(date +%s%N)
log() { local ds=$((($(date +%s%N) - T0) / 100000000)); printf '[ros2-bootstrap %4d.%ds] %s\n' $((ds / 10)) $((ds % 10)) "$*"; }
die() { echo "ros2-bootstrap: error: $*" >&2; exit 1; }

# ---------------------------------------------------------------- 1. system packages
# cmake/make/g++: msg build; clang + libclang-dev: r2r's bindgen; patchelf: fix-up (c);
# python3-venv/python3-dev: only matter for Debian's own python3, harmless otherwise.
APT_PKGS=(cmake make g++ clang libclang-dev patchelf python3-venv python3-dev pkg-config)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ -n "${SKIP_APT:-}" ] || [ "$(id -u)" != 0 ]; then
    die "missing Debian packages: ${missing[*]} (apt-get install ${missing[*]})"
  fi
  echo "[ros2-bootstrap] apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---------------------------------------------------------------- 2. Python + venv
pyver() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2]) if sys.implementation.name == "cpython" else print("not-cpython")' 2>/dev/null; }
if [ -n "${PY:-}" ]; then
  PYVER=$(pyver "$PY") || die "PY=$PY does not run"
else
  for c in python3.13 python3.12 python3.11 python3; do
    if command -v "$c" >/dev/null && v=$(pyver "$c") && [[ $v =~ ^3\.1[123]$ ]]; then PY=$c; PYVER=$v; break; fi
  done
  [ -n "${PY:-}" ] || die "no CPython 3.11-3.13 found (the ROS wheels exist for cp311, cp312, cp313); set PY=/path/to/python3.X"
fi
case $PYVER in
  3.11 | 3.12 | 3.13) ;;
  *) die "$PY is Python '$PYVER'; the ROS 2 Jazzy wheels exist only for CPython 3.11, 3.12 and 3.13 (set PY=...)" ;;
esac
# The real interpreter, not a pyenv shim or an alias.
PY=$("$PY" -c 'import sys; print(sys.executable)')
CPTAG=cp${PYVER/./}
PYINC=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[ -f "$PYINC/Python.h" ] || die "$PYINC/Python.h is missing: rosidl's Python typesupport needs the headers (apt-get install python3-dev for Debian's python3)"

mkdir -p "$R2"
VENV_KEY=$( { cat "$LOCK"; echo "python=$PYVER $PY logic=$LOGIC_VERSION"; } | sha256sum | cut -c1-16)
VENV_STAMP=$R2/.venv.stamp
if [ "$(cat "$VENV_STAMP" 2>/dev/null)" != "$VENV_KEY" ]; then
  if [ -x "$VENV/bin/python" ] && [ "$(pyver "$VENV/bin/python")" != "$PYVER" ]; then
    log "venv was built with another Python: recreating"
    rm -rf "$VENV"
  fi
  [ -x "$VENV/bin/python" ] || { log "python -m venv ($PY, $PYVER)"; "$PY" -m venv "$VENV" || die "python -m venv failed (apt-get install python3-venv for Debian's python3)"; }
  log "pip install -r tools/ros2-requirements.txt"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$LOCK"

  # ------------------------------------------------------------ 3. fix-ups of the wheels
  log "fix-ups"
  # (a) exported CMake targets of the Python typesupport point at the wheel builder's
  #     interpreter (/opt/python/cpXY-cpXY/...): point them at ours and at our numpy.
  NPINC=$("$VENV/bin/python" -c 'import numpy; print(numpy.get_include())')
  { grep -rl "/opt/python/$CPTAG-$CPTAG/" "$VENV/share" --include='*.cmake' || true; } | xargs -r sed -i \
    -e "s#/opt/python/$CPTAG-$CPTAG/include/python$PYVER#$PYINC#g" \
    -e "s#/opt/python/$CPTAG-$CPTAG/lib/python$PYVER/site-packages/numpy/_core/include#$NPINC#g"
  # (b) rmw_implementation is built without run-time RMW selection, so there is no
  #     librmw_implementation.so, which r2r links: alias it to the only RMW there is.
  ln -sf librmw_fastrtps_cpp.so "$VENV/lib/librmw_implementation.so"
  # (c) librcl*.so list lib*__rosidl_generator_py.so as NEEDED; those need libpython
  #     symbols, so a non-Python process (the r2r node) dies at load. rcl uses nothing
  #     from them: drop the entries.
  for f in "$VENV"/lib/librcl.so "$VENV"/lib/librcl_action.so "$VENV"/lib/librcl_lifecycle.so; do
    [ -f "$f" ] || continue
    for d in $(readelf -d "$f" | grep -o 'lib[a-z_]*__rosidl_generator_py\.so' || true); do
      patchelf --remove-needed "$d" "$f"
    done
  done
  echo "$VENV_KEY" > "$VENV_STAMP"
  rm -f "$R2/.msg.stamp" "$R2/.vision_msgs.stamp" # the interfaces must be rebuilt against the new venv
fi

# ---------------------------------------------------------------- 5. setup.bash
SITE=lib/python$PYVER/site-packages
cat > "$R2/setup.bash.tmp" <<EOF
# Generated by tools/ros2-bootstrap.sh: ROS 2 Jazzy from PyPI wheels (.ros2/venv) plus the
# bpu_vlm_msgs prefix (.ros2/install) and the vision_msgs stand-in's (.ros2/install/vision_msgs).
# Source it: source .ros2/setup.bash
_r2=$R2
_venv=\$_r2/venv
export ROS_DISTRO=jazzy
export ROS_VERSION=2
export ROS_PYTHON_VERSION=3
# The wheels hard-wire Fast DDS: any other value makes rcl abort.
export RMW_IMPLEMENTATION=rmw_fastrtps_cpp
export AMENT_PREFIX_PATH=\$_r2/install:\$_r2/install/vision_msgs:\$_venv
export CMAKE_PREFIX_PATH=\$_r2/install:\$_r2/install/vision_msgs:\$_venv
export PYTHONPATH=\$_r2/install/$SITE:\$_r2/install/vision_msgs/$SITE
# The custom prefix, the venv's libraries and the wheels' vendored dependencies; needed at
# build time too (r2r's build script loads ROS libraries).
_libs=\$_r2/install/lib:\$_r2/install/vision_msgs/lib:\$_venv/lib
for _d in \$_venv/$SITE/ros_*.libs; do [ -d "\$_d" ] && _libs=\$_libs:\$_d; done
case ":\${LD_LIBRARY_PATH:-}:" in
  *":\$_libs:"*) ;;
  *) export LD_LIBRARY_PATH=\$_libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} ;;
esac
case ":\$PATH:" in
  *":\$_venv/bin:"*) ;;
  *) export PATH=\$_venv/bin:\$PATH ;;
esac
# Keep discovery on this host unless the caller chose otherwise.
export ROS_AUTOMATIC_DISCOVERY_RANGE=\${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}
unset _r2 _venv _libs _d
EOF
mv "$R2/setup.bash.tmp" "$R2/setup.bash"

# ---------------------------------------------------------------- 4. vision_msgs, bpu_vlm_msgs
# The stand-in for the distribution's vision_msgs (the board's colcon build never sees it:
# COLCON_IGNORE). Rebuilt only when its sources or the venv change; bpu_vlm_msgs depends
# on it, so its key is part of MSG_KEY.
VMSG_KEY=$( { echo "$VENV_KEY"; cd "$ROOT/tools/vision_msgs" && find . -type f -print0 | sort -z | xargs -0 sha256sum; } | sha256sum | cut -c1-16)
VMSG_STAMP=$R2/.vision_msgs.stamp
if [ "$(cat "$VMSG_STAMP" 2>/dev/null)" != "$VMSG_KEY" ] || [ ! -d "$VPREFIX" ]; then
  log "build tools/vision_msgs (stand-in for Humble's vision_msgs) into .ros2/install/vision_msgs"
  rm -rf "$R2/build/vision_msgs" "$VPREFIX"
  (
    # shellcheck disable=SC1091
    source "$R2/setup.bash"
    cmake -S "$ROOT/tools/vision_msgs" -B "$R2/build/vision_msgs" -DCMAKE_INSTALL_PREFIX="$VPREFIX" \
      -DPython3_EXECUTABLE="$VENV/bin/python" -DBUILD_TESTING=OFF -DCMAKE_BUILD_TYPE=Release >"$R2/vision_msgs-build.log" 2>&1 &&
      cmake --build "$R2/build/vision_msgs" -j"$(nproc)" >>"$R2/vision_msgs-build.log" 2>&1 &&
      cmake --install "$R2/build/vision_msgs" >>"$R2/vision_msgs-build.log" 2>&1
  ) || { tail -40 "$R2/vision_msgs-build.log" >&2; die "building tools/vision_msgs failed (full log: $R2/vision_msgs-build.log)"; }
  echo "$VMSG_KEY" > "$VMSG_STAMP"
fi

MSG_KEY=$( { echo "$VENV_KEY $VMSG_KEY"; cd "$ROOT/msg" && find . -type f ! -name COLCON_IGNORE -print0 | sort -z | xargs -0 sha256sum; } | sha256sum | cut -c1-16)
MSG_STAMP=$R2/.msg.stamp
if [ "$(cat "$MSG_STAMP" 2>/dev/null)" != "$MSG_KEY" ]; then
  log "build msg/ (bpu_vlm_msgs) into .ros2/install"
  # Everything in the prefix but the vision_msgs stand-in's own prefix.
  rm -rf "$R2/build/bpu_vlm_msgs"
  mkdir -p "$PREFIX"
  find "$PREFIX" -mindepth 1 -maxdepth 1 ! -name vision_msgs -exec rm -rf {} +
  (
    # shellcheck disable=SC1091
    source "$R2/setup.bash"
    cmake -S "$ROOT/msg" -B "$R2/build/bpu_vlm_msgs" -DCMAKE_INSTALL_PREFIX="$PREFIX" \
      -DPython3_EXECUTABLE="$VENV/bin/python" -DBUILD_TESTING=OFF -DCMAKE_BUILD_TYPE=Release >"$R2/msg-build.log" 2>&1 &&
      cmake --build "$R2/build/bpu_vlm_msgs" -j"$(nproc)" >>"$R2/msg-build.log" 2>&1 &&
      cmake --install "$R2/build/bpu_vlm_msgs" >>"$R2/msg-build.log" 2>&1
  ) || { tail -40 "$R2/msg-build.log" >&2; die "building msg/ failed (full log: $R2/msg-build.log)"; }
  # r2r caches its generated bindings by environment variables only, which a changed
  # msg/ (or vision_msgs) does not touch: drop them (r2r_msg_gen's C bindings and r2r's Rust types, each
  # cached in its own build output) so the next cargo build sees the new fields.
  for _profile in debug release; do
    if [ -d "${CARGO_TARGET_DIR:-$ROOT/target}/$_profile/build" ] && command -v cargo >/dev/null; then
      (cd "$ROOT" && cargo clean -q -p r2r_msg_gen -p r2r --profile "$( [ $_profile = debug ] && echo dev || echo release)") ||
        log "warning: could not drop r2r's cached bindings ($_profile); run cargo clean -p r2r_msg_gen -p r2r"
    fi
  done
  echo "$MSG_KEY" > "$MSG_STAMP"
fi

# ---------------------------------------------------------------- 6. bpu_vlm_client
CLIENT_KEY=$( { echo "$VENV_KEY"; cd "$ROOT/client" && git ls-files -co --exclude-standard -z . 2>/dev/null | sort -z | xargs -0 sha256sum; } | sha256sum | cut -c1-16)
CLIENT_STAMP=$R2/.client.stamp
if [ "$(cat "$CLIENT_STAMP" 2>/dev/null)" != "$CLIENT_KEY" ]; then
  log "install client/ (bpu_vlm_client) into .ros2/venv"
  # A pure-Python package: copied into the venv's site-packages (the venv has no `wheel`
  # for pip to build one with, and adding it to the pins would redo the whole venv).
  _purelib=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  rm -rf "$_purelib/bpu_vlm_client"
  cp -r "$ROOT/client/bpu_vlm_client" "$_purelib/bpu_vlm_client"
  find "$_purelib/bpu_vlm_client" -name __pycache__ -prune -exec rm -rf {} +
  echo "$CLIENT_KEY" > "$CLIENT_STAMP"
fi

# ---------------------------------------------------------------- check
(
  # shellcheck disable=SC1091
  source "$R2/setup.bash"
  "$VENV/bin/python" -c 'import rclpy, rclpy.action, bpu_vlm_msgs.msg, bpu_vlm_msgs.srv, vision_msgs.msg, diagnostic_msgs.msg, rosgraph_msgs.msg, cv2, numpy
from bpu_vlm_msgs.action import Ask
Ask.Goal(), Ask.Result(), Ask.Feedback()
from bpu_vlm_msgs.action import Detect
Detect.Goal(), Detect.Result(), Detect.Feedback()
import bpu_vlm_client' ||
    die "the venv cannot import rclpy/bpu_vlm_msgs/vision_msgs (remove .ros2/ and rerun)"
)
log "ready: source .ros2/setup.bash (Python $PYVER, ROS 2 Jazzy wheels, vision_msgs stand-in, bpu_vlm_msgs, bpu_vlm_client)"
