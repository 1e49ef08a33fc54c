"""rclpy peer of tools/board-acceptance.sh (node section): publishes one camera frame like a
camera, asks /ask about it, and reports the streamed tokens, the response and the Answer.

Uses the shared Peer of tests/peers/node_peer.py (needs rclpy, the bpu_vlm_msgs Python
bindings, OpenCV and numpy). Prints "REPORT <json>" and exits 0 when every check passed;
otherwise prints the failure on stderr and exits 1.

    python3 tools/board_node_peer.py --ns /board_acceptance --photo PNG [--timeout S]
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'tests', 'peers'))

import cv2  # noqa: E402
import rclpy  # noqa: E402

import node_peer  # noqa: E402
from node_peer import check, rgb8, with_header  # noqa: E402


def run(p, a):
    p.wait_ask()
    bgr = cv2.imread(a.photo, cv2.IMREAD_COLOR)
    check(bgr is not None, f'cannot read {a.photo}')
    rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    height, width = rgb.shape[:2]
    sent = p.publish_frames(a.camera, with_header(rgb8(rgb), 'board_acceptance_camera', 0, 0))
    r = p.greedy('board-acceptance-1', a.prompt)
    resp, tokens, answer = r['response'], r['tokens'], r['answer']
    check(resp['success'], f"the ask failed: {resp['error_code']}: {resp['error_message']}")
    check(tokens, 'no Token was streamed')
    for i, t in enumerate(tokens):
        check(t['index'] == i, f'Token index gap at {i}')
        check(t['last'] == (i + 1 == len(tokens)), f'last flag wrong at Token {i}')
    check(''.join(t['text'] for t in tokens if not t['reasoning']) == resp['answer'],
          'the streamed tokens do not add up to the answer')
    check(answer is not None, 'no Answer on the answers topic')
    check(answer['answer'] == resp['answer'], 'the Answer message differs from the response')
    check(resp['image_source'] == a.camera,
          f"the answer used {resp['image_source']!r}, not the camera {a.camera!r}")
    check((resp['image_width'], resp['image_height']) == (width, height),
          f"the answer's image is {resp['image_width']}x{resp['image_height']}, "
          f'the frame {width}x{height}')
    return {
        'frames_sent': len(sent),
        'frame': {'width': width, 'height': height, 'encoding': 'rgb8'},
        'tokens_streamed': len(tokens),
        'answer': resp['answer'],
        'finish_reason': resp['finish_reason'],
        'image_source': resp['image_source'],
        'prompt_tokens': resp['prompt_tokens'],
        'completion_tokens': resp['completion_tokens'],
        'ttft_s': resp['ttft_s'],
        'decode_tokens_per_s': resp['decode_tokens_per_s'],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--ns', default='/board_acceptance')
    ap.add_argument('--photo', required=True)
    ap.add_argument('--prompt', default='What is in this picture? Answer in one sentence.')
    ap.add_argument('--max-new-tokens', type=int, default=16)
    ap.add_argument('--timeout', type=float, default=240.0)
    a = ap.parse_args()
    ns = a.ns.rstrip('/')
    # The names node_peer.Peer reads, in the node's namespace.
    a.ask, a.cancel = f'{ns}/ask', f'{ns}/vlm/cancel'
    a.tokens, a.answers = f'{ns}/vlm/tokens', f'{ns}/vlm/answers'
    a.status_name = f'{ns}/vlm_node: engine'
    a.camera = f'{ns}/image_raw'
    rclpy.init()
    p = node_peer.Peer(a)
    node_peer.report_and_exit(lambda: run(p, a))


if __name__ == '__main__':
    main()
