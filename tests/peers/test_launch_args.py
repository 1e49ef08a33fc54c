"""Unit test of launch/vlm.launch.py's node_kwargs (ros2 launch and launch_ros are not
installable here, so the function that builds the Node action's arguments is tested alone).

    .ros2/venv/bin/python tests/peers/test_launch_args.py launch/vlm.launch.py

Checks that with no arguments the params file alone decides, that each given argument
overrides exactly its parameter (or Node keyword), that image_topic becomes a real list, and
that bad values are refused naming the argument. `effective` merges the parameter list as
rcl does (later entries win), so the checks are about the values the node would get.
Prints "PEER OK" on success (tests/node.rs runs it).
"""

import importlib.util
import os
import sys
import tempfile
import unittest

import yaml

LAUNCH_FILE = None
DEFAULT_PARAMS = '/install/share/bpu_vlm/launch/vlm_params.yaml'


def load_launch_module():
    spec = importlib.util.spec_from_file_location('vlm_launch', LAUNCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def effective(parameters):
    """The node's parameter values from a Node `parameters` list: files and dicts, in order,
    later entries winning (as rcl merges --params-file arguments)."""
    values = {}
    for entry in parameters:
        if isinstance(entry, dict):
            values.update(entry)
        else:
            with open(entry, encoding='utf-8') as f:
                doc = yaml.safe_load(f)
            (node,) = doc.values()
            values.update(node['ros__parameters'])
    return values


class NodeKwargs(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.m = load_launch_module()
        # Every declared argument at its declared default, as launch hands them over.
        cls.defaults = {name: (DEFAULT_PARAMS if default is None else default)
                        for name, default, _ in cls.m.LAUNCH_ARGUMENTS}

    def kwargs(self, **given):
        return self.m.node_kwargs({**self.defaults, **given}, DEFAULT_PARAMS)

    def test_declared_arguments(self):
        names = [name for name, _, _ in self.m.LAUNCH_ARGUMENTS]
        self.assertEqual(sorted(names), sorted([
            'params_file', 'model_dir', 'image_topic', 'namespace', 'use_sim_time',
            'log_level', 'respawn', 'respawn_delay', 'demo_model']))
        self.assertEqual(self.defaults['respawn'], 'true')
        self.assertGreaterEqual(float(self.defaults['respawn_delay']), 5.0)
        for name in ('model_dir', 'image_topic', 'namespace', 'use_sim_time', 'log_level',
                     'demo_model'):
            self.assertEqual(self.defaults[name], '', f'{name} must default to "not given"')

    def test_no_arguments_the_params_file_alone_decides(self):
        for kw in (self.kwargs(), self.m.node_kwargs({}, DEFAULT_PARAMS)):
            self.assertEqual(kw['parameters'], [DEFAULT_PARAMS])
            self.assertEqual((kw['package'], kw['executable'], kw['name']),
                             ('bpu_vlm', 'vlm_node', 'vlm_node'))
            self.assertNotIn('namespace', kw)
            self.assertNotIn('ros_arguments', kw)
            self.assertNotIn('arguments', kw)
            self.assertIs(kw['respawn'], True)
            self.assertEqual(kw['respawn_delay'], 5.0)

    def test_a_users_params_file_is_not_overridden(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, 'mine.yaml')
            with open(path, 'w', encoding='utf-8') as f:
                f.write('vlm_node:\n  ros__parameters:\n'
                        '    model_dir: /opt/models/qwen35-4b/s100p/ctx4k\n'
                        '    image_topics: ["/cam/a", "/cam/b"]\n'
                        '    use_sim_time: true\n'
                        '    demo_model: false\n')
            kw = self.kwargs(params_file=path)
            self.assertEqual(kw['parameters'], [path])
            self.assertEqual(effective(kw['parameters']), {
                'model_dir': '/opt/models/qwen35-4b/s100p/ctx4k',
                'image_topics': ['/cam/a', '/cam/b'],
                'use_sim_time': True,
                'demo_model': False,
            })
            # One given argument changes its parameter and nothing else.
            kw = self.kwargs(params_file=path, model_dir='/other')
            self.assertEqual(effective(kw['parameters']), {
                'model_dir': '/other',
                'image_topics': ['/cam/a', '/cam/b'],
                'use_sim_time': True,
                'demo_model': False,
            })

    def test_each_argument_overrides_exactly_its_parameter(self):
        base = self.kwargs()
        cases = {
            'model_dir': ('/opt/models/qwen35-4b/s100p/ctx4k',
                          {'model_dir': '/opt/models/qwen35-4b/s100p/ctx4k'}),
            'image_topic': ('/image', {'image_topics': ['/image']}),
            'use_sim_time': ('true', {'use_sim_time': True}),
            'demo_model': ('True', {'demo_model': True}),
        }
        for arg, (value, want) in cases.items():
            with self.subTest(arg=arg):
                kw = self.kwargs(**{arg: value})
                self.assertEqual(kw['parameters'], [DEFAULT_PARAMS, want])
                for key in base:
                    if key != 'parameters':
                        self.assertEqual(kw[key], base[key], f'{arg} changed {key}')
                self.assertEqual(set(kw), set(base))
        kw = self.kwargs(use_sim_time='false', demo_model='false')
        self.assertEqual(kw['parameters'][1], {'use_sim_time': False, 'demo_model': False})

    def test_image_topic_is_a_real_list(self):
        (overrides,) = self.kwargs(image_topic='/image')['parameters'][1:]
        self.assertIs(type(overrides['image_topics']), list)
        self.assertEqual(overrides['image_topics'], ['/image'])

    def test_params_file(self):
        kw = self.kwargs(params_file='/etc/robot/vlm.yaml')
        self.assertEqual(kw['parameters'], ['/etc/robot/vlm.yaml'])

    def test_node_keywords(self):
        base = self.kwargs()
        for given, key, want in (
            ({'namespace': 'robot1'}, 'namespace', 'robot1'),
            ({'log_level': 'DEBUG'}, 'ros_arguments', ['--log-level', 'debug']),
            ({'respawn': 'false'}, 'respawn', False),
            ({'respawn_delay': '12'}, 'respawn_delay', 12.0),
        ):
            with self.subTest(given=given):
                kw = self.kwargs(**given)
                self.assertEqual(kw[key], want)
                self.assertEqual(kw['parameters'], [DEFAULT_PARAMS])
                for other in set(base) | set(kw):
                    if other != key:
                        self.assertEqual(kw.get(other), base.get(other), f'{given} changed {other}')

    def test_all_arguments_together(self):
        kw = self.kwargs(params_file='/p.yaml', model_dir='/m', image_topic='/image',
                         namespace='/robot1', use_sim_time='true', log_level='warn',
                         demo_model='false', respawn='false', respawn_delay='7.5')
        self.assertEqual(kw['parameters'], ['/p.yaml', {
            'model_dir': '/m', 'image_topics': ['/image'], 'use_sim_time': True,
            'demo_model': False}])
        self.assertEqual(kw['namespace'], '/robot1')
        self.assertEqual(kw['ros_arguments'], ['--log-level', 'warn'])
        self.assertIs(kw['respawn'], False)
        self.assertEqual(kw['respawn_delay'], 7.5)

    def test_bad_values_name_the_argument(self):
        for given, name in (
            ({'use_sim_time': 'yes'}, 'use_sim_time'),
            ({'demo_model': '1'}, 'demo_model'),
            ({'respawn': 'always'}, 'respawn'),
            ({'respawn_delay': '-1'}, 'respawn_delay'),
            ({'respawn_delay': 'soon'}, 'respawn_delay'),
            ({'log_level': 'verbose'}, 'log_level'),
            ({'image_topics': '/x'}, 'image_topics'),
        ):
            with self.subTest(given=given):
                with self.assertRaises(ValueError) as e:
                    self.kwargs(**given)
                self.assertIn(name, str(e.exception))

    def test_the_installed_params_file_sets_every_overridable_parameter(self):
        # The launch file's own default file holds the parameters the arguments override
        # (use_sim_time is rcl's, not in the file).
        path = os.path.join(os.path.dirname(LAUNCH_FILE), 'vlm_params.yaml')
        values = effective([path])
        for name in ('model_dir', 'image_topics', 'demo_model'):
            self.assertIn(name, values)
        self.assertIs(values['demo_model'], False)


def main():
    global LAUNCH_FILE
    LAUNCH_FILE = os.path.abspath(sys.argv[1])
    result = unittest.main(argv=[sys.argv[0], '-v'], exit=False).result
    if result.wasSuccessful():
        print('PEER OK')
    else:
        sys.exit(1)


if __name__ == '__main__':
    main()
