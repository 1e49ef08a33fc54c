"""Watch benchmark client (not a test): standing questions (vlm/watch) on a scripted camera.

    bash tools/bench/watch.sh [SWITCHES] [SEED]   # builds, makes the package, runs this twice

A 640x480 camera at 10 Hz shows scene_a with Gaussian noise (sigma 4/255) on every pixel.
With --watches N (0, 1 or 2), N watches ("Is there a cup?", "Is the door open?", yes/no) are
started once the scene is primed. Then:
  static   --static-s seconds of the unchanged noisy scene: evaluations and primings counted
           (none: the watches cost no BPU time on a static scene).
  switches --switches scene switches (a -> b -> c -> a ...), one every --switch-s s. After each,
           one ask "What do you see?" at switch + 0.5 s (scene_settle_s) + a seeded delay in
           [0, --spread] s, so it meets the watches' evaluations of the new scene; its ttft_s.
           Per watch and switch: the time from the first frame of the new scene to the
           feedback of its evaluation (the time a changed answer's event would take).
The same seed gives the same ask moments, so a run with --watches 2 and one with --watches 0
pair ask by ask. --no-asks leaves the asks out: the time from a switch to each watch's
evaluation alone (tower, prompt chunks, question, answer). Prints one JSON object.
"""

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time

import numpy as np
import rclpy
from rclpy.qos import qos_profile_sensor_data

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..', 'tests', 'peers'))
from node_peer import load_rgb, rgb8  # noqa: E402  (the test peer's frame helpers)

from bpu_vlm_client import VlmClient  # noqa: E402
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

QUESTIONS = ['Is there a cup?', 'Is the door open?']


def median(xs):
    return round(statistics.median(xs), 3) if xs else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--watches', type=int, default=2)
    ap.add_argument('--switches', type=int, default=8)
    ap.add_argument('--switch-s', type=float, default=8.0)
    ap.add_argument('--static-s', type=float, default=20.0)
    ap.add_argument('--spread', type=float, default=2.0)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--no-asks', action='store_true',
                    help='no ask after the switches: the time from a switch to the evaluations alone')
    ap.add_argument('--label', default='')
    a = ap.parse_args()
    rclpy.init()
    vlm = VlmClient(timeout=300.0)
    node = vlm.node
    diag = {}
    lock = threading.Lock()

    def on_diag(d):
        for s in d.status:
            if s.name.endswith(': engine'):
                with lock:
                    diag.clear()
                    diag.update({kv.key: kv.value for kv in s.values})
    node.create_subscription(DiagnosticArray, '/diagnostics', on_diag, 10)

    def d(key):
        with lock:
            return float(diag.get(key, 'nan'))

    scenes = [load_rgb(f'scene_{k}.png', (640, 480)).astype(np.float32) for k in 'abc']
    state = {'scene': 0, 'first': {}}  # scene index; first publish time of each switch
    rng = np.random.default_rng(3)
    pub = node.create_publisher(Image, '/image_raw', qos_profile_sensor_data)
    stop = threading.Event()

    def camera():
        while not stop.is_set():
            k = state['scene']
            noisy = scenes[k % 3] + rng.normal(0.0, 4.0, scenes[0].shape)
            msg = rgb8(np.clip(np.rint(noisy), 0, 255).astype(np.uint8))
            msg.header.stamp = node.get_clock().now().to_msg()
            state['first'].setdefault(k, time.monotonic())
            pub.publish(msg)
            time.sleep(0.1)
    threading.Thread(target=camera, daemon=True).start()

    vlm.wait_for_node()
    while not d('prefills_done') >= 1:
        time.sleep(0.1)
    feedback = {q: [] for q in QUESTIONS[:a.watches]}
    watches = []
    for q in QUESTIONS[:a.watches]:
        watches.append(vlm.watch(q, on_feedback=lambda f, q=q: feedback[q].append(
            (time.monotonic(), f.camera_silent, f.evaluation_s))))
    while any(not fb for fb in feedback.values()):
        time.sleep(0.05)
    time.sleep(1.0)
    e0, p0 = d('watch_evaluations'), d('prefills_done')
    time.sleep(a.static_s)
    static = {'static_s': a.static_s, 'evaluations': d('watch_evaluations') - e0,
              'primings': d('prefills_done') - p0}

    r = random.Random(a.seed)
    asks, to_feedback = [], {q: [] for q in feedback}
    for i in range(1, a.switches + 1):
        state['scene'] = i
        while i not in state['first']:
            time.sleep(0.005)
        t_switch = state['first'][i]
        delay = r.uniform(0.0, a.spread)
        if not a.no_asks:
            time.sleep(max(0.0, t_switch + 0.5 + delay - time.monotonic()))
            resp = vlm.ask('What do you see?', temperature=0.0, max_new_tokens=8)
            asks.append(round(resp.ttft_s, 3) if resp.success else None)
        time.sleep(max(0.0, t_switch + a.switch_s - time.monotonic()))
        for q, fb in feedback.items():
            after = [t - t_switch for t, silent, _ in fb if t > t_switch and not silent]
            to_feedback[q].append(round(min(after), 3) if after else None)
    for w in watches:
        w.cancel()
    stop.set()
    ok = [x for x in asks if x is not None]
    lat = [x for v in to_feedback.values() for x in v if x is not None]
    print(json.dumps({
        'label': a.label, 'watches': a.watches, 'seed': a.seed, 'asks': not a.no_asks, **static,
        'ask_ttft_s': asks, 'ask_ttft_s_median': median(ok),
        'ask_ttft_s_max': max(ok) if ok else None,
        'switch_to_evaluation_s': to_feedback, 'switch_to_evaluation_s_median': median(lat),
        'switch_to_evaluation_s_max': max(lat) if lat else None,
        'evaluations_yielded': d('watch_evaluations_yielded'),
        'watch_events': d('watch_events'),
    }), flush=True)
    vlm.close()


if __name__ == '__main__':
    main()
