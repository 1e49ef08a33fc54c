"""rclpy peer for tests/node_detect.rs: /detect over a real ROS 2 graph.

Run with .ros2/venv/bin/python. Prints one JSON line prefixed "REPORT " and then "PEER OK",
like node_peer.py (whose Peer it uses). A 640x480 frame goes to the node four ways: as a
request image, and on a raw (rgb8), a compressed (jpeg) and an NV12 camera topic, each with
its own frame_id and stamp. For each, the report holds the Detect response, the message seen
on /vlm/detections for it, and what /vlm/annotated showed (header, size, and the pixels the
test compares with the source frame).

With --cancels (a held answer on a slow BPU): detects, over the service and as goals,
stopped by /vlm/cancel with their request id at their first Token and after their first
object closed, each with what it published on /vlm/detections; then detects whose answer
budget is above the node's max_request_new_tokens.
"""

import os
import sys
import threading
import time

import cv2
import numpy as np
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image
from vision_msgs.msg import Detection2DArray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from node_peer import (Peer, check, nv12, peer_arguments, plain, report_and_exit,  # noqa: E402
                       rgb8, with_header)
from bpu_vlm_client.action_client import ActionClient  # noqa: E402  (node_peer's path)
from bpu_vlm_msgs.action import Detect as DetectAction  # noqa: E402
from bpu_vlm_msgs.srv import Cancel, Detect  # noqa: E402

W, H = 640, 480


