"""Shows what a running vlm_node offers on the ROS graph and what /ask answers.

    .ros2/venv/bin/python tools/vlm-inspect.py [--timeout 20]

Stands in for `ros2 node info` / `ros2 service call` (the ros2 CLI is not on PyPI).
"""

import argparse
import time

import rclpy

from bpu_vlm_msgs.srv import Ask


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--node', default='vlm_node')
    parser.add_argument('--timeout', type=float, default=20.0)
    parser.add_argument('--prompt', default='What is on the table?')
    args = parser.parse_args()
    rclpy.init()
    node = rclpy.create_node('vlm_inspect')
    deadline = time.monotonic() + args.timeout
    while args.node not in node.get_node_names() and time.monotonic() < deadline:
        rclpy.spin_once(node, timeout_sec=0.1)
    if args.node not in node.get_node_names():
        raise SystemExit(f'node {args.node} not found within {args.timeout} s')
    client = node.create_client(Ask, '/ask')
    if not client.wait_for_service(timeout_sec=max(0.1, deadline - time.monotonic())):
        raise SystemExit('/ask not found')
    time.sleep(0.3)  # let discovery list every endpoint
    pubs = node.get_publisher_names_and_types_by_node(args.node, '')
    subs = node.get_subscriber_names_and_types_by_node(args.node, '')
    srvs = node.get_service_names_and_types_by_node(args.node, '')
    print(f'node /{args.node}')
    print('  publishers:')
    for name, types in sorted(pubs):
        print(f'    {name}  [{", ".join(types)}]')
    print('  subscriptions:')
    for name, types in sorted(subs):
        print(f'    {name}  [{", ".join(types)}]')
    print('  services:')
    for name, types in sorted(srvs):
        print(f'    {name}  [{", ".join(types)}]')
    print(f'\ncalling /ask {{prompt: {args.prompt!r}}}')
    future = client.call_async(Ask.Request(prompt=args.prompt))
    while not future.done() and time.monotonic() < deadline + 10:
        rclpy.spin_once(node, timeout_sec=0.05)
    if not future.done():
        raise SystemExit('/ask did not respond')
    r = future.result()
    print(f'  success={r.success} error_code={r.error_code!r}\n  error_message={r.error_message!r}')
    node.destroy_node()
    rclpy.shutdown()


if __name__ == '__main__':
    main()
