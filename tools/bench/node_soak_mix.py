"""Hostile soak (not a test): ASKS requests from CLIENTS concurrent clients against a running
vlm_node, mixing valid asks with every failure kind the node must survive, then checks the
node's promises and prints one JSON object (BENCHMARKS.md, "Node soak, mixed").

    bash tools/bench/node-soak.sh 1000 mix     # builds vlm_node (release), runs this, stops it

Promises checked:
- every request (service call or action goal) gets exactly one response or result (a
  missing one is reported with the response waited for: goal response, result, service
  response);
- an admitted request (it reached generation: success, or cancelled / timeout /
  backend_error / context_overflow, or a finish reason) gets exactly one `last` Token and
  one Answer; a refused one gets none;
- the node's RSS after all asks is within 5 % of its RSS after the first 100, each taken as
  the minimum of RSS sampled every 20 ms over a window of asks (asks 100 to 100 + WINDOW, and
  the last WINDOW asks; `--rss-window`, default 50): a single sample lands anywhere in the
  few MiB that in-flight requests (frames, decoded images, payloads) take and give back, so
  it measures the moment, not what the node keeps. Single samples are printed too;
- no diagnostics status of the node is ever ERROR.
Busy refusals come by themselves: CLIENTS clients share a queue of `queue_depth` places.
SOAK_SKIP=kind,kind,... leaves kinds out of the mix (to find what a figure depends on).
"""

import argparse
import json
import os
import sys
import threading
import time
import zlib
import struct

import rclpy

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..', 'tests', 'peers'))
from node_peer import Peer, image, load_rgb, peer_arguments, rgb8  # noqa: E402
# rclpy's own ActionClient can lose a response that comes back before it has recorded the
# request (client/bpu_vlm_client/action_client.py): the node would be blamed for it.
from bpu_vlm_client.action_client import ActionClient  # noqa: E402  (the checkout's, node_peer)
from node_soak import rss_kib  # noqa: E402  (tools/bench, this script's folder)

from bpu_vlm_msgs.action import Ask as AskAction  # noqa: E402
from bpu_vlm_msgs.srv import Ask, Cancel  # noqa: E402
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from sensor_msgs.msg import CompressedImage  # noqa: E402

ERROR = 2
ADMITTED_CODES = ('cancelled', 'timeout', 'backend_error', 'context_overflow')
# How long a client waits for each response before it reports the request unanswered.
GOAL_RESPONSE_S, RESULT_S = 60, 120


class NoResponse(Exception):
    """A request's response did not come within its wait; says which response."""


def png(width, height):
    """A grey-zero 8-bit RGB PNG of any size, written by hand (a few KiB even at 8192²)."""
    row = b'\x00' + bytes(width * 3)
    comp = zlib.compressobj(9)
    data = b''.join(comp.compress(row) for _ in range(height)) + comp.flush()

    def chunk(kind, body):
        return (struct.pack('>I', len(body)) + kind + body
                + struct.pack('>I', zlib.crc32(kind + body) & 0xffffffff))
    head = struct.pack('>IIBBBBB', width, height, 8, 2, 0, 0, 0)
    return b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', head) + chunk(b'IDAT', data) + chunk(b'IEND', b'')


def compressed(fmt, data):
    c = CompressedImage()
    c.format = fmt
    c.data = data
    return c


class MixPeer(Peer):
    def __init__(self, args):
        super().__init__(args)
        self.levels = []
        self.node.create_subscription(DiagnosticArray, '/diagnostics', self.on_levels, 50)
        self.action = ActionClient(self.node, AskAction, args.action)
        self.cancel_client = self.node.create_client(Cancel, args.cancel)

    def on_levels(self, d):
        with self.lock:
            for s in d.status:
                if self.args.node_name in s.name:
                    raw = s.level
                    lvl = raw[0] if isinstance(raw, (bytes, bytearray)) else int(raw)
                    self.levels.append((lvl, s.name, s.message))

    def wait_done(self, fut, limit):
        end = time.monotonic() + limit
        while not fut.done() and time.monotonic() < end:
            time.sleep(0.002)
        return fut.done()


class RssSampler:
    """Samples the node's RSS every `period` s with the number of asks done at that moment,
    so the check can take the minimum over a window of asks (the module's docstring)."""

    def __init__(self, pid, done, lock, period=0.02):
        self.pid, self.done, self.lock, self.period = pid, done, lock, period
        self.samples = []
        self.running = threading.Event()
        self.running.set()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while self.running.is_set():
            with self.lock:
                n = self.done[0]
            self.samples.append((n, rss_kib(self.pid)))
            time.sleep(self.period)

    def stop(self):
        self.running.clear()
        self.thread.join()

    def window_min(self, first, last):
        """Minimum RSS over the samples taken while asks first..last-1 were done."""
        vals = [r for n, r in self.samples if first <= n < last and r > 0]
        return min(vals) if vals else None


