"""rclpy peer for tests/node_requests.rs: hostile numbers, oversized requests and broken
compressed frames against a real vlm_node.

Run with .ros2/venv/bin/python. Prints one JSON line prefixed "REPORT " and then "PEER OK",
like node_peer.py (whose Peer it uses).

  frames    good jpeg frames (CompressedImage and jpeg inside Image), an ask, then frames whose
            header reads but whose body does not decode (jpeg scan with undefined Huffman
            tables, png cut inside its data), another ask; diagnostics before and after
  numbers   asks with one bad number each (1e300, 9.3e18, NaN, ±inf, negatives), each
            followed by nothing else: the refusals come back, then one good ask
  limits    one ask over each request limit at its default, then one good ask
  all       frames, numbers, limits against one node
  caps      asks above max_request_timeout_s and max_request_new_tokens, at them and below;
            the caps and system_prompt set at run time (a system_prompt above
            max_prompt_bytes is refused with the reason)
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cv2  # noqa: E402
import rclpy  # noqa: E402
from sensor_msgs.msg import CompressedImage  # noqa: E402

from node_peer import Peer, peer_arguments, check, exact_jpeg, image, report_and_exit  # noqa: E402


def undecodable_jpeg(jpg):
    """The jpeg with its scan pointing at Huffman tables it never defines: SOF, DHT and SOS
    still read (arrival validation passes), the body cannot decode."""
    b = bytearray(jpg)
    sos = b.find(b'\xff\xda')
    check(sos > 0, 'no SOS marker')
    # FF DA, length (2 bytes), component count, then per component: id, table selectors.
    b[sos + 6] = 0x33
    return bytes(b)


def truncated_png(png):
    """The png cut inside its image data: the header reads, the body does not decode."""
    at = png.find(b'IDAT')
    check(at > 0, 'no IDAT chunk')
    return png[:at + 16]


def compressed(fmt, data):
    m = CompressedImage()
    m.format = fmt
    m.data = data
    return m


def diag_counts(p, topic):
    d = p.last_diag()
    return (int(d.get(f'camera {topic} accepted', '-1')),
            int(d.get(f'camera {topic} rejected', '-1')))


def wait_counts(p, topic, accepted, rejected):
    """Diagnostics once the topic shows at least these counts (they only grow)."""
    while time.monotonic() < p.deadline:
        a, r = diag_counts(p, topic)
        if a >= accepted and r >= rejected:
            return a, r
        time.sleep(0.05)
    return diag_counts(p, topic)


def publish(p, topic, msg, kind, count):
    """Publishes `count` frames with fresh stamps; returns the last stamp."""
    pub = p.publisher(topic, kind)
    end = time.monotonic() + 5.0
    while pub.get_subscription_count() == 0 and time.monotonic() < end:
        time.sleep(0.05)
    stamp = None
    for _ in range(count):
        msg.header.stamp = p.node.get_clock().now().to_msg()
        stamp = {'sec': msg.header.stamp.sec, 'nanosec': msg.header.stamp.nanosec}
        pub.publish(msg)
        time.sleep(0.05)
    time.sleep(0.3)
    return stamp


def mode_frames(p, a):
    p.wait_ask()
    good = exact_jpeg(96, 64, seed=5).tobytes()
    ok, png = cv2.imencode('.png', cv2.imdecode(exact_jpeg(96, 64, seed=6), cv2.IMREAD_COLOR))
    check(ok, 'png encode')
    bad_jpeg = undecodable_jpeg(good)
    bad_png = truncated_png(png.tobytes())
    rep = {}
    for name, topic, good_msg, bad_msgs, kind in [
        ('compressed', a.compressed_camera, compressed('jpeg', good),
         [compressed('jpeg', bad_jpeg), compressed('png', bad_png)], CompressedImage),
        ('jpeg_in_image', a.camera, image('jpeg', 96, 64, 0, good),
         [image('jpeg', 96, 64, 0, bad_jpeg), image('png', 96, 64, 0, bad_png)], None),
    ]:
        kind = kind or type(good_msg)
        stamp = publish(p, topic, good_msg, kind, 3)
        before = wait_counts(p, topic, 1, 0)
        first = p.greedy(f'{name}-good', a.prompt, camera=topic)
        for m in bad_msgs:
            publish(p, topic, m, kind, 2)
        after = wait_counts(p, topic, before[0], before[1] + 1)
        second = p.greedy(f'{name}-after-bad', a.prompt, camera=topic)
        rep[name] = {'good_stamp': stamp, 'good': first, 'after_bad': second,
                     'counts_before': before, 'counts_after': after}
    return rep


# One bad number per ask: (case, field the refusal must name, request fields).
NUMBERS = [
    ('timeout_1e300', 'timeout_s', {'timeout_s': 1e300}),
    ('timeout_9e18', 'timeout_s', {'timeout_s': 9.3e18}),
    ('timeout_nan', 'timeout_s', {'timeout_s': float('nan')}),
    ('timeout_inf', 'timeout_s', {'timeout_s': float('inf')}),
    ('timeout_negative', 'timeout_s', {'timeout_s': -2.0}),
    ('age_1e300', 'max_image_age_s', {'max_image_age_s': 1e300}),
    ('age_nan', 'max_image_age_s', {'max_image_age_s': float('nan')}),
    ('age_neg_inf', 'max_image_age_s', {'max_image_age_s': float('-inf')}),
    ('temperature_nan', 'temperature', {'temperature': float('nan')}),
    ('temperature_inf', 'temperature', {'temperature': float('inf')}),
    ('top_p_nan', 'top_p', {'top_p': float('nan')}),
    ('min_p_inf', 'min_p', {'min_p': float('inf')}),
    ('repetition_penalty_nan', 'repetition_penalty', {'repetition_penalty': float('nan')}),
    ('presence_penalty_neg_inf', 'presence_penalty', {'presence_penalty': float('-inf')}),
    ('presence_penalty_nan', 'presence_penalty', {'presence_penalty': float('nan')}),
]


def mode_numbers(p, a):
    p.wait_ask()
    rep = {}
    for case, field, fields in NUMBERS:
        rep[case] = {'field': field,
                     'result': p.ask(request_id=f'n-{case}', prompt='hi', camera='none', **fields)}
    rep['after'] = p.greedy('n-after', a.prompt, camera='none')
    return rep


def limits():
    """(case, name the refusal must hold, request fields) at the node's default limits."""
    tiny = image('rgb8', 2, 2, 6, bytes(12))
    return [
        ('five_images', 'max_request_images', {'images': [tiny] * 3,
                                                'compressed_images': [compressed('png', b'')] * 2}),
        ('long_prompt', 'max_prompt_bytes', {'prompt': 'x' * 65537}),
        ('long_system_prompt', 'max_prompt_bytes', {'system_prompt': 's' * 65537}),
        ('many_stop_strings', 'max_stop_strings', {'stop': ['s%d' % i for i in range(17)]}),
        ('long_stop_string', 'stop[1]', {'stop': ['ok', 'x' * 257]}),
        ('long_tools_json', 'max_tools_json_bytes', {'tools_json': ' ' * 65537}),
    ]


