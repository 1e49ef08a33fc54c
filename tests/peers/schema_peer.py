"""rclpy peer for tests/node_schema.rs: structured output (`json_schema`) through /ask.

Run with .ros2/venv/bin/python. Prints one JSON line prefixed "REPORT " and then "PEER OK",
like node_peer.py (whose Peer it uses). Every answer to a schema request is checked here with
an independent validator (the `jsonschema` package), and the outcome goes into the report:
`valid` is None when the answer parsed and validated, else the reason.

  free-before / free-after   the same greedy free-text ask before and after the schema asks
  rich-<seed>                the rich schema, temperature 1.0, one seed each
  gate                       {"enum": ["yes", "no"]} about a camera frame
  count                      a bounded integer about a request image (compressed: png)
  detect                     a detection list (label + box) about a raw request image
  text-gate                  the gate without an image (camera none)
  cut                        the rich schema with max_new_tokens too small: incomplete
  t-* / u-*                  two sessions mixing schemas and free text; t has a turn cut
                             short (t-cut), which is not kept
  refused                    malformed, oversized, not enforceable, with tools, with stop
  action                     the same through the Ask action: rich, cut, with stop
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cv2  # noqa: E402
import jsonschema  # noqa: E402
import rclpy  # noqa: E402
from sensor_msgs.msg import CompressedImage  # noqa: E402

from bpu_vlm_msgs.action import Ask as AskAction  # noqa: E402
from bpu_vlm_msgs.srv import Ask  # noqa: E402
from node_peer import (Peer, check, load_rgb, peer_arguments, plain, report_and_exit,  # noqa: E402
                       rgb8, with_header)
from bpu_vlm_client.action_client import ActionClient  # noqa: E402  (node_peer's path)

# Enums, bounded integers, a bounded array of bounded strings, booleans, a nested object and
# required keys; no additional properties, so every value ends within a bounded length.
RICH = {
    'type': 'object',
    'properties': {
        'verdict': {'enum': ['yes', 'no', 'unsure']},
        'count': {'type': 'integer', 'minimum': 0, 'maximum': 20},
        'labels': {'type': 'array', 'items': {'type': 'string', 'maxLength': 8},
                   'maxItems': 3},
        'visible': {'type': 'boolean'},
        'where': {
            'type': 'object',
            'properties': {
                'x': {'type': 'integer', 'minimum': 0, 'maximum': 1000},
                'y': {'type': 'integer', 'minimum': 0, 'maximum': 1000},
                'side': {'enum': ['left', 'right']},
            },
            'required': ['x', 'y'],
            'additionalProperties': False,
        },
    },
    'required': ['verdict', 'count', 'labels', 'visible', 'where'],
    'additionalProperties': False,
}
GATE = {'enum': ['yes', 'no']}
COUNT = {'type': 'integer', 'minimum': 0, 'maximum': 20}
BOX = {'type': 'array', 'items': {'type': 'integer', 'minimum': 0, 'maximum': 1000},
       'minItems': 4, 'maxItems': 4}
DETECT = {
    'type': 'object',
    'properties': {
        'objects': {
            'type': 'array',
            'maxItems': 3,
            'items': {
                'type': 'object',
                'properties': {'label': {'type': 'string', 'maxLength': 12}, 'box': BOX},
                'required': ['label', 'box'],
                'additionalProperties': False,
            },
        },
    },
    'required': ['objects'],
    'additionalProperties': False,
}
TOOLS = json.dumps([{'type': 'function', 'function': {
    'name': 'look', 'parameters': {'type': 'object', 'properties': {}}}}])


def validity(text, schema):
    """None when `text` is JSON valid under `schema`, else why not."""
    try:
        value = json.loads(text)
    except ValueError as e:
        return f'not JSON: {e}'
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as e:
        return f'invalid: {e.message}'
    return None


def wait(p, future, what):
    while not future.done() and time.monotonic() < p.deadline:
        time.sleep(0.01)
    check(future.done(), f'no {what}')
    return future.result()


def action_asks(p, a):
    """Goals of the Ask action: its result comes from the same outcome as the response."""
    client = ActionClient(p.node, AskAction, a.action)
    check(client.wait_for_server(timeout_sec=p.left()), 'no action server')
    out = {}
    for rid, schema, extra in [('act-rich', RICH, dict(seed=31)),
                               ('act-cut', RICH, dict(seed=32, max_new_tokens=a.cut_tokens)),
                               ('act-stop', GATE, dict(stop=['}']))]:
        goal = AskAction.Goal()
        fields = dict(request_id=rid, prompt=a.prompt, camera='none', temperature=1.0,
                      top_p=1.0, top_k=0, max_new_tokens=a.max_new_tokens,
                      json_schema=json.dumps(schema))
        fields.update(extra)
        for k, v in fields.items():
            setattr(goal, k, v)
        handle = wait(p, client.send_goal_async(goal), f'goal response for {rid}')
        r = plain(wait(p, handle.get_result_async(), f'result of {rid}').result)
        if r['success']:
            r['valid'] = validity(r['answer'], schema)
        out[rid] = r
    return out


def run(p, a):
    p.wait_ask()
    rep = {'asks': {}, 'schemas': {'rich': RICH, 'gate': GATE, 'count': COUNT,
                                   'detect': DETECT}}

    def ask(rid, schema=None, **extra):
        fields = dict(request_id=rid, prompt=a.prompt, camera='none', temperature=1.0,
                      top_p=1.0, top_k=0, max_new_tokens=a.max_new_tokens)
        if schema is not None:
            fields['json_schema'] = json.dumps(schema)
        fields.update(extra)
        r = p.ask(**fields)
        if schema is not None and r['response']['success']:
            r['valid'] = validity(r['response']['answer'], schema)
        rep['asks'][rid] = r
        return r

    def greedy_free(rid, **extra):
        return ask(rid, temperature=0.0, max_new_tokens=16, **extra)

    greedy_free('free-before')
    for seed in range(a.seeds):
        ask(f'rich-{seed}', RICH, seed=seed)

    frame = with_header(rgb8(load_rgb('scene_a.png')), 'cam_optical', 0, 0)
    rep['camera_size'] = [frame.width, frame.height]
    p.publish_frames(a.camera, frame)
    ask('gate', GATE, camera='', seed=11)

    scene_b = load_rgb('scene_b.png', (96, 64))
    ok, png = cv2.imencode('.png', cv2.cvtColor(scene_b, cv2.COLOR_RGB2BGR))
    check(ok, 'png encode')
    c = CompressedImage()
    c.format = 'png'
    c.data = png.tobytes()
    ask('count', COUNT, compressed_images=[with_header(c, 'req_png', 5, 0)], seed=12)
    rep['count_size'] = [96, 64]
    scene_c = load_rgb('scene_c.png', (80, 56))
    ask('detect', DETECT, images=[with_header(rgb8(scene_c), 'req_raw', 6, 0)], seed=13)
    rep['detect_size'] = [80, 56]
    ask('text-gate', GATE, seed=14)

    ask('cut', RICH, seed=15, max_new_tokens=a.cut_tokens)

    # Two sessions with the same turns, except that session t also has a turn cut short.
    for s in ('t', 'u'):
        ask(f'{s}-1', GATE, session_id=s, seed=21)
        ask(f'{s}-2', None, session_id=s, temperature=0.0, max_new_tokens=8)
        if s == 't':
            ask('t-cut', RICH, session_id=s, seed=15, max_new_tokens=a.cut_tokens)
        ask(f'{s}-3', COUNT, session_id=s, seed=23)
        ask(f'{s}-4', None, session_id=s, temperature=0.0, max_new_tokens=16)

    refused = {
        'malformed': dict(json_schema='{"type": "object", '),
        'oversized': dict(json_schema=json.dumps(
            {'description': 'x' * a.max_schema_bytes, 'type': 'integer'})),
        'unenforceable': dict(json_schema=json.dumps({'type': 'string', 'x-guidance': {}})),
        'not_a_schema': dict(json_schema='[1, 2]'),
        'with_tools': dict(json_schema=json.dumps(GATE), tools_json=TOOLS),
        'with_stop': dict(json_schema=json.dumps(GATE), stop=['}']),
    }
    for name, extra in refused.items():
        ask('refused-' + name, **extra)

    rep['action'] = action_asks(p, a)
    greedy_free('free-after')
    check(Ask.Response.ERROR_INCOMPLETE == 'incomplete', 'ERROR_INCOMPLETE')
    return rep


def main():
    ap = peer_arguments()
    ap.add_argument('--camera', default='/cam')
    ap.add_argument('--action', default='/vlm/ask')
    ap.add_argument('--prompt', default='Describe the scene as JSON.')
    ap.add_argument('--seeds', type=int, default=6)
    ap.add_argument('--max-new-tokens', type=int, default=512)
    ap.add_argument('--cut-tokens', type=int, default=4)
    ap.add_argument('--max-schema-bytes', type=int, default=16384)
    ap.add_argument('--timeout', type=float, default=280.0)
    a = ap.parse_args()
    rclpy.init()
    p = Peer(a)
    report_and_exit(lambda: run(p, a))


if __name__ == '__main__':
    main()