def frame():
    """Blocks of colour on a grey ramp: a drawn edge differs from what was under it."""
    rng = np.random.default_rng(7)
    ys, xs = np.mgrid[0:H, 0:W]
    rgb = np.stack([(xs * 255 // W), (ys * 255 // H), np.full((H, W), 90)], axis=2)
    for _ in range(6):
        x, y = rng.integers(0, W - 120), rng.integers(0, H - 90)
        rgb[y:y + 90, x:x + 120] = rng.integers(0, 256, 3)
    return rgb.astype(np.uint8)


class Detector:
    def __init__(self, p):
        self.p = p
        self.lock = threading.Lock()
        self.detections = []
        self.annotated = []
        qos = QoSProfile(depth=64, reliability=ReliabilityPolicy.RELIABLE)
        p.node.create_subscription(Detection2DArray, '/vlm/detections', self.on_det, qos)
        p.node.create_subscription(Image, '/vlm/annotated', self.on_ann, 4)
        self.client = p.node.create_client(Detect, '/detect')
        self.action = ActionClient(p.node, DetectAction, '/vlm/detect')
        self.feedback = []
        deep = QoSProfile(depth=1024, reliability=ReliabilityPolicy.RELIABLE)
        p.node.create_subscription(DetectAction.Impl.FeedbackMessage,
                                   '/vlm/detect/_action/feedback', self.on_feedback, deep)

    def on_feedback(self, m):
        with self.lock:
            self.feedback.append((bytes(m.goal_id.uuid), plain(m.feedback.detections)))

    def wait(self, future, what):
        while not future.done() and time.monotonic() < self.p.deadline:
            time.sleep(0.01)
        check(future.done(), f'no {what}')
        return future.result()

    def goal_cancelled(self, **fields):
        """Sends a goal and cancels it once its first feedback (first object) arrived."""
        g = DetectAction.Goal()
        for k, v in fields.items():
            setattr(g, k, v)
        handle = self.wait(self.action.send_goal_async(g), 'goal response')
        uuid = bytes(handle.goal_id.uuid)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            with self.lock:
                if any(u == uuid for u, _ in self.feedback):
                    break
            time.sleep(0.005)
        self.wait(handle.cancel_goal_async(), 'cancel response')
        r = self.wait(handle.get_result_async(), 'goal result')
        time.sleep(1.0)
        with self.lock:
            fb = [d for u, d in self.feedback if u == uuid]
        return {'status': r.status, 'response': plain(r.result), 'feedback': fb}

    def action_ready(self):
        """The action server and its feedback publisher are matched."""
        check(self.action.wait_for_server(timeout_sec=self.p.left()), 'no vlm/detect server')
        topic = '/vlm/detect/_action/feedback'
        while self.p.node.count_publishers(topic) == 0 and time.monotonic() < self.p.deadline:
            time.sleep(0.05)
        time.sleep(0.3)

    def goal(self, **fields):
        """Sends a vlm/detect goal and waits for its result; the feedback the goal got (read
        from the feedback topic: DDS does not order it with the result, so wait a little)."""
        self.action_ready()
        g = DetectAction.Goal()
        for k, v in fields.items():
            setattr(g, k, v)
        handle = self.wait(self.action.send_goal_async(g), 'goal response')
        r = self.wait(handle.get_result_async(), 'goal result')
        time.sleep(1.0)
        uuid = bytes(handle.goal_id.uuid)
        with self.lock:
            fb = [d for u, d in self.feedback if u == uuid]
        return {'accepted': handle.accepted, 'status': r.status, 'response': plain(r.result),
                'feedback': fb}

    def on_det(self, m):
        with self.lock:
            self.detections.append(m)

    def on_ann(self, m):
        with self.lock:
            self.annotated.append(m)

    def wait_annotated_subscribed(self):
        # The node renders only while vlm/annotated has a subscriber: wait until it sees us.
        end = time.monotonic() + 10
        while time.monotonic() < end:
            if self.p.node.count_publishers('/vlm/annotated') > 0:
                break
            time.sleep(0.05)
        time.sleep(0.5)

    def detect(self, **fields):
        req = Detect.Request()
        for k, v in fields.items():
            setattr(req, k, v)
        n_det = len(self.detections)
        n_ann = len(self.annotated)
        fut = self.client.call_async(req)
        while not fut.done() and time.monotonic() < self.p.deadline:
            time.sleep(0.01)
        check(fut.done(), f'no response for {req.request_id}')
        r = fut.result()
        out = {'response': plain(r)}
        # The topics are published before the response is sent.
        end = time.monotonic() + 5
        while time.monotonic() < end:
            with self.lock:
                if len(self.detections) > n_det and len(self.annotated) > n_ann:
                    break
            time.sleep(0.02)
        with self.lock:
            if len(self.detections) > n_det:
                out['topic'] = plain(self.detections[n_det])
            if len(self.annotated) > n_ann:
                a = self.annotated[n_ann]
                out['annotated'] = {
                    'header': plain(a.header), 'width': a.width, 'height': a.height,
                    'encoding': a.encoding, 'step': a.step,
                }
                out['annotated_rgb'] = np.frombuffer(bytes(a.data), np.uint8).reshape(
                    a.height, a.width, 3)
        return out


def edge_pixels(rep, source):
    """At the first box's left edge (its middle row): the annotated pixel and the source's."""
    ann = rep.pop('annotated_rgb', None)
    dets = rep['response']['detections']['detections']
    if ann is None or not dets:
        return
    b = dets[0]['bbox']
    if b['size_y'] < 60:
        return  # its middle row may be under the label's tag
    x = int(np.floor(b['center']['position']['x'] - b['size_x'] / 2))
    y = int(b['center']['position']['y'])
    x, y = min(max(x, 0), W - 1), min(max(y, 0), H - 1)
    rep['edge'] = {'x': x, 'y': y, 'drawn': ann[y, x].tolist(), 'source': source[y, x].tolist()}


def four_ways(d, p, rgb, query, rep):
    """The frame as a request image and on the raw, compressed and NV12 cameras."""
    # A request image: the reference frame exactly.
    req_img = with_header(rgb8(rgb), 'req_frame', 11, 22)
    r = d.detect(request_id='d-request', images=[req_img], **query)
    edge_pixels(r, rgb)
    rep['request'] = r

    # Raw camera.
    raw = with_header(rgb8(rgb), 'raw_frame', 0, 0)
    sent = p.publish_frames('/cam', raw)
    r = d.detect(request_id='d-raw', camera='/cam', **query)
    r['sent'] = sent
    edge_pixels(r, rgb)
    rep['raw'] = r

    # Compressed camera (jpeg): the reference is the node's decode, close to the source.
    ok, jpg = cv2.imencode('.jpg', cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR),
                           [cv2.IMWRITE_JPEG_QUALITY, 95])
    check(ok, 'jpeg encode')
    cmsg = CompressedImage()
    cmsg.format = 'jpeg'
    cmsg.data = jpg.tobytes()
    cmsg.header.frame_id = 'cmp_frame'
    sent = p.publish_frames('/cam_compressed', cmsg, kind=CompressedImage)
    r = d.detect(request_id='d-compressed', camera='/cam_compressed', **query)
    r['sent'] = sent
    r.pop('annotated_rgb', None)
    rep['compressed'] = r

    # NV12 camera.
    nmsg, _ref = nv12(rgb, step=W, rows=H)
    nmsg.header.frame_id = 'nv12_frame'
    sent = p.publish_frames('/cam_nv12', nmsg)
    r = d.detect(request_id='d-nv12', camera='/cam_nv12', **query)
    r['sent'] = sent
    r.pop('annotated_rgb', None)
    rep['nv12'] = r
    return req_img


def text_so_far(p, rid):
    with p.lock:
        ts = sorted(p.tokens.get(rid, []), key=lambda t: t.index)
    return ''.join(t.text for t in ts if not t.reasoning)


def wait_text(p, rid, pred, what):
    """Waits until the answer's Tokens so far (on /vlm/tokens) satisfy `pred`."""
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if pred(text_so_far(p, rid)):
            return
        time.sleep(0.002)
    check(False, f'{rid}: {what} never came; text {text_so_far(p, rid)!r}')


def first_token(text):
    return len(text) > 0


def first_object(text):
    # The held answer's labels and numbers hold no brace: its first "}" closes an object.
    return '}' in text


def published(d, frame_id, wait=1.5):
    """The vlm/detections messages about the frame `frame_id`, after `wait` s (the topic is
    published before the response, but DDS does not order the two)."""
    time.sleep(wait)
    with d.lock:
        return [plain(m) for m in d.detections if m.header.frame_id == frame_id]


def cancel_by_id(d, rid):
    return plain(d.wait(d.p.cancel_client.call_async(Cancel.Request(request_id=rid)),
                        f'/vlm/cancel response for {rid}'))


def detect_cancelled(p, d, rgb, rid, when, **query):
    """A /detect request stopped by /vlm/cancel(request_id) once `when` holds for its text."""
    frame_id = rid + '_frame'
    req = Detect.Request(request_id=rid, images=[with_header(rgb8(rgb), frame_id, 5, 6)],
                         **query)
    fut = d.client.call_async(req)
    wait_text(p, rid, when, 'the point to cancel at')
    cancelled_at = text_so_far(p, rid)
    cancel = cancel_by_id(d, rid)
    r = d.wait(fut, f'/detect response for {rid}')
    return {'cancel': cancel, 'cancelled_at': cancelled_at, 'response': plain(r),
            'topic': published(d, frame_id)}


def goal_cancelled_by_id(p, d, rgb, rid, when, **query):
    """A vlm/detect goal stopped by /vlm/cancel(request_id) once `when` holds for its text."""
    frame_id = rid + '_frame'
    g = DetectAction.Goal(request_id=rid, images=[with_header(rgb8(rgb), frame_id, 7, 8)],
                          **query)
    handle = d.wait(d.action.send_goal_async(g), f'goal response for {rid}')
    wait_text(p, rid, when, 'the point to cancel at')
    cancelled_at = text_so_far(p, rid)
    cancel = cancel_by_id(d, rid)
    r = d.wait(handle.get_result_async(), f'result of {rid}')
    topic = published(d, frame_id)
    uuid = bytes(handle.goal_id.uuid)
    with d.lock:
        fb = [f for u, f in d.feedback if u == uuid]
    return {'cancel': cancel, 'cancelled_at': cancelled_at, 'status': r.status,
            'response': plain(r.result), 'feedback': fb, 'topic': topic}


def run_cancels(p, d, rgb):
    """Detects stopped by /vlm/cancel (their request id) while they run, before and after the
    held answer's first object closed; and detects whose budget is above the node's
    max_request_new_tokens."""
    query = dict(query='cups and boxes', max_objects=2)
    rep = {
        'service_early': detect_cancelled(p, d, rgb, 'dc-early', first_token, **query),
        'service_late': detect_cancelled(p, d, rgb, 'dc-late', first_object, **query),
    }
    d.action_ready()
    rep['goal_early'] = goal_cancelled_by_id(p, d, rgb, 'gc-early', first_token, **query)
    rep['goal_late'] = goal_cancelled_by_id(p, d, rgb, 'gc-late', first_object, **query)
    img = [with_header(rgb8(rgb), 'budget_frame', 3, 4)]
    for case, n in [('budget_three', 3), ('budget_default', 0)]:
        r = d.detect(request_id=f'db-{n}', query='cups', max_objects=n, images=img)
        r.pop('annotated_rgb', None)
        r['topic'] = published(d, 'budget_frame', wait=0.5)
        rep[case] = r
    h = d.wait(d.action.send_goal_async(DetectAction.Goal(
        request_id='gb-3', query='cups', max_objects=3, images=img)), 'goal response for gb-3')
    r = d.wait(h.get_result_async(), 'result of gb-3')
    rep['budget_goal'] = {'status': r.status, 'response': plain(r.result)}
    return rep


def run(p, a):
    p.wait_ask()
    d = Detector(p)
    check(d.client.wait_for_service(timeout_sec=p.left()), 'no /detect service')
    d.wait_annotated_subscribed()
    rgb = frame()
    rep = {'width': W, 'height': H}
    query = dict(query='boxes and blocks', max_objects=a.max_objects)
    if a.cancels:
        return run_cancels(p, d, rgb)
    req_img = four_ways(d, p, rgb, query, rep)
    if a.held:
        return rep

    # The action: feedback grows an object at a time; the result is the service's.
    r = d.goal(request_id='g-request', images=[req_img], **query)
    r.pop('annotated_rgb', None)
    rep['goal'] = r
    # The demo model's window (1024) holds the answer of 10 objects after the prompt, not 16.
    rep['goal_cancelled'] = d.goal_cancelled(request_id='g-cancel', images=[req_img],
                                             query='everything', max_objects=10)
    rep['goal_overflow'] = d.goal(request_id='g-overflow', images=[req_img],
                                  query='everything', max_objects=16)
    rep['goal_refused'] = d.goal(request_id='g-empty', query='', images=[req_img])

    # Points, and the refusals a detect has of its own.
    r = d.detect(request_id='d-points', images=[req_img], points=True, **query)
    r.pop('annotated_rgb', None)
    rep['points'] = r
    rep['empty_query'] = d.detect(request_id='d-empty', query=' ', images=[req_img])
    rep['empty_query'].pop('annotated_rgb', None)
    r = d.detect(request_id='d-timeout', images=[req_img], timeout_s=0.001, **query)
    r.pop('annotated_rgb', None)
    rep['timeout'] = r
    rep['no_camera'] = d.detect(request_id='d-none', query='cups', camera='none')
    rep['no_camera'].pop('annotated_rgb', None)
    return rep


def main():
    ap = peer_arguments()
    ap.add_argument('--max-objects', type=int, default=3)
    ap.add_argument('--held', action='store_true',
                    help='the node holds every answer to one value: only the four frames')
    ap.add_argument('--cancels', action='store_true',
                    help='a held answer on a slow BPU: detects cancelled by request id, and '
                         'detects over the max_request_new_tokens budget')
    ap.add_argument('--timeout', type=float, default=280.0)
    a = ap.parse_args()
    import rclpy
    rclpy.init()
    p = Peer(a)
    report_and_exit(lambda: run(p, a))


if __name__ == '__main__':
    main()
