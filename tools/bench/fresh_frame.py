"""Fresh-frame benchmark client (not a test): "What do you see?" at random moments while a
camera publishes 640x480 frames at 10 Hz.

    bash tools/bench/fresh-frame.sh [ASKS]    # builds, makes the package, runs this twice

Asks ASKS greedy questions one at a time, each after a random pause (uniform in
[--min-gap, --max-gap] s), on the default camera. Per ask: the node's ttft_s (from the
request's arrival) and the age of the frame used (the client's ROS time at the call minus the
answer's image_stamp, both from this host's clock). At the end the node's priming counters
from /diagnostics (hit rate, BPU duty). Prints one JSON object.

--camera picks the scripted camera (10 Hz, 640x480):
  fixed       scene_a, the same pixels every frame (the original benchmark)
  static      scene_a with Gaussian sensor noise (sigma 4/255) on every pixel of every frame
  occasional  as static, the scene switching between scene_a and scene_b every --switch-s s
  moving      every frame a different scene (the three scenes in turn, panned 16 px a frame)
Besides TTFT and frame age, per ask: the information age at the first token (TTFT + the age
at the call of the frame the answer is about: of scene_checked_stamp when the node reports
one later than image_stamp, i.e. the newest frame that checked it), and whether the answer was
about a scene no longer in front of the camera (a frame of another scene was published
between the frame used and 0.2 s before the call).

--detect N sends N `vlm/detect` goals (query "the cup", max_objects 1) the same way instead of
asks, and reports per goal the time from sending it to its first complete detection (the first
feedback with an object) and to its result, with the result's ttft_s and answer tokens.
--points asks them for points instead of boxes: a package without weights answers the same
numbers at every coordinate (its logits are one fixed row, and greedy decoding under the
schema draws the same digits each time), so its one box has no width and is dropped; its one
point is kept.
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
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import qos_profile_sensor_data

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..', 'tests', 'peers'))
from node_peer import load_rgb, rgb8  # noqa: E402  (the test peer's frame helpers)
from bpu_vlm_client.action_client import ActionClient  # noqa: E402  (node_peer's path)

from bpu_vlm_msgs.action import Detect  # noqa: E402
from bpu_vlm_msgs.srv import Ask  # noqa: E402
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402


def quantile(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--asks', type=int, default=30)
    ap.add_argument('--min-gap', type=float, default=0.5)
    ap.add_argument('--max-gap', type=float, default=8.0)
    ap.add_argument('--max-new-tokens', type=int, default=2)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--label', default='')
    ap.add_argument('--camera', default='fixed',
                    choices=['fixed', 'static', 'occasional', 'moving'])
    ap.add_argument('--switch-s', type=float, default=10.0)
    ap.add_argument('--detect', type=int, default=0)
    ap.add_argument('--points', action='store_true')
    a = ap.parse_args()
    rng = random.Random(a.seed)
    rclpy.init()
    node = rclpy.create_node('fresh_frame_bench')
    diag = {}
    lock = threading.Lock()

    def on_diag(d):
        for s in d.status:
            if s.name.endswith(': engine'):
                with lock:
                    diag.clear()
                    diag.update({kv.key: kv.value for kv in s.values})

    node.create_subscription(DiagnosticArray, '/diagnostics', on_diag, 10)
    cam = node.create_publisher(Image, '/image_raw', qos_profile_sensor_data)
    client = node.create_client(Ask, '/ask')
    ex = SingleThreadedExecutor()
    ex.add_node(node)
    threading.Thread(target=ex.spin, daemon=True).start()
    if not client.wait_for_service(timeout_sec=600):
        raise SystemExit('no /ask')
    scenes = [load_rgb(f'scene_{k}.png', (640, 480)) for k in 'abc']
    frame = rgb8(scenes[0])
    stop = threading.Event()
    # (stamp in s, scene id) of every frame published, in order.
    shown = []
    noise = np.random.default_rng(a.seed)
    t_start = time.monotonic()

    def picture(i):
        """Frame i of the scripted camera and its scene id."""
        if a.camera == 'fixed':
            return frame, 0
        if a.camera == 'moving':
            img = np.roll(scenes[i % 3], 16 * i, axis=1)
            scene = i
        else:
            scene = 0
            if a.camera == 'occasional':
                scene = int((time.monotonic() - t_start) // a.switch_s)
            img = scenes[scene % 2]
        noisy = img.astype(np.float32) + noise.normal(0.0, 4.0, img.shape).astype(np.float32)
        return rgb8(np.clip(np.rint(noisy), 0, 255).astype(np.uint8)), scene

    def camera():
        i = 0
        while not stop.is_set():
            msg, scene = picture(i)
            msg.header.stamp = node.get_clock().now().to_msg()
            with lock:
                shown.append((msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9, scene))
            cam.publish(msg)
            i += 1
            time.sleep(0.1)

    def scene_at(stamp):
        with lock:
            return next((sc for t, sc in shown if abs(t - stamp) < 1e-6), None)

    def stale(used, sent):
        """A frame of another scene was published after the frame used, 0.2 s before the call."""
        scene = scene_at(used)
        with lock:
            return any(used < t <= sent - 0.2 and sc != scene for t, sc in shown)

    threading.Thread(target=camera, daemon=True).start()
    time.sleep(2.0)
    if a.detect:
        print(json.dumps(dict(label=a.label, **detect_goals(node, rng, a))), flush=True)
        os._exit(0)
    ttft, age, info, stale_answers = [], [], [], 0
    since_switch = []  # occasional: seconds from the last switch to each ask
    for i in range(a.asks):
        time.sleep(rng.uniform(a.min_gap, a.max_gap))
        req = Ask.Request(request_id=f'f{i}', prompt='What do you see?', temperature=0.0,
                          max_new_tokens=a.max_new_tokens, use_default_stop=False)
        sent = node.get_clock().now().nanoseconds * 1e-9
        if a.camera == 'occasional':
            since_switch.append((time.monotonic() - t_start) % a.switch_s)
        fut = client.call_async(req)
        while not fut.done():
            time.sleep(0.002)
        r = fut.result()
        if not r.success:
            raise SystemExit(f'ask {i} failed: {r.error_code} {r.error_message}')
        ttft.append(r.ttft_s)
        used = r.image_stamp.sec + r.image_stamp.nanosec * 1e-9
        age.append(sent - used)
        checked = getattr(r, 'scene_checked_stamp', None)
        checked = checked.sec + checked.nanosec * 1e-9 if checked is not None else 0.0
        info.append(r.ttft_s + sent - max(used, checked))
        stale_answers += int(stale(used, sent))
    stop.set()
    time.sleep(0.5)
    with lock:
        d = dict(diag)
    print(json.dumps({
        'label': a.label,
        'asks': a.asks,
        'ttft_s_median': round(statistics.median(ttft), 3),
        'ttft_s_p95': round(quantile(ttft, 0.95), 3),
        'frame_age_s_median': round(statistics.median(age), 3),
        'frame_age_s_max': round(max(age), 3),
        'camera': a.camera,
        'info_age_s_median': round(statistics.median(info), 3),
        'info_age_s_max': round(max(info), 3),
        'stale_scene_answers': stale_answers,
        'prefills_on_scene_change': d.get('prefills_on_scene_change'),
        'prefill_scene_same_asks': d.get('prefill_scene_same_asks'),
        'prefill_scene_changed_asks': d.get('prefill_scene_changed_asks'),
        'prefill_hit_rate': d.get('prefill_hit_rate'),
        'prefill_bpu_duty': d.get('prefill_bpu_duty'),
        'prefills_done': d.get('prefills_done'),
        'prefills_stopped': d.get('prefills_stopped'),
        'ttft_s': [round(x, 3) for x in ttft],
        **late_after_switch(ttft, since_switch),
    }), flush=True)
    # Tearing rclpy down under a live executor thread can abort the process; all is printed.
    os._exit(0)


def late_after_switch(ttft, since_switch):
    """occasional: the asks that came >= 4 s after a switch, their TTFT (the goal:
    the static figures there)."""
    late = [t for t, s in zip(ttft, since_switch) if s >= 4.0]
    if not late:
        return {}
    return {'asks_4s_after_switch': len(late),
            'ttft_s_median_4s_after_switch': round(statistics.median(late), 3),
            'ttft_s_max_4s_after_switch': round(max(late), 3)}


def detect_goals(node, rng, a):
    """`a.detect` detect goals at random moments: time to the first complete detection and
    to the result, from the goal's sending (this client's clock)."""
    client = ActionClient(node, Detect, '/vlm/detect')
    if not client.wait_for_server(timeout_sec=60):
        raise SystemExit('no vlm/detect')
    first, result, ttft, tokens, objects, texts = [], [], [], [], [], set()
    for i in range(a.detect):
        time.sleep(rng.uniform(a.min_gap, a.max_gap))
        seen = []

        def feedback(fb, seen=seen):
            if fb.feedback.detections.detections and not seen:
                seen.append(time.monotonic())

        goal = Detect.Goal(request_id=f'd{i}', query='the cup', max_objects=1,
                           points=a.points)
        t0 = time.monotonic()
        handle = client.send_goal_async(goal, feedback_callback=feedback)
        while not handle.done():
            time.sleep(0.002)
        res = handle.result().get_result_async()
        while not res.done():
            time.sleep(0.002)
        r = res.result().result
        t1 = time.monotonic()
        if not r.success:
            raise SystemExit(f'detect {i} failed: {r.error_code} {r.error_message}')
        result.append(t1 - t0)
        ttft.append(r.ttft_s)
        tokens.append(r.completion_tokens)
        objects.append(len(r.detections.detections))
        texts.add(r.text)
        if seen:
            first.append(seen[0] - t0)
    return {
        'goals': a.detect,
        'first_detection_s_median': round(statistics.median(first), 3) if first else None,
        'result_s_median': round(statistics.median(result), 3),
        'result_s_p95': round(quantile(result, 0.95), 3),
        'ttft_s_median': round(statistics.median(ttft), 3),
        'answer_tokens_median': statistics.median(tokens),
        'first_detection_s_p95': round(quantile(first, 0.95), 3) if first else None,
        'objects': objects,
        'texts': sorted(texts),
    }


if __name__ == '__main__':
    main()
