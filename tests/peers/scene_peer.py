"""rclpy peer for tests/node_scene.rs: priming that follows the scene (scene_check).

Run with .ros2/venv/bin/python. Prints one JSON line prefixed "REPORT " and then "PEER OK",
like node_peer.py (whose Peer it uses). A scripted camera publishes scene_a on /cam at 10 Hz,
each frame with Gaussian noise of sigma 4/255 on every pixel and a fresh stamp.

  static   once scene_a is primed, 10 s of the noisy static scene: diagnostics before/after
  same     U asks on the unchanged scene (served from the priming, scene-checked)
  switch   the camera switches to scene_b; V asks 0.25 s later (before the new scene settled)
  new      once scene_b is primed, W asks on it
Every ask records the peer's clock at the call (ROS time, the clock the stamps use).
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from node_peer import Peer, ScriptedCamera, check, peer_arguments, report_and_exit  # noqa: E402
from node_peer import ros_now as now  # noqa: E402


def count(d, key):
    return int(d.get(key, '-1'))


def diag_until(p, what, pred):
    while time.monotonic() < p.deadline:
        d = p.last_diag()
        if d and pred(d):
            return d
        time.sleep(0.02)
    raise AssertionError(f'diagnostics never showed {what}')


def run(p, a):
    p.wait_ask()
    rep = {}
    cam = ScriptedCamera(p, '/cam', seed=7)

    def ask(rid):
        served = count(p.last_diag(), 'requests_served')
        rep[f'{rid}_at'] = now(p)
        rep[rid] = p.greedy(rid, a.prompt)
        # The counters once the worker counted this ask.
        rep[f'd_{rid}'] = diag_until(p, f'{rid} served',
                                     lambda d: count(d, 'requests_served') > served)

    try:
        # static
        diag_until(p, 'a priming', lambda d: count(d, 'prefills_done') >= 1)
        time.sleep(1.0)
        rep['d_static_0'] = p.last_diag()
        time.sleep(10.0)
        rep['d_static_1'] = p.last_diag()
        # same
        ask('U')
        # switch
        cam.scene = 'b'
        time.sleep(0.25)
        ask('V')
        # new
        diag_until(p, 'scene_b primed',
                   lambda d: count(d, 'prefills_on_scene_change') >= 1
                   and count(d, 'prefills_done') > count(rep['d_V'], 'prefills_done'))
        ask('W')
    finally:
        cam.stop.set()
        cam.thread.join()
    rep['sent'] = cam.sent
    return rep


def main():
    ap = peer_arguments()
    ap.add_argument('--prompt', default='What do you see?')
    ap.add_argument('--max-new-tokens', type=int, default=8)
    ap.add_argument('--timeout', type=float, default=280.0)
    a = ap.parse_args()
    check(a.max_new_tokens > 0, 'max_new_tokens')
    import rclpy
    rclpy.init()
    p = Peer(a)
    report_and_exit(lambda: run(p, a))


if __name__ == '__main__':
    main()
