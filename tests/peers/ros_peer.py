"""rclpy peer for the root integration tests (run with .ros2/venv/bin/python).

Prints one JSON report line prefixed with "REPORT " on stdout and exits 0 only when every
check passed (failures raise, exit 1, message on stderr):

  roundtrip  --ask S --cancel S --tokens T --timeout SECONDS
      Against the Rust test node: sends an Ask with IDL defaults and one with explicit
      values, checks the node's echo of each request, collects every Token of each
      request until its `last` one, calls Cancel twice. The report holds every Token
      received and every response, so the Rust side checks them against what it sent.
"""

import argparse
import array
import json
import sys
import time

import rclpy
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image

from bpu_vlm_msgs.msg import Token
from bpu_vlm_msgs.srv import Ask, Cancel


def to_plain(value):
    """A ROS message (or field value) as JSON-ready Python data, field names as in the IDL."""
    if hasattr(value, 'get_fields_and_field_types'):
        return {name: to_plain(getattr(value, name)) for name in value.get_fields_and_field_types()}
    if isinstance(value, (bytes, bytearray, array.array)):
        return list(value)
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if hasattr(value, 'tolist'):  # numpy arrays of fixed-size fields
        return value.tolist()
    return value


def check(condition, what):
    if not condition:
        raise AssertionError(what)


class Peer:
    def __init__(self, args):
        self.args = args
        self.deadline = time.monotonic() + args.timeout
        self.node = rclpy.create_node('bpu_vlm_test_peer')
        self.tokens = []
        qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=4096,
                         reliability=ReliabilityPolicy.RELIABLE)
        self.node.create_subscription(Token, args.tokens, self.tokens.append, qos)
        self.ask = self.node.create_client(Ask, args.ask)
        self.cancel = self.node.create_client(Cancel, args.cancel)

    def remaining(self, what):
        left = self.deadline - time.monotonic()
        check(left > 0, f'timed out waiting for {what}')
        return left

    def spin_until(self, predicate, what, limit=None):
        end = time.monotonic() + (limit if limit is not None else self.remaining(what))
        while not predicate():
            if time.monotonic() > min(end, self.deadline):
                raise AssertionError(f'timed out waiting for {what}')
            rclpy.spin_once(self.node, timeout_sec=0.05)

    def wait_for_services(self):
        for client, name in ((self.ask, self.args.ask), (self.cancel, self.args.cancel)):
            check(client.wait_for_service(timeout_sec=self.remaining(name)), f'service {name} not found')

    def call(self, client, request, what):
        future = client.call_async(request)
        self.spin_until(future.done, what)
        check(future.exception() is None, f'{what} raised {future.exception()!r}')
        return future.result()

    def tokens_of(self, request_id):
        return [t for t in self.tokens if t.request_id == request_id]

    def close(self):
        self.node.destroy_node()


SENTINELS = {
    'camera': '',
    'max_image_age_s': -1.0,
    'images': [],
    'compressed_images': [],
    'session_id': '',
    'system_prompt': '',
    'tools_json': '',
    'temperature': -1.0,
    'top_p': -1.0,
    'min_p': -1.0,
    'top_k': -1,
    'repetition_penalty': -1.0,
    'presence_penalty': -1.0,
    'seed': -1,
    'enable_thinking': -1,
    'max_new_tokens': 0,
    'stop': [],
    'use_default_stop': True,
    'timeout_s': -1.0,
}


def explicit_request():
    image = Image(height=2, width=3, encoding='rgb8', is_bigendian=0, step=9,
                  data=bytes(range(18)))
    image.header.frame_id = 'cam_ü'
    image.header.stamp.sec = 12
    image.header.stamp.nanosec = 345
    compressed = CompressedImage(format='jpeg', data=bytes([0xFF, 0xD8, 0xFF, 0xD9]))
    return Ask.Request(
        request_id='req-explicit-ж', prompt='描述一下 🤖 the scene, s\'il vous plaît',
        camera='none', max_image_age_s=0.0, images=[image], compressed_images=[compressed],
        session_id='session-1', system_prompt='You are a robot. 你是机器人。',
        tools_json='[{"type": "function", "function": {"name": "look"}}]',
        temperature=0.5, top_p=0.25, min_p=0.125, top_k=7, repetition_penalty=1.5,
        presence_penalty=0.75, seed=2**40 + 3, enable_thinking=Ask.Request.ENABLE_THINKING_ON,
        max_new_tokens=4096, stop=['</s>', '停'], use_default_stop=False, timeout_s=2.5)


def roundtrip(args):
    peer = Peer(args)
    report = {'tokens': [], 'responses': []}
    try:
        peer.wait_for_services()
        peer.spin_until(lambda: peer.node.count_publishers(args.tokens) > 0, f'a publisher on {args.tokens}')

        # The generated Python defaults are the documented sentinels.
        fresh = to_plain(Ask.Request())
        for field, value in SENTINELS.items():
            check(fresh[field] == value, f'Python default of {field} is {fresh[field]!r}, want {value!r}')
        check(Ask.Request.ENABLE_THINKING_DEFAULT == -1 and Ask.Request.ENABLE_THINKING_OFF == 0
              and Ask.Request.ENABLE_THINKING_ON == 1, 'enable_thinking constants')
        check(Token.FINISH_STOP == 'stop' and Token.FINISH_CANCELLED == 'cancelled', 'Token constants')
        check(Ask.Response.ERROR_NOT_READY == 'not_ready', 'Ask error constants')

        requests = [Ask.Request(request_id='req-defaults', prompt='what is on the table?'),
                    explicit_request()]
        for request in requests:
            response = peer.call(peer.ask, request, f'/ask {request.request_id}')
            report['responses'].append(to_plain(response))
            echoed = json.loads(response.answer)
            sent = to_plain(request)
            for field, value in sent.items():
                check(echoed.get(field) == value,
                      f'{request.request_id}: node received {field}={echoed.get(field)!r}, sent {value!r}')
            check(response.request_id == request.request_id, 'response request_id')
            # DDS does not order the service response and the topic: wait for the last Token.
            peer.spin_until(lambda rid=request.request_id: any(t.last for t in peer.tokens_of(rid)),
                            f'the last Token of {request.request_id}')

        for rid, expected in (('req-explicit-ж', True), ('no-such-request', False)):
            response = peer.call(peer.cancel, Cancel.Request(request_id=rid), f'/cancel {rid}')
            report['responses'].append(to_plain(response))
            check(response.success is expected, f'cancel {rid}: success={response.success}')
        # Anything still in flight (there should be nothing) is included for the Rust side.
        end = time.monotonic() + 0.2
        while time.monotonic() < end:
            rclpy.spin_once(peer.node, timeout_sec=0.05)
        report['tokens'] = [to_plain(t) for t in peer.tokens]
    finally:
        print('REPORT ' + json.dumps(report, ensure_ascii=False), flush=True)
        peer.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('mode', choices=['roundtrip'])
    parser.add_argument('--ask', required=True)
    parser.add_argument('--cancel', required=True)
    parser.add_argument('--tokens', required=True)
    parser.add_argument('--answers', default='/vlm/answers')
    parser.add_argument('--timeout', type=float, default=30.0)
    args = parser.parse_args()
    rclpy.init()
    try:
        roundtrip(args)
    finally:
        rclpy.try_shutdown()
    print('PEER OK', flush=True)


if __name__ == '__main__':
    sys.exit(main())
