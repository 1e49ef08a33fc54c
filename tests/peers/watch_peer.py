"""rclpy peer for tests/node_watch.rs: standing questions (the vlm/watch action).

Run with .ros2/venv/bin/python. Prints one JSON line prefixed "REPORT " and then "PEER OK",
like node_peer.py (whose Peer it uses). A scripted camera publishes on /cam at 10 Hz, each
frame with Gaussian noise of sigma 4/255 on every pixel and a fresh stamp.

  scripted  invalid goals (each aborted with its reason); W watches "Is there a cup?"
            (default schema, min_interval_s 1, max_interval_s 0): 10 s of the static noisy
            scene, then three scene switches 4 s apart, then the camera falls silent and comes
            back with another scene; X (max_watches 2 reached) is aborted busy while W and Y
            run (Y is then cancelled); U (schema {"enum": ["yes"]}, until "yes") succeeds; W is cancelled.
  yield     W watches on a slowed BPU; an ask arrives while W evaluates a new scene: the
            evaluation yields (counted) and is made again after the ask, on the new scene.
  sigterm   two watches on the static scene; "FIRST TOKEN" once both have evaluated (the
            test sends SIGTERM then); both results.
Every feedback is recorded with the peer's clock, every WatchEvent on vlm/events.
"""

import os
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from node_peer import Peer, ScriptedCamera as Camera, check, peer_arguments, plain, report_and_exit  # noqa: E402
from node_peer import ros_now as now  # noqa: E402

from bpu_vlm_msgs.action import Watch  # noqa: E402
from bpu_vlm_msgs.msg import WatchEvent  # noqa: E402
from bpu_vlm_client.action_client import ActionClient  # noqa: E402  (node_peer's path)
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from unique_identifier_msgs.msg import UUID  # noqa: E402


class Watcher:
    """Goals of vlm/watch with their feedback (and when it came) and results."""

    def __init__(self, p):
        self.p = p
        self.client = ActionClient(p.node, Watch, 'vlm/watch')
        self.feedback = {}
        self.events = []
        self.lock = threading.RLock()
        qos = QoSProfile(depth=64, reliability=ReliabilityPolicy.RELIABLE)
        p.node.create_subscription(WatchEvent, 'vlm/events', self.on_event, qos)
        # The feedback topic itself: rclpy's ActionClient drops feedback that arrives before
        # it has processed the goal's response, and a watch's first evaluation may be that
        # quick.
        p.node.create_subscription(Watch.Impl.FeedbackMessage, 'vlm/watch/_action/feedback',
                                   self.on_feedback, QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE))
        self.names = {}
        check(self.client.wait_for_server(timeout_sec=p.left()), 'no vlm/watch action')
        # A goal's first evaluation may come at once: both subscriptions must be matched.
        for topic in ('/vlm/watch/_action/feedback', '/vlm/events'):
            while p.node.count_publishers(topic) == 0 and time.monotonic() < p.deadline:
                time.sleep(0.02)
        time.sleep(0.3)

    def on_feedback(self, msg):
        with self.lock:
            name = self.names.get(bytes(msg.goal_id.uuid))
            if name is not None:
                self.feedback[name].append(dict(plain(msg.feedback), at=now(self.p)))

    def on_event(self, e):
        with self.lock:
            self.events.append(dict(plain(e), at=now(self.p)))

    def wait(self, future, what):
        while not future.done() and time.monotonic() < self.p.deadline:
            time.sleep(0.01)
        check(future.done(), f'no {what}')
        return future.result()

    def send(self, name, **fields):
        goal = Watch.Goal()
        for k, v in fields.items():
            setattr(goal, k, v)
        goal_id = UUID(uuid=list(uuid.uuid4().bytes))
        with self.lock:
            self.feedback[name] = []
            self.names[bytes(goal_id.uuid)] = name
        handle = self.wait(self.client.send_goal_async(goal, goal_uuid=goal_id),
                           f'goal response of {name}')
        check(handle.accepted, f'{name} not accepted')
        # Asked for at once, as a client that must not miss it does: a node that stops
        # answers the result requests it holds, not those that come after.
        handle.result_future = handle.get_result_async()
        return handle

    def result(self, handle, name):
        r = self.wait(handle.result_future, f'result of {name}')
        return {'status': r.status, 'result': plain(r.result), 'goal_id': [int(x) for x in handle.goal_id.uuid]}

    def evaluations(self, name):
        with self.lock:
            return [f for f in self.feedback[name] if not f['camera_silent']]

    def until(self, what, pred):
        while time.monotonic() < self.p.deadline:
            with self.lock:
                if pred():
                    return
            time.sleep(0.02)
        raise AssertionError(f'never: {what}')


