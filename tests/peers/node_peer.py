"""rclpy peer for tests/node.rs: drives a real vlm_node over a ROS 2 graph.

Run with .ros2/venv/bin/python. Every mode prints one JSON line prefixed "REPORT " and then
"PEER OK"; the Rust test asserts on the report. Token streams are collected until the `last`
Token of each request (DDS does not order them with the service response).

  answers   camera asks, explicit images, every encoding, malformed frames, sessions, errors
  queue     readiness, N + k concurrent asks at queue depth N, cancel, timeout
  soak      many sequential asks; diagnostics before and after
  sigterm   one long ask; prints "FIRST TOKEN" when streaming starts, then waits for the end
  text      one greedy text-only ask
"""

import argparse
import array
import json
import os
import sys
import threading
import time
import traceback

import cv2
import numpy as np
import rclpy
from rclpy.executors import MultiThreadedExecutor
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from diagnostic_msgs.msg import DiagnosticArray
from sensor_msgs.msg import CompressedImage, Image

from bpu_vlm_msgs.msg import Answer, Token
from bpu_vlm_msgs.srv import Ask, Cancel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGES = os.path.join(ROOT, 'tools', 'fixtures', 'images')
# The checkout's client package before any installed copy: the peers take its race-free
# ActionClient (`bpu_vlm_client.action_client`; rclpy's own can lose a response).
sys.path.insert(0, os.path.join(ROOT, 'client'))


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def plain(value):
    if hasattr(value, 'get_fields_and_field_types'):
        return {n: plain(getattr(value, n)) for n in value.get_fields_and_field_types()}
    if isinstance(value, (bytes, bytearray, array.array)):
        return list(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, 'tolist'):
        return value.tolist()
    return value


def load_rgb(name, size=None):
    bgr = cv2.imread(os.path.join(IMAGES, name), cv2.IMREAD_COLOR)
    check(bgr is not None, f'cannot read {name}')
    if size is not None:
        bgr = cv2.resize(bgr, size, interpolation=cv2.INTER_AREA)
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def image(encoding, width, height, step, data, big=False):
    m = Image()
    m.encoding, m.width, m.height, m.step = encoding, width, height, step
    m.is_bigendian = 1 if big else 0
    m.data = bytes(data)
    m.header.frame_id = 'camera'
    return m


def rgb8(rgb):
    h, w = rgb.shape[:2]
    return image('rgb8', w, h, w * 3, rgb.tobytes())


def with_header(msg, frame_id, sec, nanosec):
    msg.header.frame_id = frame_id
    msg.header.stamp.sec, msg.header.stamp.nanosec = sec, nanosec
    return msg


