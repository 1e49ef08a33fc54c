"""Node benchmark (not a test): latency, TTFT and memory of a running vlm_node over a soak.

    bash tools/bench/node-soak.sh [ASKS]      # builds vlm_node (release), runs this, stops it

Asks ASKS questions in sequence (text only and with a camera frame, greedy, 16 new tokens,
the first ten text asks in five sessions), measuring each round trip at the client (service call
to the last Token) and reading the node's RSS (/proc/PID/status) before the first ask, after
the first 10 and at the end. Prints one JSON object.
"""

import argparse
import json
import os
import statistics
import sys
import threading
import time

import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..', 'tests', 'peers'))
from node_peer import load_rgb, rgb8  # noqa: E402  (the test peer's frame helpers)

from bpu_vlm_msgs.msg import Token  # noqa: E402
from bpu_vlm_msgs.srv import Ask  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402


def rss_kib(pid):
    with open(f'/proc/{pid}/status') as f:
        for line in f:
            if line.startswith('VmRSS:'):
                return int(line.split()[1])
    return -1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--pid', type=int, required=True)
    ap.add_argument('--asks', type=int, default=200)
    a = ap.parse_args()
    rclpy.init()
    node = rclpy.create_node('node_bench')
    lasts = {}
    lock = threading.Lock()

    def on_token(t):
        if t.last:
            with lock:
                lasts[t.request_id] = time.monotonic()

    node.create_subscription(Token, '/vlm/tokens', on_token,
                             QoSProfile(depth=4096, history=HistoryPolicy.KEEP_LAST,
                                        reliability=ReliabilityPolicy.RELIABLE))
    cam = node.create_publisher(Image, '/image_raw', qos_profile_sensor_data)
    client = node.create_client(Ask, '/ask')
    ex = SingleThreadedExecutor()
    ex.add_node(node)
    threading.Thread(target=ex.spin, daemon=True).start()
    if not client.wait_for_service(timeout_sec=120):
        raise SystemExit('no /ask')
    frame = rgb8(load_rgb('scene_a.png', (640, 480)))
    for _ in range(5):
        cam.publish(frame)
        time.sleep(0.1)
    rss = {'before': rss_kib(a.pid)}
    rtt, ttft, tps = {'text': [], 'image': []}, {'text': [], 'image': []}, []
    for i in range(a.asks):
        kind = 'image' if i % 2 else 'text'
        req = Ask.Request(request_id=f'b{i}', prompt='What is in front of the robot?',
                          camera='' if kind == 'image' else 'none', temperature=0.0,
                          max_new_tokens=16, use_default_stop=False,
                          session_id=f's{i % 5}' if i < 20 and kind == 'text' else '')
        t0 = time.monotonic()
        fut = client.call_async(req)
        while not fut.done():
            time.sleep(0.001)
        while req.request_id not in lasts:
            time.sleep(0.001)
        r = fut.result()
        if not r.success:
            raise SystemExit(f'ask {i} failed: {r.error_code} {r.error_message}')
        rtt[kind].append(lasts[req.request_id] - t0)
        ttft[kind].append(r.ttft_s)
        tps.append(r.decode_tokens_per_s)
        if i == 9:
            rss['after_10'] = rss_kib(a.pid)
        cam.publish(frame)
    rss['after_all'] = rss_kib(a.pid)
    med = lambda xs: round(statistics.median(xs) * 1000, 2) if xs else None  # noqa: E731
    print(json.dumps({
        'asks': a.asks,
        'round_trip_ms_median': {k: med(v) for k, v in rtt.items()},
        'node_ttft_ms_median': {k: med(v) for k, v in ttft.items()},
        'decode_tokens_per_s_median': round(statistics.median(tps), 1),
        'rss_kib': rss,
    }))
    ex.shutdown()
    rclpy.try_shutdown()


if __name__ == '__main__':
    main()
