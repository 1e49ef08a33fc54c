# Sourced by the node benchmarks that run the release vlm_node on the 4B-shaped ctx4k package
# under the simulator's S100P timing model (fresh-frame.sh, watch.sh), from the repository
# root: the ROS environment, a domain of its own, the release build, the package (made once,
# without weights, prefill pads first), and Fast DDS's large-frame profile for 640x480 rgb8
# frames on both sides. Sets BIN and PKG.
bash tools/ros2-bootstrap.sh >/dev/null
# shellcheck disable=SC1091
source .ros2/setup.bash
export ROS_DOMAIN_ID=${ROS_DOMAIN_ID:-$((RANDOM % 100 + 1))} ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
cargo build --release -p bpu_vlm --bin vlm_node -p vlm-cli --bin vlm
BIN=${CARGO_TARGET_DIR:-$PWD/target}/release
PKG="$PWD/.cache/bench/q4b-ctx4k-pads-first"
if [ ! -f "$PKG/model.json" ]; then
  "$BIN/vlm" make-sim-package --config tools/bench/configs/qwen35-4b.json --no-weights \
    --tokenizer tools/fixtures/tokenizer.json --cache-len 4096 \
    --prefill-pads --prefill-min-tail 5 --pad-layout first --out "$PKG"
fi
export FASTRTPS_DEFAULT_PROFILES_FILE="$PWD/launch/fastdds_large_frames.xml"
export FASTDDS_DEFAULT_PROFILES_FILE="$FASTRTPS_DEFAULT_PROFILES_FILE"