def kinds(a):
    """(name, fields) of each kind in the mix; fields are Ask request fields."""
    long_prompt = ' '.join(['tell me about the robot'] * 600)  # past the tiny model's window
    bomb = compressed('png', png(8192, 8192))
    small = compressed('png', png(64, 48))
    w, h = 64, 48
    return [
        ('ok_text', dict(camera='none')),
        ('ok_camera', dict()),
        ('session', dict(camera='none')),  # session_id added per request
        ('invalid_nan', dict(camera='none', temperature=float('nan'))),
        ('oversized', dict(camera='none', prompt='x' * (a.max_prompt_bytes + 1))),
        ('reserved_id', dict(camera='none')),  # request_id 'req-...' set per request
        ('over_cap_tokens', dict(camera='none', max_new_tokens=1 << 30)),
        ('timeout', dict(camera='none', max_new_tokens=400, timeout_s=0.05)),
        ('cancel', dict(camera='none', max_new_tokens=400)),
        ('bad_schema', dict(camera='none', json_schema='{')),
        ('schema', dict(camera='none', json_schema='{"type": "integer"}', max_new_tokens=8)),
        ('unknown_camera', dict(camera='/no_such_camera')),
        ('request_png', dict(compressed_images=[small])),
        ('undecodable', dict(compressed_images=[compressed('jpeg', b'\xff\xd8\xff\xe0junk')])),
        ('bad_raw', dict(images=[image('rgb8', w, h, w * 3 - 1, bytes(w * 3 * h))])),
        ('decode_bomb', dict(compressed_images=[bomb] * 4)),
        ('context_overflow', dict(camera='none', prompt=long_prompt)),
        ('action', dict(camera='none')),
        ('action_cancel', dict(camera='none', max_new_tokens=400)),
    ]


def ask_fields(a, client, i, name, extra):
    fields = dict(request_id=f'c{client}-{i}', prompt='What is in front of the robot?',
                  temperature=0.0, max_new_tokens=a.max_new_tokens)
    fields.update(extra)
    if name == 'session':
        # A conversation of a few turns, then a new one: old ones are evicted or expire.
        fields['session_id'] = f'soak-{client}-{i // (5 * 19 * a.clients)}'
    if name == 'reserved_id':
        fields['request_id'] = f'req-{client}-{i}'
    return fields


def run_service(p, fields, name):
    req = Ask.Request()
    for k, v in fields.items():
        setattr(req, k, v)
    fut = p.ask_client.call_async(req)
    if name == 'cancel':
        end = time.monotonic() + 10
        while time.monotonic() < end and not fut.done():
            with p.lock:
                if p.tokens.get(req.request_id):
                    break
            time.sleep(0.002)
        c = Cancel.Request()
        c.request_id = req.request_id
        p.wait_done(p.cancel_client.call_async(c), 30)
    if not p.wait_done(fut, RESULT_S):
        raise NoResponse(f'no service response in {RESULT_S} s')
    r = fut.result()
    admitted = r.success or r.error_code in ADMITTED_CODES or bool(r.finish_reason)
    return {'code': 'ok' if r.success else r.error_code, 'admitted': admitted}


def run_action(p, fields, name):
    goal = AskAction.Goal()
    for k, v in fields.items():
        if hasattr(goal, k):
            setattr(goal, k, v)
    sent = p.action.send_goal_async(goal)
    if not p.wait_done(sent, GOAL_RESPONSE_S):
        raise NoResponse(f'no goal response in {GOAL_RESPONSE_S} s')
    handle = sent.result()
    if not handle.accepted:
        return {'code': 'rejected', 'admitted': False}
    if name == 'action_cancel':
        end = time.monotonic() + 10
        while time.monotonic() < end:
            with p.lock:
                if p.tokens.get(goal.request_id):
                    break
            time.sleep(0.002)
        p.wait_done(handle.cancel_goal_async(), 30)
    res = handle.get_result_async()
    if not p.wait_done(res, RESULT_S):
        raise NoResponse(f'no result in {RESULT_S} s')
    r = res.result().result
    admitted = r.success or r.error_code in ADMITTED_CODES or bool(r.finish_reason)
    return {'code': 'ok' if r.success else r.error_code, 'admitted': admitted}


