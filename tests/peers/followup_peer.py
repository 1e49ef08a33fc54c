"""rclpy peer for tests/node_followups.rs: session follow-ups about a frame the conversation
already holds.

Run with .ros2/venv/bin/python. Prints one JSON line prefixed "REPORT " and then "PEER OK",
like node_peer.py (whose Peer it uses). Every ask is greedy; after each one the diagnostics
update that counts it (requests_served) gives images_encoded from the same update.

  a-1  session a, camera (scene_a)             the frame goes in
  a-2  session a, camera, no new frame         the same frame: only the question
  b-1  session b, camera (scene_a)             the same history as session a ...
  b-2  session b, camera none                  ... then the follow-up without any image
  a-3  session a, camera after new frames (scene_b): the new frame goes in
  r-1  session r, request image scene_c (rgb8, header req_1 1.0)
  r-2  session r, the same pixels as PNG (header req_2 2.0): not added again
  r-3  session r, request image scene_a: new pixels, added
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cv2  # noqa: E402
import rclpy  # noqa: E402
from sensor_msgs.msg import CompressedImage  # noqa: E402

from node_peer import (Peer, check, load_rgb, peer_arguments, report_and_exit, rgb8,  # noqa: E402
                       with_header)
from session_peer import diag_with_served  # noqa: E402


def run(p, a):
    p.wait_ask()
    rep = {'asks': {}}
    served = 0

    def ask(rid, prompt, **extra):
        nonlocal served
        fields = dict(request_id=rid, prompt=prompt, temperature=0.0, top_p=1.0, top_k=0,
                      presence_penalty=0.0, max_new_tokens=a.max_new_tokens)
        fields.update(extra)
        r = p.ask(**fields)
        served += 1
        d = diag_with_served(p, served)
        r['images_encoded'] = int(d.get('images_encoded', '-1'))
        rep['asks'][rid] = r

    rep['base_images_encoded'] = int(diag_with_served(p, 0).get('images_encoded', '-1'))
    frame = with_header(rgb8(load_rgb('scene_a.png')), 'cam_a', 0, 0)
    rep['sent_a'] = p.publish_frames(a.camera, frame)
    ask('a-1', a.prompt, session_id='a')
    ask('a-2', a.prompt2, session_id='a')
    ask('b-1', a.prompt, session_id='b')
    ask('b-2', a.prompt2, session_id='b', camera='none')
    frame = with_header(rgb8(load_rgb('scene_b.png')), 'cam_b', 0, 0)
    rep['sent_b'] = p.publish_frames(a.camera, frame)
    ask('a-3', a.prompt2, session_id='a')

    scene_c = load_rgb('scene_c.png')
    ask('r-1', a.prompt, session_id='r', images=[with_header(rgb8(scene_c), 'req_1', 1, 0)])
    ok, png = cv2.imencode('.png', cv2.cvtColor(scene_c, cv2.COLOR_RGB2BGR))
    check(ok, 'png encode')
    c = CompressedImage()
    c.format = 'png'
    c.data = png.tobytes()
    ask('r-2', a.prompt2, session_id='r', compressed_images=[with_header(c, 'req_2', 2, 0)])
    ask('r-3', a.prompt2, session_id='r',
        images=[with_header(rgb8(load_rgb('scene_a.png')), 'req_3', 3, 0)])
    return rep


def main():
    ap = peer_arguments()
    ap.add_argument('--camera', default='/cam')
    ap.add_argument('--prompt', default='What is in the picture?')
    ap.add_argument('--prompt2', default='And what colour is it?')
    ap.add_argument('--max-new-tokens', type=int, default=8)
    ap.add_argument('--timeout', type=float, default=240.0)
    a = ap.parse_args()
    rclpy.init()
    p = Peer(a)
    report_and_exit(lambda: run(p, a))


if __name__ == '__main__':
    main()
