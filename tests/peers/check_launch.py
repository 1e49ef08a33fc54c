"""Static check of launch/vlm.launch.py (ros2 launch is not installable from PyPI).

Parses the file with `ast` and checks its structure: the declared arguments (LAUNCH_ARGUMENTS:
params_file, model_dir, image_topic, name, namespace, remappings, use_sim_time, log_level,
demo_model, respawn, respawn_delay, sigterm_timeout) with their defaults; no launch/launch_ros
import at module level (so node_kwargs imports without them); generate_launch_description
declares every argument and builds its Node in one place, from node_kwargs, inside an
OpaqueFunction (a respawn is that same Node again, behind a TimerAction); node_kwargs names
bpu_vlm's vlm_node; the default params file is share/bpu_vlm/launch/vlm_params.yaml. What
node_kwargs returns and the respawn rule are tested by tests/peers/test_launch_args.py.
Prints "PEER OK" on success.
"""

import ast
import sys

ARGUMENTS = {
    'params_file': None, 'model_dir': '', 'image_topic': '', 'name': 'vlm_node',
    'namespace': '', 'remappings': '', 'use_sim_time': '', 'log_level': '', 'demo_model': '',
    'respawn': 'true', 'respawn_delay': '5.0', 'sigterm_timeout': '30', 'autostart': '',
}
LAUNCH_MODULES = ('launch', 'launch_ros', 'ament_index_python')


def call_name(node):
    f = node.func
    return f.id if isinstance(f, ast.Name) else getattr(f, 'attr', None)


def imported(node):
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        return [node.module or '']
    return []


def main(path):
    tree = ast.parse(open(path, encoding='utf-8').read(), path)
    top = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.Assign))
           and hasattr(n, 'name')}
    for stmt in tree.body:
        for mod in imported(stmt):
            assert mod.split('.')[0] not in LAUNCH_MODULES, \
                f'module-level import of {mod}: node_kwargs must import without launch'

    (args_assign,) = [s for s in tree.body if isinstance(s, ast.Assign)
                      and [getattr(t, 'id', None) for t in s.targets] == ['LAUNCH_ARGUMENTS']]
    declared = {name: default for name, default, _ in ast.literal_eval(args_assign.value)}
    assert declared == ARGUMENTS, declared
    assert float(declared['respawn_delay']) >= 5.0, 'respawn_delay default >= 5 s'
    assert float(declared['sigterm_timeout']) >= 20.0, 'sigterm_timeout default >= 20 s'

    assert 'node_kwargs' in top and 'generate_launch_description' in top, sorted(top)
    strings = {n.value for n in ast.walk(top['node_kwargs'])
               if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert {'bpu_vlm', 'vlm_node', 'parameters', 'respawn',
            'ros_arguments', '--log-level', 'namespace', 'name', 'remappings',
            'sigterm_timeout', 'on_exit'} <= strings, strings

    # respawn and respawn_delay are read (and checked) by respawn_policy.
    assert 'respawn_policy' in top, sorted(top)
    policy = {n.value for n in ast.walk(top['respawn_policy'])
              if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert {'respawn', 'respawn_delay'} <= policy, policy

    gen = top['generate_launch_description']
    gen_imports = [m for s in ast.walk(gen) for m in imported(s)]
    assert {'launch', 'launch.actions', 'launch_ros.actions'} <= set(gen_imports), gen_imports
    calls = [n for n in ast.walk(gen) if isinstance(n, ast.Call)]
    names = [call_name(c) for c in calls]
    assert names.count('DeclareLaunchArgument') == 1, 'one DeclareLaunchArgument per LAUNCH_ARGUMENTS entry'
    comps = [n for n in ast.walk(gen) if isinstance(n, ast.ListComp)]
    assert any(getattr(c.generators[0].iter, 'id', None) == 'LAUNCH_ARGUMENTS' for c in comps), \
        'arguments declared from LAUNCH_ARGUMENTS'
    assert names.count('OpaqueFunction') == 1
    assert names.count('TimerAction') == 1, 'a respawn waits respawn_delay in a TimerAction'
    nodes = [c for c in calls if call_name(c) == 'Node']
    assert len(nodes) == 1, 'exactly one Node action'
    (kw,) = nodes[0].keywords
    assert kw.arg is None and call_name(kw.value) == 'node_kwargs', 'Node(**node_kwargs(...))'
    joins = [c for c in calls if call_name(c) == 'join']
    assert any([getattr(a, 'value', None) for a in j.args[1:]] == ['launch', 'vlm_params.yaml']
               for j in joins), 'default params file'
    print('PEER OK')


if __name__ == '__main__':
    main(sys.argv[1])
