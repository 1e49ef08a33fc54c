"""rclpy peer for tests/node_client.rs: the bpu_vlm_client package against the real node.

Run with .ros2/venv/bin/python after `source .ros2/setup.bash`. Prints "REPORT <json>" and
"PEER OK" (node_peer.report_and_exit).

  streams   a long ask from another client (plain rclpy, its own request id) runs while
            `VlmClient.stream` asks; the report has the stream's deltas, its response, and
            the other request's Tokens as seen on the topic
  action    `send_goal` streamed to its end, then a goal cancelled after its first delta
  refused   `stream` of a request the node refuses (NaN temperature): no delta, a response
  detect    `detect` on a request image: the objects handed to `on_detection` as found, and
            the result
  watch     `watch` on a camera: a watch that ends by its `until`, one that is cancelled
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rclpy  # noqa: E402
from rclpy.qos import qos_profile_sensor_data  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from bpu_vlm_client import VlmClient  # noqa: E402
from node_peer import (Peer, load_rgb, peer_arguments, plain, report_and_exit,  # noqa: E402
                       rgb8, with_header)


def mode_streams(a):
    other = Peer(a)  # the other client, on its own node
    other.wait_ask()
    vlm = VlmClient(namespace=a.namespace, timeout=a.timeout)
    req, fut = other.ask_async(request_id='other-1', prompt=a.prompt, camera='none',
                               temperature=0.0, max_new_tokens=a.long_tokens)
    # Wait until the other request streams, so the two overlap on the topic.
    end = time.monotonic() + a.timeout
    while time.monotonic() < end:
        with other.lock:
            if other.tokens.get('other-1'):
                break
        time.sleep(0.01)
    s = vlm.stream(a.prompt2, camera='none', temperature=0.0, max_new_tokens=a.max_new_tokens)
    deltas = list(s)
    with other.lock:
        other_during = len(other.tokens.get('other-1', []))
    other_done = other.finish(req, fut)
    return {'deltas': deltas, 'request_id': s.request_id, 'finish_reason': s.finish_reason,
            'response': plain(s.response), 'other': other_done,
            'other_tokens_while_streaming': other_during}


def mode_action(a):
    vlm = VlmClient(namespace=a.namespace, timeout=a.timeout)
    g = vlm.send_goal(a.prompt, camera='none', temperature=0.0,
                      max_new_tokens=a.max_new_tokens)
    deltas = list(g.stream())
    done = plain(g.result())
    c = vlm.send_goal(a.prompt, camera='none', temperature=0.0, max_new_tokens=a.long_tokens)
    it = iter(c.stream())
    first = next(it, None)
    accepted = c.cancel()
    rest = list(it)
    return {'deltas': deltas, 'result': done, 'request_id': g.request_id,
            'cancel_first': first, 'cancel_accepted': accepted, 'cancel_rest': rest,
            'cancel_result': plain(c.result()), 'cancel_finish': c.stream().finish_reason}


def mode_refused(a):
    vlm = VlmClient(namespace=a.namespace, timeout=a.timeout)
    s = vlm.stream(a.prompt, camera='none', temperature=float('nan'))
    t0 = time.monotonic()
    deltas = list(s)
    return {'deltas': deltas, 'response': plain(s.response),
            'seconds': time.monotonic() - t0}


def mode_detect(a):
    """`detect` on a request image: each object handed out as found, then the result."""
    vlm = VlmClient(namespace=a.namespace, timeout=a.timeout)
    img = with_header(rgb8(load_rgb('scene_a.png', (640, 480))), 'cam_link', 12, 34)
    found = []
    r = vlm.detect('the cups', on_detection=found.append, images=[img], max_objects=3)
    box = lambda d: [d.bbox.center.position.x, d.bbox.center.position.y,  # noqa: E731
                     d.bbox.size_x, d.bbox.size_y, d.results[0].hypothesis.class_id]
    return {'success': r.success, 'error_code': r.error_code, 'text': r.text,
            'frame_id': r.detections.header.frame_id,
            'result': [box(d) for d in r.detections.detections],
            'found': [box(d) for d in found],
            'result_scores': [d.results[0].hypothesis.score for d in r.detections.detections],
            'found_scores': [d.results[0].hypothesis.score for d in found]}


def mode_watch(a):
    """`watch` on a 10 Hz camera: one watch ends by its `until`, another is cancelled after
    its first evaluation; the feedback each handed out, and the results."""
    vlm = VlmClient(namespace=a.namespace, timeout=a.timeout)
    pub = vlm.node.create_publisher(Image, '/image_raw', qos_profile_sensor_data)
    frame = rgb8(load_rgb('scene_a.png', (640, 480)))
    stop = threading.Event()

    def camera():
        while not stop.is_set():
            frame.header.stamp = vlm.node.get_clock().now().to_msg()
            pub.publish(frame)
            time.sleep(0.1)

    cam = threading.Thread(target=camera, daemon=True)
    cam.start()
    try:
        until_fb, cancel_fb = [], []
        w = vlm.watch('Is there a cup?', on_feedback=until_fb.append,
                      json_schema='{"enum": ["yes"]}', until='"yes"')
        until = w.result(timeout=a.timeout)
        c = vlm.watch('Is the door open?', on_feedback=cancel_fb.append)
        end = time.monotonic() + a.timeout
        while not any(not f.camera_silent for f in cancel_fb) and time.monotonic() < end:
            time.sleep(0.02)
        accepted = c.cancel()
        cancelled = c.result(timeout=a.timeout)
    finally:
        stop.set()
        cam.join()
    return {'until': plain(until), 'until_feedback': [plain(f) for f in until_fb],
            'cancel_accepted': accepted, 'cancelled': plain(cancelled),
            'cancel_feedback': [plain(f) for f in cancel_fb]}


def main():
    ap = peer_arguments()
    ap.add_argument('mode', choices=['streams', 'action', 'refused', 'detect', 'watch'])
    ap.add_argument('--namespace', default='')
    ap.add_argument('--prompt', default='What is in the picture?')
    ap.add_argument('--prompt2', default='Describe the robot.')
    ap.add_argument('--max-new-tokens', type=int, default=24)
    ap.add_argument('--long-tokens', type=int, default=200)
    ap.add_argument('--timeout', type=float, default=120.0)
    a = ap.parse_args()
    rclpy.init()
    report_and_exit(lambda: {a.mode: {'streams': mode_streams, 'action': mode_action,
                                      'refused': mode_refused, 'detect': mode_detect,
                                      'watch': mode_watch}[a.mode](a)})


if __name__ == '__main__':
    main()
