"""Asks a running vlm_node a question and prints the answer as it streams on /vlm/tokens.

    .ros2/venv/bin/python tools/vlm-ask.py "What is in the picture?" \
        [--image tools/fixtures/images/scene_a.png --camera-topic /image_raw] \
        [--camera none] [--session ID] [--temperature 0] [--max-new-tokens 64] \
        [--json-schema tools/bench/schemas/gate.json] [--namespace /r2]

    .ros2/venv/bin/python tools/vlm-ask.py --watch "Is the door open?" [--until '"yes"'] \
        [--min-interval 1] [--max-interval 0] [--watch-timeout 0] [--json-schema FILE]

With --image the picture is first published on --camera-topic (as a camera would, bgr8),
so the node answers about it. With --watch the question is a standing one (the vlm/watch
action): each evaluation is printed as it comes, marked when its answer changed, until
--until is answered, --watch-timeout passes or Ctrl-C cancels it. Stands in for `ros2 service call /ask ...` plus
`ros2 topic echo /vlm/tokens` (the ros2 CLI is not on PyPI). Exit status 0 when the
answer completed, 1 otherwise.
"""

import argparse
import sys
import time

import rclpy
from rclpy.qos import qos_profile_sensor_data

from bpu_vlm_client import VlmClient
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


def publish_image(node, path, topic):
    """Publishes `path` a few times on `topic` while discovery settles, as a camera does."""
    pub = node.create_publisher(Image, topic, qos_profile_sensor_data)
    msg = image_msg(path)
    for _ in range(10):
        msg.header.stamp = node.get_clock().now().to_msg()
        pub.publish(msg)
        time.sleep(0.1)
    print(f'[ask] published {path} on {topic}', flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument('prompt', nargs='?', default='')
    p.add_argument('--watch', metavar='QUESTION', help='watch this question (vlm/watch)')
    p.add_argument('--until', default='', help='with --watch: a JSON value that ends the watch')
    p.add_argument('--min-interval', type=float, default=1.0)
    p.add_argument('--max-interval', type=float, default=0.0)
    p.add_argument('--watch-timeout', type=float, default=0.0)
    p.add_argument('--image', help='picture to publish on --camera-topic before asking')
    p.add_argument('--camera-topic', default='/image_raw')
    p.add_argument('--camera', default='', help='Ask.camera ("" = default, "none" = text only)')
    p.add_argument('--namespace', default='', help="the node's namespace (e.g. /r2)")
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
    vlm = VlmClient(namespace=args.namespace, timeout=args.timeout)
    print(f"[ask] waiting for {vlm.names['ask']} (the node offers it once the model is loaded) ...",
          flush=True)
    try:
        vlm.wait_for_node()
    except TimeoutError as e:
        raise SystemExit(str(e)) from None
    if args.image:
        publish_image(vlm.node, args.image, args.camera_topic)
    fields = dict(camera=args.camera, session_id=args.session, temperature=args.temperature,
                  max_new_tokens=args.max_new_tokens,
                  enable_thinking=Ask.Request.ENABLE_THINKING_ON if args.think
                  else Ask.Request.ENABLE_THINKING_DEFAULT)
    if args.json_schema:
        with open(args.json_schema, encoding='utf-8') as f:
            fields['json_schema'] = f.read()
    if args.watch:
        return watch(vlm, args, fields.get('json_schema', ''))
    if not args.prompt:
        raise SystemExit('a prompt, or --watch QUESTION')
    try:
        stream = vlm.stream(args.prompt, reasoning=True, **fields)
        print(f"[ask] {vlm.names['ask']} {{prompt: {args.prompt!r}}} -> streaming "
              f"{vlm.names['tokens']}:", flush=True)
        for delta in stream:
            sys.stdout.write(delta)
            sys.stdout.flush()
    except TimeoutError as e:
        raise SystemExit(str(e)) from None
    print()
    r = stream.response
    print(f'[ask] success={r.success} finish_reason={r.finish_reason!r} '
          f'error_code={r.error_code!r} {r.error_message}')
    print(f'[ask] image_source={r.image_source!r} image={r.image_width}x{r.image_height} '
          f'prompt_tokens={r.prompt_tokens} '
          f'completion_tokens={r.completion_tokens} ttft={r.ttft_s:.3f}s '
          f'decode={r.decode_tokens_per_s:.1f} tok/s')
    if args.session:
        # 1 on a later ask means the node had dropped the session: it started afresh.
        print(f'[ask] session_turn={r.session_turn}')
    vlm.close()
    rclpy.try_shutdown()
    return 0 if r.success else 1


def watch(vlm, args, schema):
    """Runs one watch to its end; exit status 0 when --until was answered."""
    def on_feedback(f):
        if f.camera_silent:
            print('[watch] the camera is silent; waiting for frames', flush=True)
            return
        mark = 'CHANGED' if f.changed else 'same'
        print(f'[watch] #{f.evaluation} {f.answer} ({mark}; frame '
              f'{f.image_header.stamp.sec}.{f.image_header.stamp.nanosec:09d}, '
              f'ttft {f.ttft_s:.3f}s, {f.evaluation_s:.3f}s)', flush=True)

    w = vlm.watch(args.watch, on_feedback=on_feedback, camera=args.camera,
                  json_schema=schema, until=args.until, min_interval_s=args.min_interval,
                  max_interval_s=args.max_interval, timeout_s=args.watch_timeout)
    print(f"[watch] {vlm.names['watch']} {{question: {args.watch!r}}} accepted", flush=True)
    try:
        r = w.result()
    except KeyboardInterrupt:
        w.cancel()
        r = w.result(timeout=args.timeout)
    print(f'[watch] success={r.success} error_code={r.error_code!r} {r.error_message} '
          f'evaluations={r.evaluations} answer={r.answer}')
    vlm.close()
    rclpy.try_shutdown()
    return 0 if r.success else 1


if __name__ == '__main__':
    sys.exit(main())
