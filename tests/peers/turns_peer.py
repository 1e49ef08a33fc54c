"""rclpy peer for tests/node_followups.rs: the session_turn an answer reports, over the Ask
service and the Ask action, and after the node dropped a session.

Run with .ros2/venv/bin/python. Prints one JSON line prefixed "REPORT " and then "PEER OK",
like node_peer.py (whose Peer it uses, through action_peer.ActionPeer). Session ids are
random (uuid4), as docs/interfaces.md tells clients to choose them. Every ask is a greedy
text ask; after each one the diagnostics update that counts it (requests_served) is kept
with it ('diag').

  turns   session s over the service (s-1..s-3, s-late timed out, s-4), session g as action goals (g-1..g-3), then
          g continued over the service (g-4); an ask and a goal without a session (none-svc,
          none-act); then 50 goals with an all-zero (malformed) goal id sent straight to the
          action's send_goal service ('malformed': how many were accepted)
  evict   (node with a small session_memory_mb) session v (v-1, v-2), then one new session
          per ask (f-0, f-1, ...) until diagnostics count an eviction ('fillers'), then v
          again (v-3)
  expire  (node with a short session_idle_s) session e (e-1, e-2), then diagnostics until
          they count an expired session ('expired_diag'), then e again (e-3)
"""

import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rclpy  # noqa: E402

from bpu_vlm_msgs.action import Ask as AskAction  # noqa: E402

from action_peer import ActionPeer, greedy  # noqa: E402
from node_peer import check, peer_arguments, report_and_exit  # noqa: E402
from session_peer import diag_with_served  # noqa: E402


class Turns:
    def __init__(self, p, a):
        self.p, self.a = p, a
        self.served = 0
        self.asks = {}

    def _counted(self, rid, r):
        self.served += 1
        r['diag'] = diag_with_served(self.p, self.served)
        self.asks[rid] = r
        return r

    def ask(self, rid, sid):
        return self._counted(rid, self.p.ask(**greedy(self.a, rid, session_id=sid)))

    def failing(self, rid, sid, **extra):
        """An ask that fails after admission (not counted in requests_served)."""
        self.asks[rid] = self.p.ask(**greedy(self.a, rid, session_id=sid, **extra))

    def goal(self, rid, sid):
        handle, rid = self.p.send(**greedy(self.a, rid, session_id=sid))
        return self._counted(rid, self.p.result(handle, rid))


def malformed_goals(p, n):
    """Sends n goals whose goal id is all zeros (the node rejects them); how many were
    accepted."""
    Service = AskAction.Impl.SendGoalService
    client = p.node.create_client(Service, p.args.action + '/_action/send_goal')
    check(client.wait_for_service(timeout_sec=p.left()), 'no send_goal service')
    accepted = 0
    for _ in range(n):
        req = Service.Request()
        req.goal_id.uuid = [0] * 16
        req.goal.prompt = 'hi'
        accepted += int(p.wait(client.call_async(req), 'send_goal response').accepted)
    return accepted


def mode_turns(p, a):
    t = Turns(p, a)
    s, g = uuid.uuid4().hex, uuid.uuid4().hex
    for i in (1, 2, 3):
        t.ask(f's-{i}', s)
    # Times out (in the queue or at its first token): not kept, so s-4 is turn 4 again.
    t.failing('s-late', s, timeout_s=0.001)
    t.ask('s-4', s)
    for i in (1, 2, 3):
        t.goal(f'g-{i}', g)
    t.ask('g-4', g)
    t.ask('none-svc', '')
    t.goal('none-act', '')
    return {'asks': t.asks, 'malformed': malformed_goals(p, 50)}


def mode_evict(p, a):
    t = Turns(p, a)
    v = uuid.uuid4().hex
    t.ask('v-1', v)
    t.ask('v-2', v)
    fillers = 0
    while fillers < a.max_fillers:
        r = t.ask(f'f-{fillers}', uuid.uuid4().hex)
        fillers += 1
        if int(r['diag'].get('sessions_evicted', '0')) > 0:
            break
    t.ask('v-3', v)
    return {'asks': t.asks, 'fillers': fillers}


def mode_expire(p, a):
    t = Turns(p, a)
    e = uuid.uuid4().hex
    t.ask('e-1', e)
    t.ask('e-2', e)
    expired = {}
    while time.monotonic() < p.deadline:
        expired = p.last_diag()
        if int(expired.get('sessions_expired', '0')) > 0:
            break
        time.sleep(0.05)
    t.ask('e-3', e)
    return {'asks': t.asks, 'expired_diag': expired}


def main():
    ap = peer_arguments()
    ap.add_argument('mode', choices=['turns', 'evict', 'expire'])
    ap.add_argument('--action', default='/vlm/ask')
    ap.add_argument('--prompt', default='What do you see?')
    ap.add_argument('--max-new-tokens', type=int, default=4)
    ap.add_argument('--max-fillers', type=int, default=64)
    ap.add_argument('--timeout', type=float, default=240.0)
    a = ap.parse_args()
    rclpy.init()
    p = ActionPeer(a)

    def run():
        p.wait_ask()
        p.wait_action()
        return {'turns': mode_turns, 'evict': mode_evict, 'expire': mode_expire}[a.mode](p, a)
    report_and_exit(run)


if __name__ == '__main__':
    main()