def mode_limits(p, a):
    p.wait_ask()
    rep = {}
    for case, name, fields in limits():
        fields = dict(fields)
        fields.setdefault('prompt', 'hi')
        rep[case] = {'name': name,
                     'result': p.ask(request_id=f'l-{case}', camera='none', **fields)}
    rep['after'] = p.greedy('l-after', a.prompt, camera='none')
    return rep


def mode_caps(p, a):
    from param_peer import Params  # noqa: E402 (only this mode sets parameters)
    ps = Params(p, a.node_name)
    p.wait_ask()
    rep = {}
    ask = lambda rid, **f: p.ask(request_id=rid, prompt='hi', camera='none', **f)  # noqa: E731
    rep['timeout_above'] = ask('c-timeout-above', timeout_s=600.5)
    rep['tokens_above'] = ask('c-tokens-above', max_new_tokens=4097)
    rep['at_caps'] = ask('c-at-caps', timeout_s=600.0, max_new_tokens=4)
    rep['no_limit'] = ask('c-no-limit', timeout_s=0.0, max_new_tokens=4)
    # Lowered at run time: the next ask is held to the new caps, and the node's default of
    # 256 new tokens is cut to the cap.
    rep['set_tokens_cap'] = ps.set('max_request_new_tokens', 3)
    rep['set_timeout_cap'] = ps.set('max_request_timeout_s', 30)
    rep['tokens_above_set'] = ask('c-tokens-above-set', max_new_tokens=4)
    rep['timeout_above_set'] = ask('c-timeout-above-set', timeout_s=31.0)
    rep['default_tokens'] = p.greedy('c-default-tokens', a.prompt, camera='none',
                                     max_new_tokens=0, use_default_stop=False)
    rep['system_prompt_long'] = ps.set('system_prompt', 's' * 65537)
    rep['system_prompt_ok'] = ps.set('system_prompt', 'Be brief.')
    rep['max_prompt_bytes_below'] = ps.set('max_prompt_bytes', 4)
    rep['after'] = ps.get(['system_prompt', 'max_prompt_bytes', 'max_request_new_tokens',
                           'max_request_timeout_s'])
    rep['answer_after'] = ask('c-after', max_new_tokens=2)
    return rep


