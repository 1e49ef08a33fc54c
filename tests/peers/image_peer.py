"""rclpy peer for tests/node_images.rs: request images that would exhaust the node's memory
when decoded (issue 23, decode bombs) are refused from their headers, at once; images at the
limits are served.

Run with .ros2/venv/bin/python. Prints one JSON line prefixed "REPORT " and then "PEER OK",
like node_peer.py (whose Peer it uses).

  bombs   a text ask (prints "READY" after it), then four 8192x8192 zero RGBA pngs, then four
          4096x4096 zero RGBA16 pngs (each within max_image_pixels, together twice the
          decoded-bytes budget), each ask timed; then a text ask that must still succeed
  limit   a text ask (prints "READY" after it), then four 4096x4096 zero RGBA pngs: exactly
          the default budget of decoded bytes, asked with --limit-timeout, then again with
          --deadline-timeout (shorter than decoding them takes)
"""

import os
import struct
import sys
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rclpy  # noqa: E402
from sensor_msgs.msg import CompressedImage  # noqa: E402

from node_peer import Peer, peer_arguments, report_and_exit  # noqa: E402


def chunk(kind, body):
    return (struct.pack('>I', len(body)) + kind + body
            + struct.pack('>I', zlib.crc32(kind + body) & 0xFFFFFFFF))


def zero_png(side, color_type, depth):
    """An all-zero png, compressed row by row: a few KB however large its header says it is.
    color_type 6 = RGBA; depth 8 or 16."""
    channels = {0: 1, 2: 3, 6: 4}[color_type]
    row = bytes(1 + side * channels * depth // 8)  # filter byte 0, then zero samples
    z = zlib.compressobj(9)
    body = b''.join(z.compress(row) for _ in range(side)) + z.flush()
    ihdr = struct.pack('>IIBBBBB', side, side, depth, color_type, 0, 0, 0)
    return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', ihdr) + chunk(b'IDAT', body)
            + chunk(b'IEND', b''))


def compressed(data):
    msg = CompressedImage()
    msg.format = 'png'
    msg.header.frame_id = 'req'
    msg.data = data
    return msg


def timed_ask(p, a, rid, images, **extra):
    start = time.monotonic()
    req, fut = p.ask_async(request_id=rid, prompt=a.prompt, temperature=0.0,
                           max_new_tokens=a.max_new_tokens, compressed_images=images, **extra)
    rep = p.finish(req, fut)
    rep['elapsed_s'] = time.monotonic() - start
    rep['png_bytes'] = len(images[0].data) if images else 0
    return rep


def ready(p, a):
    p.wait_ask()
    first = p.greedy('text-0', a.prompt, camera='none')
    # The test reads the node's memory now, then the big asks go out.
    print('READY', flush=True)
    time.sleep(1.0)
    return first


def mode_bombs(p, a):
    first = ready(p, a)
    huge = compressed(zero_png(8192, 6, 8))
    pixels = timed_ask(p, a, 'huge', [huge] * 4)
    deep = compressed(zero_png(4096, 6, 16))
    budget = timed_ask(p, a, 'deep', [deep] * 4)
    after = p.greedy('text-1', a.prompt, camera='none')
    return {'first': first, 'pixels': pixels, 'budget': budget, 'after': after}


def mode_limit(p, a):
    first = ready(p, a)
    at = compressed(zero_png(4096, 6, 8))
    limit = timed_ask(p, a, 'limit', [at] * 4, timeout_s=a.limit_timeout)
    # The same images with a time limit shorter than decoding them all takes.
    deadline = timed_ask(p, a, 'deadline', [at] * 4, timeout_s=a.deadline_timeout)
    after = p.greedy('text-1', a.prompt, camera='none')
    return {'first': first, 'limit': limit, 'deadline': deadline, 'after': after}


def main():
    ap = peer_arguments()
    ap.add_argument('mode', choices=['bombs', 'limit'])
    ap.add_argument('--prompt', default='What is in the picture?')
    ap.add_argument('--max-new-tokens', type=int, default=4)
    ap.add_argument('--limit-timeout', type=float, default=60.0)
    ap.add_argument('--deadline-timeout', type=float, default=0.4)
    ap.add_argument('--timeout', type=float, default=240.0)
    a = ap.parse_args()
    rclpy.init()
    p = Peer(a)
    report_and_exit(lambda: {'bombs': mode_bombs, 'limit': mode_limit}[a.mode](p, a))


if __name__ == '__main__':
    main()
