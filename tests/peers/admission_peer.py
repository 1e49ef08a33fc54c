"""rclpy peer for tests/node_admission.rs: hostile peers against a real vlm_node's admission.

Run with .ros2/venv/bin/python. Prints one JSON line prefixed "REPORT " and then "PEER OK",
like node_peer.py (whose Peer it uses).

  ids       id-less asks (the ids the node assigns), a client id in the node's `req-` form
  schemas   `count` asks at once, each with its own large JSON schema: the node compiles only
            the ones it admits (the Rust side counts the compiles in the node's log)
  burst     `burst` asks sent at once: how many got a response, and which
  all       ids, schemas, burst against one node
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rclpy  # noqa: E402
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from bpu_vlm_msgs.srv import Ask  # noqa: E402

from node_peer import Peer, peer_arguments, report_and_exit  # noqa: E402


def settle(p):
    """Waits until diagnostics show no live request (the previous phase is over)."""
    while time.monotonic() < p.deadline:
        if p.last_diag().get('queue_depth') == '0':
            return
        time.sleep(0.05)


def request(**fields):
    req = Ask.Request()
    for k, v in fields.items():
        setattr(req, k, v)
    return req


def send_all(p, fields_list, client=None):
    """Sends every request at once; waits (bounded by `--wait`) for the responses. Returns,
    per request, the response (or None) and the seconds it took."""
    client = client or p.ask_client
    t0 = time.monotonic()
    sent = [client.call_async(request(**f)) for f in fields_list]
    end = min(p.deadline, time.monotonic() + p.args.wait)
    took = [None] * len(sent)
    while time.monotonic() < end and not all(f.done() for f in sent):
        for i, f in enumerate(sent):
            if took[i] is None and f.done():
                took[i] = time.monotonic() - t0
        time.sleep(0.005)
    out = []
    for i, f in enumerate(sent):
        if f.done() and took[i] is None:
            took[i] = time.monotonic() - t0
        r = f.result() if f.done() else None
        out.append({
            'request_id': fields_list[i].get('request_id', ''),
            'responded': r is not None,
            'seconds': took[i],
            'success': r.success if r else None,
            'error_code': r.error_code if r else None,
            'error_message': r.error_message if r else None,
        })
    return out


def schema(i):
    """A schema of its own (no compile is a cache hit): an object of 40 properties."""
    props = {f'field_{i}_{k}': {'type': 'integer', 'minimum': k, 'maximum': 1000 + i}
             for k in range(40)}
    return json.dumps({'type': 'object', 'properties': props,
                       'required': [f'field_{i}_0']})


def mode_ids(p, a):
    p.wait_ask()
    rep = {'node_assigned': [p.ask(prompt=a.prompt, camera='none', temperature=0.0,
                                   max_new_tokens=2) for _ in range(3)]}
    rep['client_req_form'] = p.ask(request_id='req-7', prompt=a.prompt, camera='none',
                                   temperature=0.0, max_new_tokens=2)
    rep['client_other'] = p.ask(request_id='kitchen-req-7', prompt=a.prompt, camera='none',
                                temperature=0.0, max_new_tokens=2)
    settle(p)
    return rep


def mode_schemas(p, a):
    p.wait_ask()
    settle(p)
    asks = [dict(request_id=f'schema-{i}', prompt=a.prompt, camera='none', temperature=0.0,
                 max_new_tokens=a.max_new_tokens, json_schema=schema(i))
            for i in range(a.count)]
    rep = {'results': send_all(p, asks)}
    settle(p)
    return rep


def mode_burst(p, a):
    p.wait_ask()
    settle(p)
    # A client that keeps every response of its burst: with the ROS default (10) the
    # client's own reader would replace responses the node did send, before rclpy takes them.
    deep = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=4 * a.burst,
                      reliability=ReliabilityPolicy.RELIABLE)
    client = p.node.create_client(Ask, a.ask, qos_profile=deep)
    if not client.wait_for_service(timeout_sec=p.left()):
        raise AssertionError('no /ask service for the burst client')
    asks = [dict(request_id=f'burst-{i}', prompt=a.prompt, camera='none', temperature=0.0,
                 max_new_tokens=a.max_new_tokens) for i in range(a.burst)]
    rep = {'results': send_all(p, asks, client)}
    settle(p)
    return rep


def main():
    ap = peer_arguments()
    ap.add_argument('mode', choices=['ids', 'schemas', 'burst', 'all'])
    ap.add_argument('--prompt', default='What is in the picture?')
    ap.add_argument('--max-new-tokens', type=int, default=8)
    ap.add_argument('--count', type=int, default=10)
    ap.add_argument('--burst', type=int, default=40)
    ap.add_argument('--wait', type=float, default=30.0)
    ap.add_argument('--timeout', type=float, default=240.0)
    a = ap.parse_args()
    rclpy.init()
    p = Peer(a)
    modes = {'ids': mode_ids, 'schemas': mode_schemas, 'burst': mode_burst}
    chosen = list(modes) if a.mode == 'all' else [a.mode]
    report_and_exit(lambda: {m: modes[m](p, a) for m in chosen})


if __name__ == '__main__':
    main()
