"""rclpy peer for tests/readme.rs: runs the commands of README.md's "Using the node" section
against the real node, as a reader would type them, so the README cannot drift from the
interfaces.

Run with .ros2/venv/bin/python after `source .ros2/setup.bash`. Prints "REPORT <json>" and
"PEER OK" (node_peer.report_and_exit).

The README's code lines are read from the file, not copied here:
- shell lines (`SID=...`, `.ros2/venv/bin/python tools/vlm-ask.py ...`) run in one bash
  script from the repository root, `photo.png` being a bundled picture;
- `ros2 service call`, `ros2 action send_goal` and `ros2 topic echo` lines are not runnable
  here (the ros2 CLI is not on PyPI): each is parsed as the ros2 CLI parses it (name, type,
  YAML) and carried out with rclpy, so a wrong field, type or name in the README fails;
- the Python example block runs as its own process.
A camera stand-in publishes a picture on /image_raw at 5 Hz throughout, as the README assumes
a camera does.
"""

import importlib
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rclpy  # noqa: E402
import yaml  # noqa: E402
from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from node_peer import check, load_rgb, rgb8, report_and_exit  # noqa: E402
from bpu_vlm_client.action_client import ActionClient  # noqa: E402  (node_peer's path)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
PICTURE = 'tools/fixtures/images/scene_b.png'


def section(text, title):
    """The lines of the README section whose heading starts with `title`."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith('## '):
            inside = line[3:].startswith(title)
            continue
        if inside:
            out.append(line)
    return out


def code_blocks(lines):
    """Indented (4-space) code blocks, each a list of lines without the indent."""
    blocks, cur = [], []
    for line in lines:
        if line.startswith('    '):
            cur.append(line[4:])
        elif line.strip() == '' and cur:
            cur.append('')
        else:
            if cur:
                blocks.append(cur)
            cur = []
    if cur:
        blocks.append(cur)
    return blocks


def ros2_args(line):
    """argv of a `ros2 ...` line, its trailing `# comment` dropped."""
    return shlex.split(line, comments=True)


def msg_type(name):
    """`pkg/kind/Type` → the generated Python class."""
    pkg, kind, typ = name.split('/')
    return getattr(importlib.import_module(f'{pkg}.{kind}'), typ)


def fill(msg, values):
    """Sets `values` (a YAML mapping) on `msg` field by field, as the ros2 CLI does; an
    unknown field raises."""
    for k, v in (values or {}).items():
        check(hasattr(msg, k), f'{type(msg).__name__} has no field {k!r}')
        if isinstance(v, dict):
            fill(getattr(msg, k), v)
        else:
            setattr(msg, k, v)
    return msg


class Reader:
    def __init__(self, timeout):
        self.deadline = time.monotonic() + timeout
        self.node = rclpy.create_node('readme_peer')
        self.lock = threading.Lock()
        self.echoed = {}
        self.executor = MultiThreadedExecutor(num_threads=4)
        self.executor.add_node(self.node)
        self.camera = self.node.create_publisher(Image, '/image_raw', qos_profile_sensor_data)
        self.frame = rgb8(load_rgb('scene_a.png'))
        self.frame.header.frame_id = 'camera'
        self.node.create_timer(0.2, self.publish_frame)
        threading.Thread(target=self.executor.spin, daemon=True).start()

    def left(self):
        return max(0.1, self.deadline - time.monotonic())

    def publish_frame(self):
        self.frame.header.stamp = self.node.get_clock().now().to_msg()
        self.camera.publish(self.frame)

    def echo(self, topic):
        """`ros2 topic echo TOPIC`: the type from the graph, messages counted."""
        types = {}
        while time.monotonic() < self.deadline and topic not in types:
            types = dict(self.node.get_topic_names_and_types())
            time.sleep(0.1)
        check(topic in types, f'{topic} not on the graph')
        self.echoed[topic] = 0

        def on_msg(_m, topic=topic):
            with self.lock:
                self.echoed[topic] += 1

        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        self.node.create_subscription(msg_type(types[topic][0]), topic, on_msg, qos)

    def wait(self, future):
        while not future.done() and time.monotonic() < self.deadline:
            time.sleep(0.01)
        check(future.done(), 'no answer in time')
        return future.result()

    def service_call(self, name, typ, values):
        srv = msg_type(typ)
        client = self.node.create_client(srv, name)
        check(client.wait_for_service(timeout_sec=self.left()), f'no service {name}')
        r = self.wait(client.call_async(fill(srv.Request(), values)))
        return {k: getattr(r, k) for k in ('success', 'error_code', 'error_message')
                if hasattr(r, k)} or {'answered': True}

    def send_goal(self, name, typ, values):
        action = msg_type(typ)
        client = ActionClient(self.node, action, name)
        check(client.wait_for_server(timeout_sec=self.left()), f'no action {name}')
        feedback = []
        handle = self.wait(client.send_goal_async(fill(action.Goal(), values),
                                                  feedback_callback=feedback.append))
        check(handle.accepted, f'goal on {name} rejected')
        res = self.wait(handle.get_result_async())
        return {'status': res.status, 'feedback': len(feedback),
                'success': res.result.success, 'error_code': res.result.error_code}


def run_shell(lines, sid_file):
    """The README's shell lines in one bash script from the repository root."""
    script = ['set -euo pipefail', f'cd {shlex.quote(ROOT)}']
    for ln in lines:
        script.append(ln.replace('photo.png', PICTURE))
    script.append(f'printf %s "$SID" > {shlex.quote(sid_file)}')
    done = subprocess.run(['bash', '-c', '\n'.join(script)], capture_output=True, text=True,
                          timeout=600)
    return {'status': done.returncode, 'stdout': done.stdout[-2000:],
            'stderr': done.stderr[-2000:]}


