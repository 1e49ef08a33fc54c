"""rclpy peer for tests/node_params.rs: vlm_node's parameter services over a real ROS 2 graph.

Run with .ros2/venv/bin/python. Prints one JSON line prefixed "REPORT " and then "PEER OK",
like node_peer.py (whose Peer it uses). Calls the rcl_interfaces services as `ros2 param`
does (the ros2 CLI is not installed here).

  serve   list, get, describe; asks with several seeds at the node's default temperature, then
          temperature set to 0 (as `ros2 param set` sends it: an integer) and the same asks;
          refused sets (restart-only, wrong type, out of range, atomically); finally the
          parameters dumped as `ros2 param dump` writes them, to --dump
  values  every listed parameter's value (the node started from the dumped file)
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rclpy  # noqa: E402
import yaml  # noqa: E402
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue  # noqa: E402
from rcl_interfaces.srv import (  # noqa: E402
    DescribeParameters, GetParameters, ListParameters, SetParameters, SetParametersAtomically)
from rclpy.parameter import parameter_value_to_python  # noqa: E402

from node_peer import Peer, peer_arguments, check, report_and_exit  # noqa: E402

TYPE_NAMES = {getattr(ParameterType, n): n[len('PARAMETER_'):].lower()
              for n in dir(ParameterType) if n.startswith('PARAMETER_')}

SEEDS = [1, 2, 3, 4]


class Params:
    def __init__(self, p, node_name):
        self.p = p
        self.clients = {
            kind: p.node.create_client(srv, f'{node_name}/{kind}')
            for kind, srv in [('list_parameters', ListParameters),
                              ('get_parameters', GetParameters),
                              ('set_parameters', SetParameters),
                              ('set_parameters_atomically', SetParametersAtomically),
                              ('describe_parameters', DescribeParameters)]}

    def call(self, kind, req):
        c = self.clients[kind]
        check(c.wait_for_service(timeout_sec=self.p.left()), f'no {kind} service')
        fut = c.call_async(req)
        while not fut.done() and time.monotonic() < self.p.deadline:
            time.sleep(0.01)
        check(fut.done(), f'no {kind} response')
        return fut.result()

    def names(self):
        req = ListParameters.Request()
        req.depth = ListParameters.Request.DEPTH_RECURSIVE
        return list(self.call('list_parameters', req).result.names)

    def get(self, names):
        req = GetParameters.Request()
        req.names = list(names)
        values = self.call('get_parameters', req).values
        return {n: {'type': TYPE_NAMES.get(v.type, str(v.type)),
                    'value': parameter_value_to_python(v)} for n, v in zip(names, values)}

    def describe(self, names):
        req = DescribeParameters.Request()
        req.names = list(names)
        return {d.name: {'type': TYPE_NAMES.get(d.type, str(d.type)),
                         'description': d.description}
                for d in self.call('describe_parameters', req).descriptors}

    @staticmethod
    def msg(name, value):
        v = ParameterValue()
        if value is None:
            v.type = ParameterType.PARAMETER_NOT_SET  # what `ros2 param delete` sends
        elif isinstance(value, bool):
            v.type, v.bool_value = ParameterType.PARAMETER_BOOL, value
        elif isinstance(value, int):
            v.type, v.integer_value = ParameterType.PARAMETER_INTEGER, value
        elif isinstance(value, float):
            v.type, v.double_value = ParameterType.PARAMETER_DOUBLE, value
        elif isinstance(value, str):
            v.type, v.string_value = ParameterType.PARAMETER_STRING, value
        else:
            v.type, v.string_array_value = ParameterType.PARAMETER_STRING_ARRAY, list(value)
        return Parameter(name=name, value=v)

    def set(self, name, value):
        req = SetParameters.Request()
        req.parameters = [self.msg(name, value)]
        r = self.call('set_parameters', req).results[0]
        return {'successful': r.successful, 'reason': r.reason}

    def set_atomically(self, pairs):
        req = SetParametersAtomically.Request()
        req.parameters = [self.msg(n, v) for n, v in pairs]
        r = self.call('set_parameters_atomically', req).result
        return {'successful': r.successful, 'reason': r.reason}

    def dump(self, node_name):
        """What `ros2 param dump` writes: every listed parameter's value under the node."""
        names = sorted(self.names())
        values = {n: v['value'] for n, v in self.get(names).items()}
        return yaml.dump({node_name: {'ros__parameters': values}}, default_flow_style=False)


def answers(p, tag):
    """One text-only ask per seed at the node's sampling defaults (every sampling field -1)."""
    out = []
    for seed in SEEDS:
        r = p.ask(request_id=f'{tag}-{seed}', prompt=p.args.prompt, camera='none', seed=seed,
                  max_new_tokens=p.args.max_new_tokens)
        check(r['response']['success'], f'{tag} seed {seed}: {r["response"]}')
        out.append(r['response']['answer'])
    return out


def mode_serve(p, a, ps):
    rep = {}
    p.wait_ask()
    rep['names'] = ps.names()
    rep['get'] = ps.get(['temperature', 'max_new_tokens', 'image_topics', 'demo_model',
                         'system_prompt', 'max_image_age_s'])
    rep['describe'] = ps.describe(['temperature', 'top_p', 'max_new_tokens', 'model_dir',
                                   'queue_depth'])
    rep['before'] = answers(p, 'warm')
    # `ros2 param set /vlm_node temperature 0` sends an integer.
    rep['set_temperature'] = ps.set('temperature', 0)
    rep['after_set'] = ps.get(['temperature'])
    rep['after'] = answers(p, 'greedy')
    rep['refused'] = {
        'model_dir': ps.set('model_dir', '/opt/models/other'),
        'queue_depth': ps.set('queue_depth', 8),
        'wrong_type': ps.set('temperature', 'hot'),
        'out_of_range': ps.set('top_p', 1.5),
        'max_new_tokens_zero': ps.set('max_new_tokens', 0),
        'unknown': ps.set('no_such_parameter', 1),
        'deleted': ps.set('top_k', None),
        'atomically': ps.set_atomically([('top_k', 5), ('vision', False)]),
    }
    rep['unchanged_restart_only'] = ps.set('queue_depth', ps.get(['queue_depth'])
                                           ['queue_depth']['value'])
    rep['after_refused'] = ps.get(['temperature', 'top_p', 'top_k', 'model_dir', 'queue_depth',
                                   'max_new_tokens'])
    with open(a.dump, 'w') as f:
        f.write(ps.dump(a.node_name))
    rep['dumped'] = {n: v['value'] for n, v in ps.get(sorted(ps.names())).items()}
    return rep


def mode_values(p, a, ps):
    p.wait_ask()
    return {'values': {n: v['value'] for n, v in ps.get(sorted(ps.names())).items()}}


def main():
    ap = peer_arguments()
    ap.add_argument('mode', choices=['serve', 'values'])
    ap.add_argument('--node-name', default='/vlm_node')
    ap.add_argument('--prompt', default='Describe a robot.')
    ap.add_argument('--max-new-tokens', type=int, default=12)
    ap.add_argument('--dump', default='')
    ap.add_argument('--timeout', type=float, default=240.0)
    a = ap.parse_args()
    rclpy.init()
    p = Peer(a)
    ps = Params(p, a.node_name)
    report_and_exit(lambda: {'serve': mode_serve, 'values': mode_values}[a.mode](p, a, ps))


if __name__ == '__main__':
    main()
