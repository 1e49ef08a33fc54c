"""rclpy peer for tests/node_failsafe.rs: NUL output, contained panics, runtime failures.

Run with .ros2/venv/bin/python. Prints one JSON line prefixed "REPORT " and then "PEER OK",
like node_peer.py (whose Peer it uses). Every diagnostics status of the node is recorded with
its level, message and hardware id (keys `_level`, `_message`, `_hardware_id`).

  nul           two greedy text asks (the model's output holds U+0000), then the diagnostics
                update that counts the second
  panic         an ask that panics in the node (a test hook), then one that must succeed
  reopen_fails  prints READY, waits until --gone no longer exists, asks (the panic forces a
                reopen, which fails), then waits for an ERROR status
  task_panic    one ask, then a /vlm/cancel call that panics the cancel task; waits for an
                ERROR status (the cancel is never answered)
  hang          a long ask that hangs in the BPU; a second ask queued behind it once the first
                streams; both answers, then an ERROR status
  soak          --count asks in a fixed mix: valid ones (half of them in five sessions),
                invalid (NaN temperature), oversized (a prompt over --max-prompt-bytes), with
                whatever the node's panic plan and model add; diagnostics before and settled
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rclpy  # noqa: E402

from bpu_vlm_msgs.srv import Cancel  # noqa: E402
from node_peer import Peer, peer_arguments, check, report_and_exit  # noqa: E402

ERROR = 2


def level(raw):
    return raw[0] if isinstance(raw, (bytes, bytearray)) else int(raw)


class FailsafePeer(Peer):
    def on_diag(self, d):
        with self.lock:
            for s in d.status:
                if 'vlm_node' in s.name:
                    v = {kv.key: kv.value for kv in s.values}
                    v.update(_level=level(s.level), _message=s.message,
                             _hardware_id=s.hardware_id)
                    self.diagnostics.append(v)

    def diag_after(self, served, failed):
        """The first status that counts at least `served` answers and `failed` failures."""
        while time.monotonic() < self.deadline:
            with self.lock:
                for d in self.diagnostics:
                    if (int(d.get('requests_served', '-1')) >= served
                            and int(d.get('requests_failed', '-1')) >= failed):
                        return dict(d)
            time.sleep(0.02)
        raise AssertionError(f'no diagnostics with {served} served and {failed} failed')

    def error_status(self):
        """The first ERROR status."""
        while time.monotonic() < self.deadline:
            with self.lock:
                for d in self.diagnostics:
                    if d['_level'] == ERROR:
                        return dict(d)
            time.sleep(0.02)
        raise AssertionError('no ERROR status on /diagnostics')

    def levels(self):
        with self.lock:
            return [d['_level'] for d in self.diagnostics]

    def text_ask(self, rid, prompt, **extra):
        return self.greedy(rid, prompt, camera='none', **extra)


def mode_nul(p, a):
    p.wait_ask()
    first = p.text_ask('nul-1', a.prompt)
    second = p.text_ask('nul-2', a.prompt2)
    for r in (first, second):
        check(r['response']['success'], f'ask failed: {r["response"]}')
    return {'first': first, 'second': second, 'diag': p.diag_after(2, 0)}


def mode_panic(p, a):
    p.wait_ask()
    failed = p.text_ask('panic-1', a.prompt)
    after = p.text_ask('panic-2', a.prompt)
    return {'failed': failed, 'after': after, 'diag': p.diag_after(1, 1), 'levels': p.levels()}


def mode_reopen_fails(p, a):
    p.wait_ask()
    print('READY', flush=True)
    while os.path.exists(a.gone) and time.monotonic() < p.deadline:
        time.sleep(0.05)
    check(not os.path.exists(a.gone), f'{a.gone} is still there')
    failed = p.text_ask('reopen-1', a.prompt)
    return {'failed': failed, 'error': p.error_status(), 'levels': p.levels()}


def mode_task_panic(p, a):
    p.wait_ask()
    ok = p.text_ask('task-1', a.prompt)
    before = p.diag_after(1, 0)
    p.cancel_client.call_async(Cancel.Request(request_id='nothing-to-cancel'))
    return {'ok': ok, 'before': before, 'error': p.error_status()}


def mode_hang(p, a):
    p.wait_ask()
    req_a, fut_a = p.ask_async(request_id='hang-1', prompt=a.prompt, camera='none',
                               temperature=0.0, max_new_tokens=a.max_new_tokens,
                               use_default_stop=False)
    # The second ask goes in once the first is running, so it waits in the queue.
    while time.monotonic() < p.deadline:
        with p.lock:
            if p.tokens.get('hang-1'):
                break
        time.sleep(0.01)
    req_b, fut_b = p.ask_async(request_id='hang-2', prompt=a.prompt, camera='none',
                               temperature=0.0, max_new_tokens=4)
    hung = p.finish(req_a, fut_a)
    queued = p.finish(req_b, fut_b)
    return {'hung': hung, 'queued': queued, 'error': p.error_status()}


def mode_soak(p, a):
    p.wait_ask()
    before = p.diag_after(0, 0)
    oversized = 'x' * (a.max_prompt_bytes + 1)
    results = []
    for i in range(a.count):
        rid = f'soak-{i}'
        if i % 10 == 3:
            kind, r = 'invalid', p.text_ask(rid, a.prompt, temperature=float('nan'))
        elif i % 10 == 7:
            kind, r = 'oversized', p.text_ask(rid, oversized)
        else:
            session = f'soak-s{i % 5}' if i % 2 == 0 else ''
            kind, r = 'ask', p.text_ask(rid, a.prompt if i % 4 else a.prompt2,
                                        session_id=session)
        results.append({'kind': kind, **r})
    # Sessions expire after session_idle_s; wait for the baseline (no sessions, empty queue).
    while time.monotonic() < p.deadline:
        with p.lock:
            d = dict(p.diagnostics[-1]) if p.diagnostics else {}
        if d.get('sessions') == '0' and d.get('queue_depth') == '0':
            break
        time.sleep(0.1)
    time.sleep(0.5)
    with p.lock:
        settled = dict(p.diagnostics[-1])
    return {'before': before, 'results': results, 'settled': settled, 'levels': p.levels()}


def main():
    ap = peer_arguments()
    ap.add_argument('mode', choices=['nul', 'panic', 'reopen_fails', 'task_panic', 'hang',
                                     'soak'])
    ap.add_argument('--prompt', default='What is in the picture?')
    ap.add_argument('--prompt2', default='And what colour is it?')
    ap.add_argument('--max-new-tokens', type=int, default=12)
    ap.add_argument('--gone', default='')
    ap.add_argument('--timeout', type=float, default=120.0)
    ap.add_argument('--count', type=int, default=200)
    ap.add_argument('--max-prompt-bytes', type=int, default=65536)
    a = ap.parse_args()
    rclpy.init()
    p = FailsafePeer(a)
    report_and_exit(lambda: {'nul': mode_nul, 'panic': mode_panic,
                             'reopen_fails': mode_reopen_fails, 'task_panic': mode_task_panic,
                             'hang': mode_hang, 'soak': mode_soak}[a.mode](p, a))


if __name__ == '__main__':
    main()