def run_python(block, timeout):
    with tempfile.NamedTemporaryFile('w', suffix='.py', delete=False) as f:
        f.write('\n'.join(block) + '\n')
    done = subprocess.run([sys.executable, f.name], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    return {'status': done.returncode, 'stdout': done.stdout[-2000:],
            'stderr': done.stderr[-2000:]}


def run(a):
    with open(os.path.join(ROOT, 'README.md')) as f:
        blocks = code_blocks(section(f.read(), 'Using the node'))
    r = Reader(a.timeout)
    rep = {'shell': None, 'ros2': [], 'python': None}
    lines = [ln for b in blocks for ln in b if ln.strip()]
    for ln in lines:
        argv = ros2_args(ln) if ln.startswith('ros2 ') else []
        if argv[:2] == ['ros2', 'topic'] and argv[2] == 'echo':
            r.echo(argv[3])
    shell = [ln for ln in lines if re.match(r'(\w+=\$\(|\.ros2/venv/bin/python )', ln)]
    check(len(shell) >= 2, f'README shell lines not found: {shell}')
    with tempfile.NamedTemporaryFile('r', delete=False) as sid_file:
        rep['shell'] = run_shell(shell, sid_file.name)
        os.environ['SID'] = sid_file.read().strip()
    rep['shell']['lines'] = len(shell)
    for ln in lines:
        if not ln.startswith('ros2 '):
            continue
        argv = [os.path.expandvars(x) for x in ros2_args(ln)]
        if argv[1:3] == ['service', 'call']:
            out = r.service_call(argv[3], argv[4], yaml.safe_load(argv[5]))
        elif argv[1:3] == ['action', 'send_goal']:
            rest = [x for x in argv[3:] if x != '--feedback']
            out = r.send_goal(rest[0], rest[1], yaml.safe_load(rest[2]))
        elif argv[1:3] == ['topic', 'echo']:
            continue
        else:
            raise RuntimeError(f'README command not understood: {ln}')
        rep['ros2'].append({'line': ln, 'result': out})
    example = [b for b in blocks if any('bpu_vlm_client' in ln for ln in b)]
    check(len(example) == 1, 'the Python example block not found')
    rep['python'] = run_python(example[0], r.left())
    time.sleep(1.0)
    with r.lock:
        rep['echoed'] = dict(r.echoed)
    return rep


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument('--timeout', type=float, default=600.0)
    a = ap.parse_args()
    rclpy.init()
    report_and_exit(lambda: run(a))


if __name__ == '__main__':
    main()
