"""Asks a running vlm_node a question and prints the answer as it streams on /vlm/tokens.

    .ros2/venv/bin/python tools/vlm-ask.py "What is in the picture?" \
        [--image tools/fixtures/images/scene_a.png --camera-topic /image_raw] \
        [--camera none] [--session ID] [--temperature 0] [--max-new-tokens 64] \
        [--json-schema tools/bench/schemas/gate.json]

With --image the picture is first published on --camera-topic (as a camera would, bgr8),
so the node answers about it. Stands in for `ros2 service call /ask ...` plus
`ros2 topic echo /vlm/tokens` (the ros2 CLI is not on PyPI). Exit status 0 when the
answer completed, 1 otherwise.
"""

import argparse
import sys
import time

import rclpy
from rclpy.qos import QoSProfile, ReliabilityPolicy, HistoryPolicy, qos_profile_sensor_data

from bpu_vlm_msgs.msg import Token
from bpu_vlm_msgs.srv import Ask
from sensor_msgs.msg import Image


def image_msg(path):
    import cv2  # opencv-python-headless, installed by tools/ros2-bootstrap.sh
    bgr = cv2.imread(path, cv2.IMREAD_COLOR)
    if bgr is None:
        raise SystemExit(f'cannot read image {path}')
    msg = Image()
    msg.height, msg.width = bgr.shape[:2]
    msg.encoding = 'bgr8'
    msg.step = msg.width * 3
    msg.data = bgr.tobytes()
    msg.header.frame_id = 'camera'
    return msg


def main():
    p = argparse.ArgumentParser()
    p.add_argument('prompt')
    p.add_argument('--image', help='picture to publish on --camera-topic before asking')
    p.add_argument('--camera-topic', default='/image_raw')
    p.add_argument('--camera', default='', help='Ask.camera ("" = default, "none" = text only)')
    p.add_argument('--session', default='',
                   help='Ask.session_id: continue this conversation. A secret: whoever names it '
                        'reads and extends the conversation, so use a random one '
                        '(python3 -c "import uuid; print(uuid.uuid4().hex)")')
    p.add_argument('--temperature', type=float, default=-1.0)
    p.add_argument('--max-new-tokens', type=int, default=0)
    p.add_argument('--think', action='store_true')
    p.add_argument('--json-schema', metavar='FILE',
                   help='JSON Schema file: the answer is a JSON value valid under it (Ask.json_schema)')
    p.add_argument('--timeout', type=float, default=120.0)
    args = p.parse_args()

    rclpy.init()
    node = rclpy.create_node('vlm_ask')
    deadline = time.monotonic() + args.timeout
    client = node.create_client(Ask, '/ask')
    print('[ask] waiting for /ask (the node offers it once the model is loaded) ...', flush=True)
    if not client.wait_for_service(timeout_sec=args.timeout):
        raise SystemExit('/ask not offered within the timeout')

    tokens_qos = QoSProfile(depth=4096, reliability=ReliabilityPolicy.RELIABLE,
                            history=HistoryPolicy.KEEP_LAST)
    state = {'id': None, 'last': None, 'pending': []}

    def on_token(t):
        if state['id'] is None:
            state['pending'].append(t)
            return
        if t.request_id != state['id']:
            return
        if t.text:
            sys.stdout.write(t.text)
            sys.stdout.flush()
        if t.last:
            state['last'] = t

    node.create_subscription(Token, '/vlm/tokens', on_token, tokens_qos)
    if args.image:
        pub = node.create_publisher(Image, args.camera_topic, qos_profile_sensor_data)
        msg = image_msg(args.image)
        # Publish a few times while discovery settles, as a camera streams frames.
        for _ in range(10):
            msg.header.stamp = node.get_clock().now().to_msg()
            pub.publish(msg)
            rclpy.spin_once(node, timeout_sec=0.1)
        print(f'[ask] published {args.image} on {args.camera_topic}', flush=True)
    time.sleep(0.3)

    req = Ask.Request(prompt=args.prompt, camera=args.camera, session_id=args.session,
                      temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                      enable_thinking=Ask.Request.ENABLE_THINKING_ON if args.think else Ask.Request.ENABLE_THINKING_DEFAULT)
    if args.json_schema:
        with open(args.json_schema, encoding='utf-8') as f:
            req.json_schema = f.read()
    req.request_id = f'vlm-ask-{int(time.time() * 1000)}'
    state['id'] = req.request_id
    for t in state['pending']:
        on_token(t)
    print(f'[ask] /ask {{prompt: {args.prompt!r}}} -> streaming /vlm/tokens:', flush=True)
    future = client.call_async(req)
    while (not future.done() or state['last'] is None) and time.monotonic() < deadline:
        rclpy.spin_once(node, timeout_sec=0.05)
    print()
    if not future.done():
        raise SystemExit('/ask did not respond within the timeout')
    r = future.result()
    print(f'[ask] success={r.success} finish_reason={r.finish_reason!r} '
          f'error_code={r.error_code!r} {r.error_message}')
    print(f'[ask] image_source={r.image_source!r} image={r.image_width}x{r.image_height} '
          f'prompt_tokens={r.prompt_tokens} '
          f'completion_tokens={r.completion_tokens} ttft={r.ttft_s:.3f}s '
          f'decode={r.decode_tokens_per_s:.1f} tok/s')
    if args.session:
        # 1 on a later ask means the node had dropped the session: it started afresh.
        print(f'[ask] session_turn={r.session_turn}')
    node.destroy_node()
    rclpy.shutdown()
    return 0 if r.success else 1


if __name__ == '__main__':
    sys.exit(main())