def mode_silence(p, a):
    """A camera that streams at 10 Hz, then stops: asks while it streams are answered and
    diagnostics report its rate; 2.5 s after its last frame a default-camera ask is
    stale_image ("silent for"), a malformed one is still invalid_request (validation comes
    first), a text-only one is answered, and once frames flow again the camera answers."""
    p.wait_ask()
    rep = {}
    pub = p.publisher(a.camera)
    frame = image('rgb8', 64, 48, 64 * 3, bytes(64 * 48 * 3))
    streaming = threading.Event()

    def camera():
        while streaming.is_set():
            frame.header.stamp = p.node.get_clock().now().to_msg()
            pub.publish(frame)
            time.sleep(0.1)

    streaming.set()
    cam = threading.Thread(target=camera, daemon=True)
    cam.start()
    time.sleep(1.5)
    rep['streaming'] = p.greedy('s-streaming', a.prompt)
    time.sleep(0.5)
    rep['diag_streaming'] = p.last_diag()
    streaming.clear()
    cam.join()
    stopped = time.monotonic()
    time.sleep(2.5)
    rep['silent'] = p.greedy('s-silent', a.prompt)
    rep['silent_invalid'] = p.greedy('s-silent-invalid', a.prompt, temperature=float('nan'))
    rep['silent_text_only'] = p.greedy('s-text', a.prompt, camera='none')
    rep['silent_after_s'] = time.monotonic() - stopped
    time.sleep(0.3)
    rep['diag_silent'] = p.last_diag()
    streaming.set()
    cam = threading.Thread(target=camera, daemon=True)
    cam.start()
    time.sleep(1.0)
    rep['back'] = p.greedy('s-back', a.prompt)
    streaming.clear()
    cam.join()
    return rep


def main():
    ap = peer_arguments()
    ap.add_argument('mode', choices=['frames', 'numbers', 'limits', 'all', 'caps', 'silence'])
    ap.add_argument('--node-name', default='/vlm_node')
    ap.add_argument('--camera', default='/cam_jpeg')
    ap.add_argument('--compressed-camera', default='/cam_compressed')
    ap.add_argument('--prompt', default='What is in the picture?')
    ap.add_argument('--max-new-tokens', type=int, default=8)
    ap.add_argument('--timeout', type=float, default=240.0)
    a = ap.parse_args()
    rclpy.init()
    p = Peer(a)
    modes = {'frames': mode_frames, 'numbers': mode_numbers, 'limits': mode_limits}
    chosen = list(modes) if a.mode == 'all' else [a.mode]
    modes['caps'] = mode_caps
    modes['silence'] = mode_silence
    report_and_exit(lambda: {m: modes[m](p, a) for m in chosen})


if __name__ == '__main__':
    main()
