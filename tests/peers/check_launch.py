"""Static check of launch/vlm.launch.py (ros2 launch is not installable from PyPI).

Parses the file with `ast` and checks what it promises: the arguments model_dir,
image_topic and params_file; one Node action starting bpu_vlm's vlm_node named vlm_node
with the params file first and then model_dir / image_topics from the arguments; the
default params file is share/bpu_vlm/launch/vlm_params.yaml. Prints "PEER OK" on success.
"""

import ast
import sys


def call_name(node):
    f = node.func
    return f.id if isinstance(f, ast.Name) else getattr(f, 'attr', None)


def kwargs(node):
    return {k.arg: k.value for k in node.keywords}


def launch_config(node):
    if isinstance(node, ast.Call) and call_name(node) == 'LaunchConfiguration':
        return node.args[0].value
    return None


def main(path):
    tree = ast.parse(open(path, encoding='utf-8').read(), path)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    declared = {c.args[0].value: kwargs(c) for c in calls if call_name(c) == 'DeclareLaunchArgument'}
    assert set(declared) == {'model_dir', 'image_topic', 'params_file'}, declared.keys()
    assert declared['model_dir']['default_value'].value == ''
    assert declared['image_topic']['default_value'].value == '/image_raw'
    joins = [c for c in calls if call_name(c) == 'join']
    assert any([getattr(a, 'value', None) for a in j.args[1:]] == ['launch', 'vlm_params.yaml']
               for j in joins), 'default params file'
    nodes = [c for c in calls if call_name(c) == 'Node']
    assert len(nodes) == 1, 'exactly one Node action'
    kw = kwargs(nodes[0])
    assert kw['package'].value == 'bpu_vlm'
    assert kw['executable'].value == 'vlm_node'
    assert kw['name'].value == 'vlm_node'
    params = kw['parameters'].elts
    assert launch_config(params[0]) == 'params_file', 'the params file comes first'
    overrides = {k.value: v for k, v in zip(params[1].keys, params[1].values)}
    assert launch_config(overrides['model_dir']) == 'model_dir'
    assert [launch_config(e) for e in overrides['image_topics'].elts] == ['image_topic']
    assert set(overrides) == {'model_dir', 'image_topics'}, 'the launch file sets nothing else'
    print('PEER OK')


if __name__ == '__main__':
    main(sys.argv[1])
