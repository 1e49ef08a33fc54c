"""rclpy peer for tests/node_shutdown.rs: state snapshots per ask and request ids reused at once.

Run with .ros2/venv/bin/python. Prints one JSON line prefixed "REPORT " and then "PEER OK",
like node_peer.py (whose Peer it uses).

  snapshots   text asks with and without a session_id; after each, the diagnostics update that
              counts it (requests_served) gives state_snapshots from the same update
  reuse       a chain of asks with one request id, each sent from the previous one's response
              callback, i.e. the moment the client has its answer
  all         snapshots, then reuse, against one node
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rclpy  # noqa: E402

from node_peer import Peer, peer_arguments, check, plain, report_and_exit  # noqa: E402


def served(d):
    return int(d.get('requests_served', '-1'))


def diag_with_served(p, n):
    """The newest diagnostics values once requests_served reaches n (one worker update sets
    the served count and the snapshot count together)."""
    while time.monotonic() < p.deadline:
        d = p.last_diag()
        if served(d) >= n:
            check(served(d) == n, f'requests_served jumped past {n}: {d}')
            return d
        time.sleep(0.02)
    raise AssertionError(f'diagnostics never showed requests_served {n}')


def text_ask(p, rid, **extra):
    fields = dict(request_id=rid, prompt=p.args.prompt, camera='none', temperature=0.0,
                  top_k=0, top_p=1.0, presence_penalty=0.0, max_new_tokens=3)
    fields.update(extra)
    return p.ask(**fields)


def mode_snapshots(p, a):
    p.wait_ask()
    base = diag_with_served(p, 0)
    rep = {'base': base, 'asks': []}
    steps = [('plain-1', ''), ('sess-1', 's1'), ('sess-2', 's1'), ('plain-2', ''),
             ('sess-3', 's2'), ('plain-3', '')]
    for i, (rid, sid) in enumerate(steps):
        r = text_ask(p, rid, session_id=sid)
        d = diag_with_served(p, i + 1)
        rep['asks'].append({'id': rid, 'session_id': sid, 'response': r['response'],
                            'state_snapshots': d.get('state_snapshots'),
                            'sessions': d.get('sessions')})
    return rep


def mode_reuse(p, a):
    p.wait_ask()
    sent = []
    done = threading.Event()
    lock = threading.Lock()

    def send():
        req, fut = p.ask_async(request_id='same-id', prompt=a.prompt, camera='none',
                               temperature=0.0, max_new_tokens=2)
        with lock:
            sent.append((req, fut))
        fut.add_done_callback(on_done)

    def on_done(_fut):
        with lock:
            more = len(sent) < a.count
        if more:
            send()
        else:
            done.set()

    send()
    check(done.wait(timeout=p.left()), 'the chain of asks did not finish')
    responses = []
    for req, fut in sent:
        check(fut.done(), 'a response is missing')
        responses.append(plain(fut.result()))
    # Every admitted ask streams one last Token; all of them share the id.
    while time.monotonic() < p.deadline:
        with p.lock:
            lasts = sum(1 for t in p.tokens.get('same-id', []) if t.last)
        if lasts >= sum(1 for r in responses if r['success']):
            break
        time.sleep(0.02)
    return {'responses': responses, 'lasts': lasts}


def main():
    ap = peer_arguments()
    ap.add_argument('mode', choices=['snapshots', 'reuse', 'all'])
    # node_peer.Peer reads the diagnostics status of this name (the node's full name).
    ap.add_argument('--prompt', default='What is in the picture?')
    ap.add_argument('--count', type=int, default=30)
    ap.add_argument('--timeout', type=float, default=180.0)
    a = ap.parse_args()
    rclpy.init()
    p = Peer(a)

    def run():
        if a.mode == 'all':
            return {'snapshots': mode_snapshots(p, a), 'reuse': mode_reuse(p, a)}
        return {'snapshots': mode_snapshots, 'reuse': mode_reuse}[a.mode](p, a)
    report_and_exit(run)


if __name__ == '__main__':
    main()