def client_loop(p, a, client, table, results, progress):
    for i in range(client, a.asks, a.clients):
        name, extra = table[(i // a.clients + client) % len(table)]
        fields = ask_fields(a, client, i, name, extra)
        run = run_action if name.startswith('action') else run_service
        missing = None
        try:
            r = run(p, fields, name)
        except NoResponse as e:
            r, missing = None, str(e)
        except Exception as e:  # noqa: BLE001  (a client-side failure is a finding, not a crash)
            r = {'code': f'client error: {e}', 'admitted': False}
        with p.lock:
            results.append({'i': i, 'kind': name, 'id': fields['request_id'],
                            'response': r, 'missing': missing})
        progress()


def settle_tokens(p, results, limit=30.0):
    """Waits until every admitted request has its last Token and Answer (or `limit`)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        with p.lock:
            missing = [r['id'] for r in results if r['response'] and r['response']['admitted']
                       and not (any(t.last for t in p.tokens.get(r['id'], []))
                                and r['id'] in p.answers)]
        if not missing:
            return
        time.sleep(0.1)


def verdict(p, results):
    problems = []
    for r in results:
        rid, resp = r['id'], r['response']
        with p.lock:
            lasts = sum(1 for t in p.tokens.get(rid, []) if t.last)
            answered = rid in p.answers
        if resp is None:
            problems.append(f'{rid} ({r["kind"]}): no response ({r["missing"]})')
        elif resp['admitted'] and (lasts != 1 or not answered):
            problems.append(f'{rid} ({r["kind"]}): admitted, {lasts} last Tokens, '
                            f'Answer {answered}')
        elif not resp['admitted'] and (lasts or answered):
            problems.append(f'{rid} ({r["kind"]}): refused {resp["code"]} but {lasts} last '
                            f'Tokens, Answer {answered}')
    return problems


def main():
    ap = peer_arguments()
    ap.add_argument('--pid', type=int, required=True)
    ap.add_argument('--asks', type=int, default=1000)
    ap.add_argument('--clients', type=int, default=4)
    ap.add_argument('--max-new-tokens', type=int, default=12)
    ap.add_argument('--max-prompt-bytes', type=int, default=65536)
    ap.add_argument('--action', default='/vlm/ask')
    ap.add_argument('--node-name', default='vlm_node')
    ap.add_argument('--timeout', type=float, default=7200.0)
    ap.add_argument('--rss-window', type=int, default=50)
    a = ap.parse_args()
    rclpy.init()
    p = MixPeer(a)
    p.wait_ask()
    p.action.wait_for_server(timeout_sec=60)
    frame = rgb8(load_rgb('scene_a.png', (640, 480)))
    p.publish_frames('/image_raw', frame)
    # A live camera at 5 Hz for the whole soak (max_camera_silence_s holds asks to a live one).
    live = threading.Event()
    live.set()

    def camera():
        pub = p.publisher('/image_raw')
        while live.is_set():
            frame.header.stamp = p.node.get_clock().now().to_msg()
            pub.publish(frame)
            time.sleep(0.2)
    threading.Thread(target=camera, daemon=True).start()
    rss = {'before': rss_kib(a.pid)}
    results, done, trace = [], [0], []
    t0 = time.monotonic()
    sampler = RssSampler(a.pid, done, p.lock)

    def progress():
        with p.lock:
            done[0] += 1
            n = done[0]
        if n == 100:
            rss['after_100'] = rss_kib(a.pid)
        if n % 250 == 0:
            trace.append((n, rss_kib(a.pid), p.last_diag().get('session_bytes')))

    skip = set(os.environ.get('SOAK_SKIP', '').split(','))
    table = [k for k in kinds(a) if k[0] not in skip]
    threads = [threading.Thread(target=client_loop, args=(p, a, c, table, results, progress))
               for c in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    live.clear()
    settle_tokens(p, results)
    time.sleep(1.0)
    rss['after_all'] = rss_kib(a.pid)
    sampler.stop()
    w = a.rss_window
    rss['min_asks_100_to_%d' % (100 + w)] = early = sampler.window_min(100, 100 + w)
    rss['min_last_%d_asks' % w] = late = sampler.window_min(a.asks - w, a.asks)
    rss['samples'] = len(sampler.samples)
    problems = verdict(p, results)
    by_kind = {}
    for r in results:
        code = r['response']['code'] if r['response'] else 'none'
        by_kind.setdefault(r['kind'], {}).setdefault(code, 0)
        by_kind[r['kind']][code] += 1
    with p.lock:
        levels = [lvl for lvl, _, _ in p.levels]
        errors = [(n, m) for lvl, n, m in p.levels if lvl == ERROR][:5]
    single = (rss['after_all'] / rss['after_100'] - 1.0) if rss.get('after_100') else None
    growth = (late / early - 1.0) if early and late else None
    ok = not problems and not errors and growth is not None and abs(growth) <= 0.05
    print(json.dumps({
        'asks': len(results),
        'clients': a.clients,
        'wall_s': round(time.monotonic() - t0, 1),
        'outcomes_by_kind': by_kind,
        'admitted': sum(1 for r in results if r['response'] and r['response']['admitted']),
        'problems': problems[:20],
        'problem_count': len(problems),
        'rss_kib': rss,
        'rss_growth_after_100': None if growth is None else round(growth, 4),
        'rss_growth_single_samples': None if single is None else round(single, 4),
        'rss_trace_kib_and_session_bytes': trace,
        'diagnostics_statuses': len(levels),
        'diagnostics_max_level': max(levels) if levels else None,
        'diagnostics_errors': errors,
        'ok': ok,
    }, indent=1))
    rclpy.try_shutdown()
    sys.exit(0 if ok else 1)


if __name__ == '__main__':
    main()