def nv12(rgb, step, rows):
    """An NV12 Image of `rgb` with `step` bytes per row and `rows` rows per luma plane, and
    OpenCV's RGB of the compact planes."""
    h, w = rgb.shape[:2]
    i420 = cv2.cvtColor(cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), cv2.COLOR_BGR2YUV_I420)
    ys, uv = i420[:h], i420[h:].reshape(-1)
    q = (h // 2) * (w // 2)
    inter = np.empty((h // 2, w), np.uint8)
    inter[:, 0::2] = uv[:q].reshape(h // 2, w // 2)
    inter[:, 1::2] = uv[q:2 * q].reshape(h // 2, w // 2)
    buf = np.zeros((rows + rows // 2, step), np.uint8)
    buf[:h, :w] = ys
    buf[rows:rows + h // 2, :w] = inter
    ref = cv2.cvtColor(np.vstack([ys, inter]), cv2.COLOR_YUV2RGB_NV12)
    return image('nv12', w, h, step, buf.tobytes()), ref


def encodings(rgb):
    """(name, message, OpenCV's RGB of it) for every encoding the node accepts."""
    h, w = rgb.shape[:2]
    out = []
    bgr = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)
    out.append(('rgb8', image('rgb8', w, h, w * 3, rgb.tobytes()), rgb))
    pad = np.zeros((h, 8), np.uint8)
    out.append(('bgr8_step', image('bgr8', w, h, w * 3 + 8,
                                    np.hstack([bgr.reshape(h, -1), pad]).tobytes()),
                cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)))
    rgba = cv2.cvtColor(rgb, cv2.COLOR_RGB2RGBA)
    out.append(('rgba8', image('rgba8', w, h, w * 4, rgba.tobytes()),
                cv2.cvtColor(rgba, cv2.COLOR_RGBA2RGB)))
    bgra = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGRA)
    out.append(('bgra8', image('bgra8', w, h, w * 4, bgra.tobytes()),
                cv2.cvtColor(bgra, cv2.COLOR_BGRA2RGB)))
    grey = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    out.append(('mono8', image('mono8', w, h, w, grey.tobytes()),
                cv2.cvtColor(grey, cv2.COLOR_GRAY2RGB)))
    g16 = grey.astype(np.uint16) * 257
    out.append(('mono16', image('mono16', w, h, w * 2, g16.astype('<u2').tobytes()),
                cv2.cvtColor((g16 >> 8).astype(np.uint8), cv2.COLOR_GRAY2RGB)))
    # YUV 4:2:2 and 4:2:0 from OpenCV's own RGB→YUV, converted back by OpenCV (reference).
    yuv = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV)
    y, u, v = yuv[:, :, 0], yuv[:, :, 1], yuv[:, :, 2]
    u2 = ((u[:, 0::2].astype(np.uint16) + u[:, 1::2]) // 2).astype(np.uint8)
    v2 = ((v[:, 0::2].astype(np.uint16) + v[:, 1::2]) // 2).astype(np.uint8)
    uyvy = np.stack([u2, y[:, 0::2], v2, y[:, 1::2]], axis=2).reshape(h, w * 2)
    out.append(('yuv422', image('yuv422', w, h, w * 2, uyvy.tobytes()),
                cv2.cvtColor(uyvy.reshape(h, w, 2), cv2.COLOR_YUV2RGB_UYVY)))
    yuyv = np.stack([y[:, 0::2], u2, y[:, 1::2], v2], axis=2).reshape(h, w * 2)
    out.append(('yuv422_yuy2', image('yuv422_yuy2', w, h, w * 2, yuyv.tobytes()),
                cv2.cvtColor(yuyv.reshape(h, w, 2), cv2.COLOR_YUV2RGB_YUY2)))
    # A wider row step and a padded plane height.
    out.append(('nv12_padded',) + nv12(rgb, step=w + 32, rows=h + 8))
    ok, png = cv2.imencode('.png', bgr)
    check(ok, 'png encode')
    out.append(('png_in_image', image('png', w, h, 0, png.tobytes()), rgb))
    jpg = exact_jpeg(w, h)
    out.append(('jpeg_in_image', image('jpeg', w, h, 0, jpg.tobytes()),
                cv2.cvtColor(cv2.imdecode(jpg, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)))
    return out


def exact_jpeg(w, h, seed=3):
    """A JPEG every conforming decoder turns into the same pixels: grey (no chroma rounding),
    constant 8x8 blocks (DC only) at quality 100 (quantiser 1). JPEG decoders legitimately
    differ by a few levels on general images (the camera-frame tests bound that against
    OpenCV); here the node's answer must equal the answer for OpenCV's pixels exactly."""
    rng = np.random.default_rng(seed)
    grey = np.kron(rng.integers(16, 240, ((h + 7) // 8, (w + 7) // 8)),
                   np.ones((8, 8), np.int64))[:h, :w].astype(np.uint8)
    ok, jpg = cv2.imencode('.jpg', cv2.cvtColor(grey, cv2.COLOR_GRAY2BGR),
                           [cv2.IMWRITE_JPEG_QUALITY, 100])
    check(ok, 'jpeg encode')
    return jpg


def ros_now(p):
    """The peer's ROS clock as [sec, nanosec] (the clock the stamps use)."""
    t = p.node.get_clock().now().to_msg()
    return [t.sec, t.nanosec]


class ScriptedCamera:
    """A camera for scene tests: 10 Hz frames of the current scene (`scene`: 'a', 'b', 'c' for
    scene_a/b/c.png; None: silent), each with Gaussian sensor noise of sigma 4/255 on every
    pixel, a fresh stamp and frame_id cam_<scene>; remembers [[sec, nanosec], scene] sent."""

    def __init__(self, p, topic, seed=11):
        self.p = p
        self.pub = p.publisher(topic)
        self.scenes = {k: load_rgb(f'scene_{k}.png').astype(np.float32) for k in 'abc'}
        self.scene = 'a'
        self.sent = []
        self.stop = threading.Event()
        self.rng = np.random.default_rng(seed)
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            key = self.scene
            if key is not None:
                noisy = self.scenes[key] + self.rng.normal(0.0, 4.0, self.scenes[key].shape)
                msg = rgb8(np.clip(np.rint(noisy), 0, 255).astype(np.uint8))
                msg.header.frame_id = f'cam_{key}'
                msg.header.stamp = self.p.node.get_clock().now().to_msg()
                self.sent.append([[msg.header.stamp.sec, msg.header.stamp.nanosec], key])
                self.pub.publish(msg)
            time.sleep(0.1)

    def switch(self, key):
        """Switches the scene; the peer's clock then (the next frame is stamped later)."""
        self.scene = key
        return ros_now(self.p)


def peer_arguments():
    """An argument parser with the node's interface names that `Peer` reads (--ask, --cancel,
    --tokens, --answers, --status-name) at their root-namespace defaults; each peer adds its
    own options."""
    ap = argparse.ArgumentParser()
    ap.add_argument('--ask', default='/ask')
    ap.add_argument('--cancel', default='/vlm/cancel')
    ap.add_argument('--tokens', default='/vlm/tokens')
    ap.add_argument('--answers', default='/vlm/answers')
    ap.add_argument('--status-name', default='/vlm_node: engine')
    return ap


class Peer:
    def __init__(self, args):
        self.args = args
        self.deadline = time.monotonic() + args.timeout
        self.node = rclpy.create_node('node_test_peer')
        self.lock = threading.Lock()
        self.tokens = {}
        self.answers = {}
        self.diagnostics = []
        self.diag_stamps = []
        qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=4096,
                         reliability=ReliabilityPolicy.RELIABLE)
        self.node.create_subscription(Token, args.tokens, self.on_token, qos)
        self.node.create_subscription(Answer, args.answers, self.on_answer,
                                      QoSProfile(depth=64, reliability=ReliabilityPolicy.RELIABLE))
        self.node.create_subscription(DiagnosticArray, '/diagnostics', self.on_diag, 10)
        self.ask_client = self.node.create_client(Ask, args.ask)
        self.cancel_client = self.node.create_client(Cancel, args.cancel)
        self.publishers = {}
        self.executor = MultiThreadedExecutor(num_threads=4)
        self.executor.add_node(self.node)
        self.spinner = threading.Thread(target=self.executor.spin, daemon=True)
        self.spinner.start()

    def on_token(self, t):
        with self.lock:
            self.tokens.setdefault(t.request_id, []).append(t)

    def on_answer(self, a):
        with self.lock:
            self.answers[a.request_id] = a

    def on_diag(self, d):
        with self.lock:
            self.diag_stamps.append([d.header.stamp.sec, d.header.stamp.nanosec])
            for s in d.status:
                if s.name == self.args.status_name:
                    self.diagnostics.append({kv.key: kv.value for kv in s.values})

    def last_diag(self):
        with self.lock:
            return dict(self.diagnostics[-1]) if self.diagnostics else {}

    def left(self):
        return max(0.1, self.deadline - time.monotonic())

    def wait_ask(self):
        check(self.ask_client.wait_for_service(timeout_sec=self.left()), 'no /ask service')

    def publisher(self, topic, kind=Image):
        if topic not in self.publishers:
            self.publishers[topic] = self.node.create_publisher(kind, topic, qos_profile_sensor_data)
        return self.publishers[topic]

    def publish_frames(self, topic, msg, kind=Image, count=5):
        """Publishes like a camera (several frames, fresh stamps) until the node has one.
        Returns the stamps sent, as [sec, nanosec] pairs."""
        pub = self.publisher(topic, kind)
        end = time.monotonic() + 5.0
        while pub.get_subscription_count() == 0 and time.monotonic() < end:
            time.sleep(0.05)
        sent = []
        for _ in range(count):
            msg.header.stamp = self.node.get_clock().now().to_msg()
            sent.append([msg.header.stamp.sec, msg.header.stamp.nanosec])
            pub.publish(msg)
            time.sleep(0.05)
        time.sleep(0.2)
        return sent

    def ask_async(self, **fields):
        req = Ask.Request()
        for k, v in fields.items():
            setattr(req, k, v)
        return req, self.ask_client.call_async(req)

    def finish(self, req, future, need_last=True):
        """Waits for the response and (when it was admitted) the request's last Token."""
        while not future.done() and time.monotonic() < self.deadline:
            time.sleep(0.01)
        check(future.done(), f'no response for {req.request_id}')
        r = future.result()
        rid = r.request_id
        admitted = r.success or r.error_code in ('cancelled', 'timeout', 'backend_error',
                                                 'context_overflow') or bool(r.finish_reason)
        if need_last and admitted:
            while time.monotonic() < self.deadline:
                with self.lock:
                    ts = list(self.tokens.get(rid, []))
                    have_answer = rid in self.answers
                if any(t.last for t in ts) and have_answer:
                    break
                time.sleep(0.01)
        with self.lock:
            ts = sorted(self.tokens.get(rid, []), key=lambda t: t.index)
            answer = self.answers.get(rid)
        return {
            'response': plain(r),
            'tokens': [plain(t) for t in ts],
            'answer': plain(answer) if answer is not None else None,
        }

    def ask(self, **fields):
        req, fut = self.ask_async(**fields)
        return self.finish(req, fut)

    def greedy(self, rid, prompt, **extra):
        fields = dict(request_id=rid, prompt=prompt, temperature=0.0, top_p=1.0, top_k=0,
                      presence_penalty=0.0, max_new_tokens=self.args.max_new_tokens)
        fields.update(extra)
        return self.ask(**fields)


def mode_answers(p, a):
    p.wait_ask()
    rep = {}
    scene_a = load_rgb('scene_a.png')
    # The camera's own TF frame and stamps must reach the answer, not the topic name.
    rep['camera_sent'] = p.publish_frames(
        a.camera, with_header(rgb8(scene_a), 'cam_optical_frame', 0, 0))
    rep['camera'] = p.greedy('cam-1', a.prompt)
    rep['think'] = p.greedy('think-1', a.prompt, enable_thinking=Ask.Request.ON)
    rep['text_only'] = p.greedy('text-1', a.prompt, camera='none')
    scene_b = load_rgb('scene_b.png')
    rep['explicit'] = p.greedy('img-1', a.prompt,
                               images=[with_header(rgb8(scene_b), 'req_frame', 1234, 5678)])
    ok, png = cv2.imencode('.png', cv2.cvtColor(load_rgb('scene_c.png'), cv2.COLOR_RGB2BGR))
    c = CompressedImage()
    c.format = 'png'
    c.data = png.tobytes()
    with_header(c, 'cmp_frame', 99, 1)
    rep['compressed'] = p.greedy('cimg-1', a.prompt, compressed_images=[c])
    # Several request images: the first one's header (raw images come first) is reported.
    rep['two_images'] = p.greedy('two-1', a.prompt,
                                 images=[with_header(rgb8(scene_b), 'first_frame', 42, 7)],
                                 compressed_images=[c])
    # Sessions: two text turns continue one conversation.
    rep['session'] = [p.greedy('sess-1', a.prompt, camera='none', session_id='s1'),
                      p.greedy('sess-2', a.prompt2, camera='none', session_id='s1')]
    # Malformed frames on the camera topic: rejected, the previous (scene_a) frame stays.
    w, h = 64, 48
    bad = [image('rgb8', w, h, w * 3 - 1, bytes(w * 3 * h)),           # step too small
           image('rgb8', w, h, w * 3, bytes(w * 3 * h - 7)),           # short data
           image('bogus16', w, h, w * 2, bytes(w * 2 * h)),            # unknown encoding
           image('rgb8', 0, 0, 0, b''),                                # zero size
           image('rgb8', 200000, 200000, 600000, bytes(16)),           # absurd size
           image('nv12', 63, 48, 64, bytes(64 * 72)),                  # odd width for 4:2:0
           image('jpeg', w, h, 0, b'\xff\xd8\xff\xe0garbage')]         # not a JPEG
    rng = np.random.default_rng(6)
    bpp = {'rgb8': 3, 'bgr8': 3, 'rgba8': 4, 'mono8': 1, 'mono16': 2, 'yuv422': 2}
    for i in range(12):  # fuzzed fields, each broken in one way
        enc = str(rng.choice(list(bpp)))
        ww, hh = 2 * int(rng.integers(1, 20)), int(rng.integers(1, 40))
        row = ww * bpp[enc]
        if i % 3 == 0:    # step below the row size
            step, n = int(rng.integers(0, row)), row * hh
        elif i % 3 == 1:  # payload shorter than step x height
            step = row + int(rng.integers(0, 8))
            n = int(rng.integers(0, step * hh))
        else:             # an encoding nobody defines
            enc, step = 'fuzz%d' % i, row
            n = row * hh
        bad.append(image(enc, ww, hh, step, rng.integers(0, 256, n, dtype=np.uint8).tobytes()))
    pub = p.publisher(a.camera)
    for m in bad:
        m.header.stamp = p.node.get_clock().now().to_msg()
        pub.publish(m)
        time.sleep(0.02)
    time.sleep(0.3)
    rep['after_bad_frames'] = p.greedy('cam-2', a.prompt)
    # Every encoding on its own topic vs OpenCV's RGB of it sent as rgb8.
    base = load_rgb('scene_b.png', (96, 64))
    rep['encodings'] = {}
    for name, msg, ref in encodings(base):
        topic = f'{a.enc_prefix}{name}'
        p.publish_frames(topic, msg, count=3)
        got = p.greedy(f'enc-{name}', a.prompt, camera=topic)
        want = p.greedy(f'ref-{name}', a.prompt, images=[rgb8(np.ascontiguousarray(ref))])
        rep['encodings'][name] = {'node': got, 'opencv': want}
    # CompressedImage on a compressed topic.
    jpg = exact_jpeg(96, 64, seed=4)
    cj = CompressedImage()
    cj.format = 'jpeg'
    cj.data = jpg.tobytes()
    p.publish_frames(a.compressed_camera, cj, kind=CompressedImage, count=3)
    ref = cv2.cvtColor(cv2.imdecode(jpg, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    rep['encodings']['compressed_jpeg'] = {
        'node': p.greedy('enc-cjpeg', a.prompt, camera=a.compressed_camera),
        'opencv': p.greedy('ref-cjpeg', a.prompt, images=[rgb8(np.ascontiguousarray(ref))]),
    }
    # Frames above Fast DDS's 512 KiB shared-memory default.
    big = load_rgb('scene_a.png', (640, 480))
    p.publish_frames(a.enc_prefix + 'big_rgb8', rgb8(big), count=5)
    rep['big_rgb8'] = p.greedy('big-1', a.prompt, camera=a.enc_prefix + 'big_rgb8')
    rep['big_rgb8_ref'] = p.greedy('big-ref', a.prompt, images=[rgb8(big)])
    hd = load_rgb('scene_a.png', (1920, 1080))
    # 1080p NV12 as D-Robotics cameras send it: 1088 plane rows, step = width.
    hd_msg, hd_ref = nv12(hd, step=1920, rows=1088)
    p.publish_frames(a.enc_prefix + 'big_nv12', hd_msg, count=5)
    rep['big_nv12'] = p.greedy('bignv-1', a.prompt, camera=a.enc_prefix + 'big_nv12')
    rep['big_nv12_ref'] = p.greedy('bignv-ref', a.prompt, images=[rgb8(hd_ref)])
    # Requests that must be refused with a reason.
    rep['errors'] = {
        'empty_prompt': p.ask(request_id='e1', prompt='   '),
        'absurd_max_new_tokens': p.ask(request_id='e2', prompt='hi', max_new_tokens=4000000000),
        'unknown_camera': p.ask(request_id='e3', prompt='hi', camera='/no_such_camera'),
        'no_image': p.ask(request_id='e4', prompt='hi', camera=a.silent_camera),
        'stale_image': p.ask(request_id='e5', prompt='hi', max_image_age_s=1e-6),
        'bad_temperature': p.ask(request_id='e6', prompt='hi', temperature=-5.0),
        'bad_tools': p.ask(request_id='e7', prompt='hi', tools_json='not json'),
        'bad_request_image': p.ask(request_id='e8', prompt='hi',
                                   images=[image('rgb8', 4, 4, 2, bytes(8))]),
    }
    rep['after_errors'] = p.greedy('cam-3', a.prompt)
    return rep


def mode_queue(p, a):
    rep = {'saw_loading_without_ask': False}
    # Readiness: while the (slowed) model warms up, diagnostics say loading and /ask is absent.
    while time.monotonic() < p.deadline:
        present = p.ask_client.service_is_ready()
        d = p.last_diag()
        if d.get('state') == 'loading' and not present:
            rep['saw_loading_without_ask'] = True
        if present:
            break
        time.sleep(0.05)
    p.wait_ask()
    time.sleep(0.5)  # a diagnostics period or more
    rep['state_when_ready'] = p.last_diag().get('state')
    n, k = a.queue_depth, a.extra
    pending = [p.ask_async(request_id=f'q-{i}', prompt=a.prompt, camera='none',
                           temperature=0.0, max_new_tokens=3) for i in range(n + k)]
    rep['concurrent'] = [p.finish(req, fut) for req, fut in pending]
    # Cancel mid-stream.
    req, fut = p.ask_async(request_id='c-1', prompt=a.prompt, camera='none', temperature=0.0,
                           max_new_tokens=400, use_default_stop=False)
    while time.monotonic() < p.deadline:
        with p.lock:
            if p.tokens.get('c-1'):
                break
        time.sleep(0.01)
    cr = p.cancel_client.call_async(Cancel.Request(request_id='c-1'))
    while not cr.done() and time.monotonic() < p.deadline:
        time.sleep(0.01)
    rep['cancel_response'] = plain(cr.result())
    rep['cancelled'] = p.finish(req, fut)
    rep['timeout'] = p.ask(request_id='t-1', prompt=a.prompt, camera='none', temperature=0.0,
                           max_new_tokens=400, use_default_stop=False, timeout_s=1.0)
    rep['after'] = p.ask(request_id='ok-1', prompt=a.prompt, camera='none', temperature=0.0,
                         max_new_tokens=3)
    return rep


def mode_soak(p, a):
    p.wait_ask()
    time.sleep(2.5 * a.diag_period)
    rep = {'before': p.last_diag(), 'results': []}
    for i in range(a.count):
        r = p.ask(request_id=f'soak-{i}', prompt=a.prompt, camera='none', temperature=0.0,
                  max_new_tokens=4, session_id=f'soak-s{i % 5}' if i >= a.count - 20 else '')
        rep['results'].append({'success': r['response']['success'],
                               'error': r['response']['error_message'],
                               'lasts': sum(1 for t in r['tokens'] if t['last'])})
    with p.lock:
        rep['max_sessions'] = max(int(d.get('sessions', '0')) for d in p.diagnostics)
    # Sessions expire after session_idle_s; wait for diagnostics to show the baseline again.
    end = time.monotonic() + a.settle
    while time.monotonic() < end:
        d = p.last_diag()
        if d.get('sessions') == '0' and d.get('queue_depth') == '0':
            break
        time.sleep(0.1)
    time.sleep(2.5 * a.diag_period)
    rep['settled'] = p.last_diag()
    return rep


def mode_text(p, a):
    p.wait_ask()
    return {'text': p.greedy('cpu-1', a.prompt, camera='none')}


def mode_namespace(p, a):
    """The node under a namespace, with its default (relative) names: a camera on the
    namespaced image_raw (or where it is remapped to), named as configured and fully
    resolved; the graph as the node offers it; its "ready" line on /rosout."""
    from rcl_interfaces.msg import Log
    from rclpy.qos import DurabilityPolicy
    logs = []
    # /rosout keeps its last lines for late subscribers (transient local), so none is missed.
    p.node.create_subscription(
        Log, '/rosout', logs.append,
        QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE,
                   durability=DurabilityPolicy.TRANSIENT_LOCAL))
    p.wait_ask()
    rep = {}
    rep['camera_sent'] = p.publish_frames(
        a.camera, with_header(rgb8(load_rgb('scene_a.png')), 'robot1_cam', 0, 0))
    rep['default'] = p.greedy('ns-1', a.prompt)
    rep['configured'] = p.greedy('ns-2', a.prompt, camera='image_raw')
    rep['resolved'] = p.greedy('ns-3', a.prompt, camera=a.camera)
    while not p.last_diag() and time.monotonic() < p.deadline:
        time.sleep(0.05)
    rep['diagnostics'] = p.last_diag()
    while time.monotonic() < p.deadline and not any('ready' in m.msg for m in list(logs)):
        time.sleep(0.05)
    rep['rosout_ready'] = [[m.name, m.level] for m in list(logs) if 'vlm_node ready' in m.msg]
    ns, name = a.node_ns, a.node_name
    rep['node_topics'] = sorted(
        {t for t, _ in p.node.get_publisher_names_and_types_by_node(name, ns)}
        | {t for t, _ in p.node.get_subscriber_names_and_types_by_node(name, ns)})
    rep['node_services'] = sorted(
        s for s, _ in p.node.get_service_names_and_types_by_node(name, ns))
    rep['all_topics'] = sorted(t for t, _ in p.node.get_topic_names_and_types())
    rep['all_services'] = sorted(s for s, _ in p.node.get_service_names_and_types())
    return rep


def mode_sim_time(p, a):
    """A /clock publisher far from wall time (a replayed bag): the node's stamps follow it."""
    from rosgraph_msgs.msg import Clock
    pub = p.node.create_publisher(Clock, '/clock', 10)
    sent = []
    stop = threading.Event()

    def tick():
        k = 0
        while not stop.is_set():
            c = Clock()
            c.clock.sec, c.clock.nanosec = 5000 + k // 100, (k % 100) * 10_000_000
            pub.publish(c)
            sent.append([c.clock.sec, c.clock.nanosec])
            k += 1
            time.sleep(0.01)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    p.wait_ask()
    time.sleep(0.3)  # the node has seen /clock before the ask
    rep = {'ask': p.greedy('sim-1', a.prompt, camera='none')}
    time.sleep(3 * a.diag_period + 0.3)
    with p.lock:
        rep['diag_stamp'] = p.diag_stamps[-1] if p.diag_stamps else None
    stop.set()
    ticker.join()
    rep['clock_first'], rep['clock_last'] = sent[0], sent[-1]
    return rep


def mode_sigterm(p, a):
    p.wait_ask()
    req, fut = p.ask_async(request_id='sig-1', prompt=a.prompt, camera='none', temperature=0.0,
                           max_new_tokens=400, use_default_stop=False)
    while time.monotonic() < p.deadline:
        with p.lock:
            if p.tokens.get('sig-1'):
                break
        time.sleep(0.01)
    print('FIRST TOKEN', flush=True)
    return p.finish(req, fut)


def main():
    ap = peer_arguments()
    ap.add_argument('mode', choices=['answers', 'queue', 'soak', 'sigterm', 'text',
                                     'namespace', 'sim_time'])
    ap.add_argument('--node-ns', default='/')
    ap.add_argument('--node-name', default='vlm_node')
    ap.add_argument('--camera', default='/cam')
    ap.add_argument('--compressed-camera', default='/cam_compressed')
    ap.add_argument('--silent-camera', default='/cam_silent')
    ap.add_argument('--enc-prefix', default='/enc_')
    ap.add_argument('--prompt', default='What is in the picture?')
    ap.add_argument('--prompt2', default='And what colour is it?')
    ap.add_argument('--max-new-tokens', type=int, default=12)
    ap.add_argument('--queue-depth', type=int, default=2)
    ap.add_argument('--extra', type=int, default=2)
    ap.add_argument('--count', type=int, default=200)
    ap.add_argument('--settle', type=float, default=20.0)
    ap.add_argument('--diag-period', type=float, default=0.2)
    ap.add_argument('--timeout', type=float, default=240.0)
    a = ap.parse_args()
    rclpy.init()
    p = Peer(a)
    report_and_exit(lambda: {'answers': mode_answers, 'queue': mode_queue, 'soak': mode_soak,
                             'sigterm': mode_sigterm, 'text': mode_text,
                             'namespace': mode_namespace,
                             'sim_time': mode_sim_time}[a.mode](p, a))


def report_and_exit(run):
    """Runs a peer's mode and prints its report ("REPORT <json>", then "PEER OK"); any
    exception is printed and the peer exits 1. Every peer ends here."""
    try:
        rep = run()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    print('REPORT ' + json.dumps(rep), flush=True)
    print('PEER OK', flush=True)
    # Tearing down rclpy while the executor thread may still sit in a DDS wait can abort the
    # process (std::terminate in the middleware); everything is reported, so leave at once.
    sys.stdout.flush()
    os._exit(0)


if __name__ == '__main__':
    main()
