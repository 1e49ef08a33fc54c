"""rclpy peer for tests/node_prefill.rs: frame priming over a real ROS 2 graph.

Run with .ros2/venv/bin/python. Prints one JSON line prefixed "REPORT " and then "PEER OK",
like node_peer.py (whose Peer it uses). Every ask is greedy. The cold references send the same
pixels as a request image (never primed), so they are the answers without priming.

  hit      scene_a frames on /cam; once a priming is done, h-1 (served from it) and c-a (cold)
  strict   a long text ask L runs while scene_b frames arrive (10 Hz until Y is answered, so
           Y always has a fresh one) and X (no age limit) and Y (max_image_age_s 1.0, the
           primed frame is older) queue behind it; c-b cold
  miss     S (another system prompt, /cam) and K (/cam2, scene_c), with their cold references
  queued   frames at 10 Hz on /cam; a long text ask and three camera asks queued at once
  expired  T (on /cam, timeout_s 0.05) times out queued behind a long text ask: no camera ask
  set      system_prompt set over the parameter service; scene_a frames primed after it,
           then P (no system_prompt: the set one) is served from the priming; c-p cold
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from node_peer import (Peer, check, load_rgb, peer_arguments, report_and_exit, rgb8,  # noqa: E402
                       with_header)
from param_peer import Params  # noqa: E402
from session_peer import diag_with_served  # noqa: E402

SYSTEM = 'You are a terse robot.'


def count(d, key):
    return int(d.get(key, '-1'))


def diag_until(p, what, pred):
    while time.monotonic() < p.deadline:
        d = p.last_diag()
        if d and pred(d):
            return d
        time.sleep(0.02)
    raise AssertionError(f'diagnostics never showed {what}')


def wait_for_callbacks(order, n):
    """A future's done callbacks run on the executor after its result is set: the last ones may
    still be on their way when `finish` returns."""
    deadline = time.monotonic() + 10
    while len(order) < n and time.monotonic() < deadline:
        time.sleep(0.01)


def run(p, a):
    p.wait_ask()
    scene = {k: rgb8(load_rgb(f'scene_{k}.png')) for k in 'abc'}
    rep = {}
    served = 0

    def greedy(rid, **extra):
        nonlocal served
        r = p.greedy(rid, a.prompt, **extra)
        served += 1
        return r

    def cold(rid, key, stamp, **extra):
        img = with_header(rgb8(load_rgb(f'scene_{key}.png')), f'cold_{key}', *stamp)
        return greedy(rid, images=[img], **extra)

    # hit
    rep['sent_a'] = p.publish_frames('/cam', with_header(scene['a'], 'cam_a', 0, 0))
    diag_until(p, 'a priming', lambda d: count(d, 'prefills_done') >= 1)
    rep['h1'] = greedy('h-1')
    rep['d_h1'] = diag_with_served(p, served)
    stamp = rep['h1']['response']['image_stamp']
    rep['ca'] = cold('c-a', 'a', (stamp['sec'], stamp['nanosec']))

    # strict: the primed scene_a frame ages past 1 s, then the queue holds L, X, Y.
    time.sleep(1.5)
    rep['d_before_strict'] = diag_with_served(p, served)
    order = []
    pending = []

    # Each ask is sent once the one before is admitted (queue_depth), so the queue order is the
    # sending order.
    def send(rid, **fields):
        req, fut = p.ask_async(request_id=rid, prompt=a.prompt, temperature=0.0, top_p=1.0,
                               top_k=0, presence_penalty=0.0, **fields)
        fut.add_done_callback(lambda _f, rid=rid: order.append(rid))
        pending.append((rid, req, fut))

    def camera(topic, msg, stop, stamps):
        pub = p.publisher(topic)
        while not stop.is_set():
            msg.header.stamp = p.node.get_clock().now().to_msg()
            with p.lock:
                stamps.append([msg.header.stamp.sec, msg.header.stamp.nanosec])
            pub.publish(msg)
            time.sleep(0.1)

    send('L', camera='none', max_new_tokens=a.long_tokens, use_default_stop=False)
    diag_until(p, 'L admitted', lambda d: count(d, 'queue_depth') >= 1)
    rep['sent_b'] = p.publish_frames('/cam', with_header(scene['b'], 'cam_b', 0, 0), count=2)
    # Y needs a frame under 1 s old when it arrives, however long the steps before take.
    stop_b = threading.Event()
    t_b = threading.Thread(target=camera, daemon=True, args=(
        '/cam', with_header(scene['b'], 'cam_b', 0, 0), stop_b, rep['sent_b']))
    t_b.start()
    send('X', max_new_tokens=a.max_new_tokens)
    diag_until(p, 'X admitted', lambda d: count(d, 'queue_depth') >= 2)
    send('Y', max_new_tokens=a.max_new_tokens, max_image_age_s=1.0)
    for rid, req, fut in pending:
        rep[rid] = p.finish(req, fut)
        served += 1
    stop_b.set()
    t_b.join()
    wait_for_callbacks(order, len(pending))
    rep['order'] = list(order)
    rep['d_strict'] = diag_with_served(p, served)
    stamp = rep['Y']['response']['image_stamp']
    rep['cb'] = cold('c-b', 'b', (stamp['sec'], stamp['nanosec']))

    # miss
    rep['S'] = greedy('S', system_prompt=SYSTEM)
    rep['d_S'] = diag_with_served(p, served)
    stamp = rep['S']['response']['image_stamp']
    rep['cs'] = cold('c-s', 'b', (stamp['sec'], stamp['nanosec']), system_prompt=SYSTEM)
    rep['sent_c'] = p.publish_frames('/cam2', with_header(scene['c'], 'cam_c', 0, 0))
    rep['K'] = greedy('K', camera='/cam2')
    rep['d_K'] = diag_with_served(p, served)
    stamp = rep['K']['response']['image_stamp']
    rep['cc'] = cold('c-c', 'c', (stamp['sec'], stamp['nanosec']))

    # queued: a camera at 10 Hz keeps primings due; none runs while asks are queued.
    stop = threading.Event()
    t = threading.Thread(target=camera, daemon=True,
                         args=('/cam', with_header(scene['a'], 'cam_a', 0, 0), stop, []))
    t.start()
    done = count(p.last_diag(), 'prefills_done')
    diag_until(p, 'primings of the 10 Hz camera', lambda d: count(d, 'prefills_done') >= done + 2)
    with p.lock:
        first = len(p.diagnostics)
    base = served
    pending.clear()
    order.clear()
    send('Q0', camera='none', max_new_tokens=a.long_tokens, use_default_stop=False)
    for i in range(1, 4):
        diag_until(p, f'{i} asks admitted', lambda d, i=i: count(d, 'queue_depth') >= i)
        send(f'Q{i}', max_new_tokens=a.queued_tokens, use_default_stop=False)
    for rid, req, fut in pending:
        rep[rid] = p.finish(req, fut)
        served += 1
    wait_for_callbacks(order, len(pending))
    rep['queued_order'] = list(order)
    diag_with_served(p, served)
    stop.set()
    t.join()
    with p.lock:
        seen = p.diagnostics[first:]
    # (requests_served, prefills_done, prefills_stopped) of every update while the batch ran.
    rep['queued_diag'] = [
        [count(d, 'requests_served') - base, count(d, 'prefills_done'),
         count(d, 'prefills_stopped')] for d in seen]

    # expired: a camera ask that times out in the queue is no priming camera ask.
    failed = count(p.last_diag(), 'requests_failed')
    rep['d_before_T'] = diag_with_served(p, served)
    pending.clear()
    order.clear()
    send('LT', camera='none', max_new_tokens=a.long_tokens, use_default_stop=False)
    diag_until(p, 'LT admitted', lambda d: count(d, 'queue_depth') >= 1)
    send('T', max_new_tokens=a.max_new_tokens, timeout_s=0.05)
    for rid, req, fut in pending:
        rep[rid] = p.finish(req, fut)
    served += 1
    rep['d_T'] = diag_until(p, 'T failed', lambda d: count(d, 'requests_failed') > failed
                            and count(d, 'requests_served') >= served)

    # set: after a run-time system_prompt, asks without one use it; so must the priming.
    rep['set'] = Params(p, a.node_name).set('system_prompt', SYSTEM)
    # Each frame is published once a priming completed after the one before, so the priming
    # P gets started after the set (one priming runs at a time; all frames show scene_a).
    rep['sent_p'] = []
    for _ in range(2):
        done = count(p.last_diag(), 'prefills_done')
        rep['sent_p'] += p.publish_frames('/cam', with_header(scene['a'], 'cam_a', 0, 0),
                                          count=1)
        diag_until(p, 'a priming after the set',
                   lambda d, done=done: count(d, 'prefills_done') > done)
    rep['d_before_set'] = diag_with_served(p, served)
    rep['P'] = greedy('P')
    rep['d_P'] = diag_with_served(p, served)
    stamp = rep['P']['response']['image_stamp']
    rep['cp'] = cold('c-p', 'a', (stamp['sec'], stamp['nanosec']))
    return rep


def main():
    ap = peer_arguments()
    ap.add_argument('--node-name', default='/vlm_node')
    ap.add_argument('--prompt', default='What do you see?')
    ap.add_argument('--max-new-tokens', type=int, default=8)
    ap.add_argument('--long-tokens', type=int, default=600)
    ap.add_argument('--queued-tokens', type=int, default=120)
    ap.add_argument('--timeout', type=float, default=280.0)
    a = ap.parse_args()
    check(a.max_new_tokens > 0, 'max_new_tokens')
    import rclpy
    rclpy.init()
    p = Peer(a)
    report_and_exit(lambda: run(p, a))


if __name__ == '__main__':
    main()
