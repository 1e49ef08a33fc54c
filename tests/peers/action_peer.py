"""rclpy peer for tests/node_action.rs: drives the node's Ask action (/vlm/ask) with rclpy's
ActionClient, beside the Ask service.

Run with .ros2/venv/bin/python. Prints one JSON line prefixed "REPORT " and then "PEER OK",
like node_peer.py (whose Peer it uses). A goal's report has the shape of an ask's in
node_peer.py — 'response' (the goal's result), 'tokens' (its feedback Tokens, in arrival
order), 'answer' (the Answer on /vlm/answers) — plus 'accepted', 'status' (the terminal
GoalStatus), 'topic_tokens' (the request's Tokens on /vlm/tokens), 'feedback_goal_ids_ok'
(every feedback message named the goal) and 'client_feedback' (how many the ActionClient's
feedback callback got).

The feedback Tokens are read from the feedback topic with a subscription of their own:
rclpy's ActionClient forgets a goal's feedback callback when the result arrives, and DDS does
not order the feedback topic with the result service, so the last Tokens of a goal may reach
the client after its result (feedback is best effort; the result is authoritative). The
subscription sees every Token the node sends as feedback.

  protocol  a greedy goal and the same question over the service; a goal cancelled
            mid-stream, one stopped by /vlm/cancel; goals while the queue is full (busy)
            and with an empty prompt (invalid); a goal and a service ask at once
  expiry    two rounds of short goals one after another at a short result timeout: the
            status arrays the node publishes, and the result of the first goal once it
            has expired
  sigterm   one long goal; prints "FIRST TOKEN" when its feedback starts (the test then
            stops the node), then waits for its result
  race      every request of the action client paused right after it is sent (`SlowSends`),
            so each response is back before the sending call returns: goal responses, the
            result of a goal that has already ended, a cancel response. rclpy's own
            ActionClient (`--rclpy-client`) loses each of them; the report counts those that
            came within `--response-s`
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rclpy  # noqa: E402
from action_msgs.msg import GoalStatus, GoalStatusArray  # noqa: E402
from action_msgs.srv import CancelGoal  # noqa: E402
from rclpy.action import ActionClient as RclpyActionClient  # noqa: E402
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402

from bpu_vlm_msgs.action import Ask as AskAction  # noqa: E402
from bpu_vlm_msgs.srv import Cancel  # noqa: E402

from node_peer import (Peer, check, load_rgb, peer_arguments, plain, report_and_exit,  # noqa: E402
                       rgb8, with_header)
from bpu_vlm_client.action_client import ActionClient  # noqa: E402  (node_peer's path)


class ActionPeer(Peer):
    def __init__(self, args):
        super().__init__(args)
        self.feedback = {}
        self.client_feedback = {}
        self.status_lengths = []
        kind = RclpyActionClient if getattr(args, 'rclpy_client', False) else ActionClient
        self.action = kind(self.node, AskAction, args.action)
        self.cancel_all_client = self.node.create_client(
            CancelGoal, args.action + '/_action/cancel_goal')
        # As rcl_action's status QoS: a late subscriber gets the latest array.
        qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.node.create_subscription(GoalStatusArray, args.action + '/_action/status',
                                      self.on_status, qos)
        deep = QoSProfile(depth=4096, reliability=ReliabilityPolicy.RELIABLE)
        self.node.create_subscription(AskAction.Impl.FeedbackMessage,
                                      args.action + '/_action/feedback', self.on_feedback, deep)

    def on_feedback(self, msg):
        t = msg.feedback.token
        with self.lock:
            self.feedback.setdefault(t.request_id, []).append((bytes(msg.goal_id.uuid), t))

    def on_status(self, msg):
        with self.lock:
            self.status_lengths.append(len(msg.status_list))

    def wait_action(self):
        check(self.action.wait_for_server(timeout_sec=self.left()), 'no action server')
        # Feedback is a topic: wait until the node's feedback publisher is matched too.
        topic = self.args.action + '/_action/feedback'
        while self.node.count_publishers(topic) == 0 and time.monotonic() < self.deadline:
            time.sleep(0.05)
        check(self.node.count_publishers(topic) > 0, 'no feedback publisher')
        time.sleep(0.5)

    def wait(self, future, what):
        while not future.done() and time.monotonic() < self.deadline:
            time.sleep(0.01)
        check(future.done(), f'no {what}')
        return future.result()

    def send(self, **fields):
        """Sends a goal; returns (goal handle, request id)."""
        goal = AskAction.Goal()
        for k, v in fields.items():
            setattr(goal, k, v)
        rid = goal.request_id

        def on_feedback(msg):
            with self.lock:
                self.client_feedback[rid] = self.client_feedback.get(rid, 0) + 1

        handle = self.wait(self.action.send_goal_async(goal, feedback_callback=on_feedback),
                           f'goal response for {rid}')
        return handle, rid

    def result(self, handle, rid):
        """Waits for the goal's result and, when generation ran, its last Token on the
        topic and in the feedback, and its Answer."""
        r = self.wait(handle.get_result_async(), f'result of {rid}')
        if r.result.finish_reason:
            while time.monotonic() < self.deadline:
                with self.lock:
                    done = (any(t.last for t in self.tokens.get(rid, []))
                            and any(t.last for _, t in self.feedback.get(rid, []))
                            and rid in self.answers)
                if done:
                    break
                time.sleep(0.01)
        with self.lock:
            feedback = list(self.feedback.get(rid, []))
            client_feedback = self.client_feedback.get(rid, 0)
            topic = sorted(self.tokens.get(rid, []), key=lambda t: t.index)
            answer = self.answers.get(rid)
        return {
            'accepted': handle.accepted,
            'status': r.status,
            'response': plain(r.result),
            'tokens': [plain(t) for _, t in feedback],
            'feedback_goal_ids_ok': all(g == bytes(handle.goal_id.uuid) for g, _ in feedback),
            'client_feedback': client_feedback,
            'topic_tokens': [plain(t) for t in topic],
            'answer': plain(answer) if answer is not None else None,
        }

    def first_feedback(self, rid):
        while time.monotonic() < self.deadline:
            with self.lock:
                if self.feedback.get(rid):
                    return
            time.sleep(0.01)
        check(False, f'no feedback for {rid}')


def greedy(a, rid, **extra):
    fields = dict(request_id=rid, prompt=a.prompt, camera='none', temperature=0.0, top_p=1.0,
                  top_k=0, presence_penalty=0.0, max_new_tokens=a.max_new_tokens)
    fields.update(extra)
    return fields


def long_goal(a, rid):
    return greedy(a, rid, max_new_tokens=400, use_default_stop=False)


def mode_protocol(p, a):
    p.wait_ask()
    p.wait_action()
    rep = {}
    h, rid = p.send(**greedy(a, 'g-1'))
    rep['greedy'] = p.result(h, rid)
    rep['service_greedy'] = p.ask(**greedy(a, 's-1'))

    # Interface 1.0: a camera frame's header (frame_id cam_link) in the result and the
    # Answer, and a session reported only as its tag.
    rep['camera_sent'] = p.publish_frames('/image_raw',
                                          with_header(rgb8(load_rgb('scene_a.png')), 'cam_link',
                                                      0, 0))
    h, rid = p.send(**greedy(a, 'cam-1', camera='', session_id='tag-session'))
    rep['camera_goal'] = p.result(h, rid)

    # Cancel mid-stream through the action (in a session: a failure after admission still
    # tags its Answer).
    h, rid = p.send(**greedy(a, 'c-1', max_new_tokens=400, use_default_stop=False,
                             session_id='tag-session-2'))
    p.first_feedback(rid)
    rep['cancel_response'] = plain(p.wait(h.cancel_goal_async(), 'cancel response'))
    rep['cancelled'] = p.result(h, rid)

    # /vlm/cancel with the goal's request id stops it too, outside the action's cancel.
    h, rid = p.send(**long_goal(a, 'vc-1'))
    p.first_feedback(rid)
    rep['vlm_cancel_response'] = plain(p.wait(
        p.cancel_client.call_async(Cancel.Request(request_id=rid)), '/vlm/cancel response'))
    rep['vlm_cancelled'] = p.result(h, rid)

    # A full queue: depth goals that run long, then one more (busy), then an empty prompt.
    running = [p.send(**long_goal(a, f'q-{i}')) for i in range(a.queue_depth)]
    p.first_feedback(running[0][1])
    full = str(a.queue_depth)
    while p.last_diag().get('queue_depth') != full and time.monotonic() < p.deadline:
        time.sleep(0.02)
    check(p.last_diag().get('queue_depth') == full, 'the queue never filled')
    h, rid = p.send(**greedy(a, 'busy-1'))
    rep['busy'] = p.result(h, rid)
    h, rid = p.send(**greedy(a, 'empty-1', prompt=''))
    rep['invalid'] = p.result(h, rid)
    # Cancel every goal at once (zero goal id, zero stamp).
    rep['cancel_all_response'] = plain(
        p.wait(p.cancel_all_client.call_async(CancelGoal.Request()), 'cancel-all response'))
    rep['queued'] = [p.result(h, rid) for h, rid in running]

    # A goal and a service ask at the same time.
    h, rid = p.send(**greedy(a, 'g-2'))
    rep['service_alongside'] = p.ask(**greedy(a, 's-2'))
    rep['goal_alongside'] = p.result(h, rid)
    return rep


def mode_expiry(p, a):
    """Two rounds of `count` goals, each followed by the wait for an empty status array: the
    second round's arrays never hold a goal of the first (they expired), whatever the speed."""
    p.wait_ask()
    p.wait_action()
    rep = {'count': a.count, 'statuses': {}, 'rounds': []}
    first = None
    for round_ in range(2):
        with p.lock:
            p.status_lengths.clear()
        for i in range(a.count):
            h, rid = p.send(**greedy(a, f'e{round_}-{i}', max_new_tokens=2))
            r = p.wait(h.get_result_async(), f'result of {rid}')
            rep['statuses'][str(r.status)] = rep['statuses'].get(str(r.status), 0) + 1
            if first is None:
                first = h
        # Every goal of the round has ended: the array empties once the last one expires.
        while time.monotonic() < p.deadline:
            with p.lock:
                if p.status_lengths and p.status_lengths[-1] == 0:
                    break
            time.sleep(0.05)
        with p.lock:
            rep['rounds'].append({'max_status_length': max(p.status_lengths, default=-1),
                                  'status_messages': len(p.status_lengths),
                                  'final_status_length': p.status_lengths[-1]
                                  if p.status_lengths else -1})
    r = p.wait(first.get_result_async(), 'result of the expired goal')
    rep['expired_status'] = r.status
    rep['expired_success'] = r.result.success
    return rep