def invalid_goals(w, rep):
    cases = {
        'empty': dict(question='  '),
        'until': dict(question='Is the door open?', until='yes'),
        'camera': dict(question='Is the door open?', camera='none'),
        'schema': dict(question='Is the door open?', json_schema='{"type": '),
        'interval': dict(question='Is the door open?', min_interval_s=float('nan')),
    }
    for name, fields in cases.items():
        rep[f'invalid_{name}'] = w.result(w.send(f'invalid_{name}', **fields), name)


def scripted(p, a):
    p.wait_ask()
    rep = {}
    cam = Camera(p, '/cam')
    w = Watcher(p)
    try:
        invalid_goals(w, rep)
        W = w.send('W', question='Is there a cup?', min_interval_s=1.0)
        w.until('W evaluated', lambda: len(w.evaluations('W')) >= 1)
        time.sleep(10.0)
        rep['static_evaluations'] = len(w.evaluations('W'))
        rep['switches'] = []
        for key in 'bca':
            rep['switches'].append([cam.switch(key), key])
            time.sleep(4.0)
        # Y holds the second slot: X is one too many.
        Y = w.send('Y', question='Is the door open?')
        X = w.send('X', question='Is the door open?')
        rep['X'] = w.result(X, 'X')
        w.wait(Y.cancel_goal_async(), 'cancel response of Y')
        rep['Y'] = w.result(Y, 'Y')
        # The camera falls silent (max_camera_silence_s 1), then shows scene b.
        cam.scene = None
        w.until('W told of the silence', lambda: any(f['camera_silent'] for f in w.feedback['W']))
        rep['back'] = cam.switch('b')
        n = len(w.evaluations('W'))
        w.until('W evaluated after the silence', lambda: len(w.evaluations('W')) > n)
        U = w.send('U', question='Is there a cup?', json_schema='{"enum": ["yes"]}',
                   until=' "yes" ')
        rep['U'] = w.result(U, 'U')
        w.wait(W.cancel_goal_async(), 'cancel response of W')
        rep['W'] = w.result(W, 'W')
        time.sleep(0.5)
    finally:
        cam.stop.set()
        cam.thread.join()
    with w.lock:
        rep['feedback'] = w.feedback
        rep['events'] = w.events
    rep['sent'] = cam.sent
    rep['diag'] = p.last_diag()
    return rep


def yield_to_ask(p, a):
    """W watches on a slowed BPU; the scene switches; an ask comes while W evaluates it."""
    p.wait_ask()
    rep = {}
    cam = Camera(p, '/cam')
    w = Watcher(p)
    try:
        W = w.send('W', question='Is there a cup?', min_interval_s=0.0)
        w.until('W evaluated', lambda: len(w.evaluations('W')) >= 1)
        time.sleep(1.0)
        rep['d_before'] = p.last_diag()
        rep['switch'] = cam.switch('b')
        # W's evaluation of scene b starts once it held scene_settle_s (0.5 s) and runs
        # for well over a second on the slowed BPU: the ask comes in the middle of it.
        time.sleep(0.9)
        rep['ask'] = p.greedy('A', 'What do you see?')
        rep['ask_done'] = now(p)
        w.until('W evaluated scene b', lambda: any(
            f['at'] > rep['ask_done'] for f in w.evaluations('W')))
        rep['d_after'] = p.last_diag()
        w.wait(W.cancel_goal_async(), 'cancel response of W')
        rep['W'] = w.result(W, 'W')
    finally:
        cam.stop.set()
        cam.thread.join()
    with w.lock:
        rep['feedback'] = w.feedback
    rep['sent'] = cam.sent
    return rep


def sigterm(p, a):
    p.wait_ask()
    rep = {}
    cam = Camera(p, '/cam')
    w = Watcher(p)
    try:
        handles = {n: w.send(n, question='Is there a cup?') for n in ('S1', 'S2')}
        w.until('both evaluated',
                lambda: all(len(w.feedback[n]) >= 1 for n in handles))
        print('FIRST TOKEN', flush=True)
        for n, h in handles.items():
            rep[n] = w.result(h, n)
    finally:
        cam.stop.set()
        cam.thread.join()
    return rep


def main():
    ap = peer_arguments()
    ap.add_argument('mode', choices=['scripted', 'sigterm', 'yield'])
    ap.add_argument('--max-new-tokens', type=int, default=4)
    ap.add_argument('--timeout', type=float, default=200.0)
    a = ap.parse_args()
    import rclpy
    rclpy.init()
    p = Peer(a)
    modes = {'scripted': scripted, 'sigterm': sigterm, 'yield': yield_to_ask}
    report_and_exit(lambda: modes[a.mode](p, a))


if __name__ == '__main__':
    main()
