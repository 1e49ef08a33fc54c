"""rclpy peer for tests/node_contain.rs: panics on the blocking pool (a schema's compile, a
camera frame's check) are contained, and a shutdown during a model reopen answers what waits.

Run with .ros2/venv/bin/python. Prints one JSON line prefixed "REPORT " and then "PEER OK",
like node_peer.py (whose Peer it uses).

  schema    an ask whose json_schema compile panics in the node (a test hook), then a plain
            text ask that must succeed
  camera    jpeg frames on --camera (the first one's check panics in the node), then an ask
            about that camera and the diagnostics that count the rejected frame
  reopen    an ask that panics (the reset panics too, so the model is reopened, slowly);
            --count asks queued meanwhile; prints "QUEUED" once the node holds them all, then
            waits for every response with its last Token and its Answer
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rclpy  # noqa: E402
from sensor_msgs.msg import CompressedImage  # noqa: E402

from node_peer import Peer, peer_arguments, check, exact_jpeg, report_and_exit  # noqa: E402


def text_ask(p, a, rid, **extra):
    return p.greedy(rid, a.prompt, camera='none', **extra)


def diag_where(p, pred, what):
    while time.monotonic() < p.deadline:
        with p.lock:
            for d in p.diagnostics:
                if pred(d):
                    return dict(d)
        time.sleep(0.02)
    raise AssertionError(f'no diagnostics with {what}')


def mode_schema(p, a):
    p.wait_ask()
    # Refused while planned (never queued): a response, no Token and no Answer.
    req, fut = p.ask_async(request_id='schema-1', prompt=a.prompt, camera='none',
                           temperature=0.0, max_new_tokens=a.max_new_tokens,
                           json_schema=json.dumps({'type': 'integer'}))
    failed = p.finish(req, fut, need_last=False)
    after = text_ask(p, a, 'schema-2')
    return {'failed': failed, 'after': after}


def mode_camera(p, a):
    p.wait_ask()
    msg = CompressedImage()
    msg.format = 'jpeg'
    msg.header.frame_id = 'cam'
    msg.data = exact_jpeg(64, 48).tobytes()
    # Camera QoS is best effort: frames go out until the node has seen (and rejected) one.
    def seen(d):
        return int(d.get(f'camera {a.camera} rejected', '0')) >= 1
    for _ in range(20):
        p.publish_frames(a.camera, msg, kind=CompressedImage, count=1)
        with p.lock:
            if any(seen(d) for d in p.diagnostics):
                break
    rejected = diag_where(p, seen, 'a rejected frame')
    p.publish_frames(a.camera, msg, kind=CompressedImage, count=3)
    after = p.greedy('camera-1', a.prompt, camera=a.camera)
    return {'rejected': rejected, 'after': after, 'diag': p.last_diag()}


def mode_reopen(p, a):
    p.wait_ask()
    failed = text_ask(p, a, 'reopen-1')
    pending = [p.ask_async(request_id=f'queued-{i}', prompt=a.prompt, camera='none',
                           temperature=0.0, max_new_tokens=a.max_new_tokens)
               for i in range(a.count)]
    diag_where(p, lambda d: d.get('queue_depth') == str(a.count), f'{a.count} queued')
    print('QUEUED', flush=True)
    queued = [p.finish(req, fut) for req, fut in pending]
    return {'failed': failed, 'queued': queued}


def main():
    ap = peer_arguments()
    ap.add_argument('mode', choices=['schema', 'camera', 'reopen'])
    ap.add_argument('--prompt', default='What is in the picture?')
    ap.add_argument('--camera', default='/cam_compressed')
    ap.add_argument('--max-new-tokens', type=int, default=8)
    ap.add_argument('--count', type=int, default=2)
    ap.add_argument('--timeout', type=float, default=150.0)
    a = ap.parse_args()
    rclpy.init()
    p = Peer(a)
    report_and_exit(lambda: {'schema': mode_schema, 'camera': mode_camera,
                             'reopen': mode_reopen}[a.mode](p, a))


if __name__ == '__main__':
    main()