def mode_sigterm(p, a):
    p.wait_ask()
    p.wait_action()
    h, rid = p.send(**long_goal(a, 'term-1'))
    p.first_feedback(rid)
    print('FIRST TOKEN', flush=True)
    return p.result(h, rid)


class SlowSends:
    """An action client's rcl handle whose requests of the `kinds` named (goal, result,
    cancel) each pause `pause` s once sent, before the client records them: the response is
    back first, as when a loaded machine preempts the caller right after the send (what the
    node soak once met)."""

    def __init__(self, handle, pause, kinds):
        self._handle, self._pause, self._kinds = handle, pause, kinds

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self._handle.__enter__()

    def __exit__(self, *exc):
        return self._handle.__exit__(*exc)

    def _sent(self, kind, seq):
        if kind in self._kinds:
            time.sleep(self._pause)
        return seq

    def send_goal_request(self, request):
        return self._sent('goal', self._handle.send_goal_request(request))

    def send_result_request(self, request):
        return self._sent('result', self._handle.send_result_request(request))

    def send_cancel_request(self, request):
        return self._sent('cancel', self._handle.send_cancel_request(request))


def mode_race(p, a):
    """`count` short goals, each result asked once the goal has ended (so it is answered at
    once), then a long goal cancelled: every response comes back while its request is still
    being sent."""
    p.wait_ask()
    p.wait_action()
    p.action._client_handle = SlowSends(p.action._client_handle, a.pause,
                                        set(a.slow_sends.split(',')))

    def within(future):
        end = time.monotonic() + a.response_s
        while not future.done() and time.monotonic() < end:
            time.sleep(0.01)
        return future.result() if future.done() else None

    rep = {'goals': 0, 'goal_responses': 0, 'results': [], 'cancel': None}
    for i in range(a.count):
        rid = f'race-{i}'
        rep['goals'] += 1
        handle = within(p.action.send_goal_async(AskAction.Goal(**greedy(a, rid,
                                                                         max_new_tokens=2))))
        if handle is None:
            continue
        rep['goal_responses'] += 1
        while rid not in p.answers and time.monotonic() < p.deadline:
            time.sleep(0.01)
        r = within(handle.get_result_async())
        rep['results'].append(None if r is None else r.status)
    rep['goals'] += 1
    handle = within(p.action.send_goal_async(AskAction.Goal(**long_goal(a, 'race-cancel'))))
    if handle is not None:
        rep['goal_responses'] += 1
        p.first_feedback('race-cancel')
        c = within(handle.cancel_goal_async())
        rep['cancel'] = None if c is None else len(c.goals_canceling)
        r = within(handle.get_result_async())
        rep['results'].append(None if r is None else r.status)
    return rep


def main():
    ap = peer_arguments()
    ap.add_argument('mode', choices=['protocol', 'expiry', 'sigterm', 'race'])
    ap.add_argument('--action', default='/vlm/ask')
    ap.add_argument('--prompt', default='What do you see?')
    ap.add_argument('--max-new-tokens', type=int, default=12)
    ap.add_argument('--queue-depth', type=int, default=2)
    ap.add_argument('--count', type=int, default=150)
    ap.add_argument('--timeout', type=float, default=240.0)
    ap.add_argument('--pause', type=float, default=0.2, help='race: pause after each send')
    ap.add_argument('--response-s', type=float, default=10.0, help='race: wait per response')
    ap.add_argument('--slow-sends', default='goal,result,cancel', help='race: which pause')
    ap.add_argument('--rclpy-client', action='store_true', help="race: rclpy's ActionClient")
    a = ap.parse_args()
    rclpy.init()
    p = ActionPeer(a)
    modes = {'protocol': mode_protocol, 'expiry': mode_expiry, 'sigterm': mode_sigterm,
             'race': mode_race}
    report_and_exit(lambda: modes[a.mode](p, a))


if __name__ == '__main__':
    main()
