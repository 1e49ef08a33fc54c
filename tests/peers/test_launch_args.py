"""Unit test of launch/vlm.launch.py's node_kwargs (ros2 launch and launch_ros are not
installable here, so the function that builds the Node action's arguments is tested alone).

    .ros2/venv/bin/python tests/peers/test_launch_args.py launch/vlm.launch.py

Checks that with no arguments the params file alone decides, that each given argument
overrides exactly its parameter (or Node keyword), that image_topic becomes a real list, and
that bad values are refused naming the argument. The respawn rule (none after exit 0 or 78)
and the sigterm timeout are checked on the function that decides and, through
generate_launch_description with stand-in launch modules, on the callback launch calls
with each exit event (`LaunchRun`). `effective` merges the parameter list as
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


def load_launch_module(path=None):
    spec = importlib.util.spec_from_file_location('vlm_launch', path or LAUNCH_FILE)
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
            'params_file', 'model_dir', 'image_topic', 'name', 'namespace', 'remappings',
            'use_sim_time', 'log_level', 'respawn', 'respawn_delay', 'demo_model',
            'sigterm_timeout', 'autostart']))
        self.assertEqual(self.defaults['respawn'], 'true')
        self.assertGreaterEqual(float(self.defaults['respawn_delay']), 5.0)
        # A board's model load (~15 s) cannot be interrupted: SIGTERM must not come first.
        self.assertGreaterEqual(float(self.defaults['sigterm_timeout']), 20.0)
        self.assertEqual(self.defaults['name'], 'vlm_node')
        for name in ('model_dir', 'image_topic', 'namespace', 'remappings', 'use_sim_time',
                     'log_level', 'demo_model', 'autostart'):
            self.assertEqual(self.defaults[name], '', f'{name} must default to "not given"')

    def test_no_arguments_the_params_file_alone_decides(self):
        for kw in (self.kwargs(), self.m.node_kwargs({}, DEFAULT_PARAMS)):
            self.assertEqual(kw['parameters'], [DEFAULT_PARAMS])
            self.assertEqual((kw['package'], kw['executable'], kw['name']),
                             ('bpu_vlm', 'vlm_node', 'vlm_node'))
            self.assertNotIn('namespace', kw)
            self.assertNotIn('remappings', kw)
            self.assertNotIn('ros_arguments', kw)
            self.assertNotIn('arguments', kw)
            # launch's own respawn (after any exit) is off; the launch file's rule decides.
            self.assertIs(kw['respawn'], False)
            self.assertNotIn('respawn_delay', kw)
            self.assertGreaterEqual(float(kw['sigterm_timeout']), 20.0)
        for args in (self.defaults, {}):
            self.assertEqual(self.m.respawn_policy(args), (True, 5.0))

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
            'autostart': ('false', {'autostart': False}),
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
            ({'name': 'vlm_front'}, 'name', 'vlm_front'),
            ({'remappings': 'image_raw:=/my_cam/image'}, 'remappings',
             [('image_raw', '/my_cam/image')]),
            ({'remappings': ' image_raw:=/my_cam/image,  vlm_node:cam:=/c2 '}, 'remappings',
             [('image_raw', '/my_cam/image'), ('vlm_node:cam', '/c2')]),
            ({'log_level': 'DEBUG'}, 'ros_arguments', ['--log-level', 'debug']),
            ({'sigterm_timeout': '45'}, 'sigterm_timeout', '45.0'),
        ):
            with self.subTest(given=given):
                kw = self.kwargs(**given)
                self.assertEqual(kw[key], want)
                self.assertEqual(kw['parameters'], [DEFAULT_PARAMS])
                for other in set(base) | set(kw):
                    if other != key:
                        self.assertEqual(kw.get(other), base.get(other), f'{given} changed {other}')

    def test_all_arguments_together(self):
        given = dict(params_file='/p.yaml', model_dir='/m', image_topic='/image',
                     name='vlm_front', namespace='/robot1', remappings='image_raw:=/cam',
                     use_sim_time='true', log_level='warn', demo_model='false',
                     respawn='false', respawn_delay='7.5', sigterm_timeout='25')
        kw = self.kwargs(**given)
        self.assertEqual(kw['parameters'], ['/p.yaml', {
            'model_dir': '/m', 'image_topics': ['/image'], 'use_sim_time': True,
            'demo_model': False}])
        self.assertEqual(kw['name'], 'vlm_front')
        self.assertEqual(kw['namespace'], '/robot1')
        self.assertEqual(kw['remappings'], [('image_raw', '/cam')])
        self.assertEqual(kw['ros_arguments'], ['--log-level', 'warn'])
        self.assertIs(kw['respawn'], False)
        self.assertEqual(kw['sigterm_timeout'], '25.0')
        self.assertEqual(self.m.respawn_policy({**self.defaults, **given}), (False, 7.5))

    def test_bad_values_name_the_argument(self):
        for given, name in (
            ({'use_sim_time': 'yes'}, 'use_sim_time'),
            ({'demo_model': '1'}, 'demo_model'),
            ({'respawn': 'always'}, 'respawn'),
            ({'respawn_delay': '-1'}, 'respawn_delay'),
            ({'respawn_delay': 'soon'}, 'respawn_delay'),
            ({'log_level': 'verbose'}, 'log_level'),
            ({'sigterm_timeout': '-3'}, 'sigterm_timeout'),
            ({'sigterm_timeout': 'long'}, 'sigterm_timeout'),
            ({'remappings': 'image_raw=/cam'}, 'remappings'),
            ({'remappings': 'image_raw:=/cam:=x'}, 'remappings'),
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


class RespawnRule(unittest.TestCase):
    """`respawn_delay_after`: the decision the on_exit callback takes."""

    @classmethod
    def setUpClass(cls):
        cls.m = load_launch_module()

    def test_no_respawn_after_0_or_78(self):
        on = (True, 5.0)
        self.assertEqual(self.m.NO_RESPAWN_EXIT_CODES, (0, 78))
        self.assertIsNone(self.m.respawn_delay_after(0, False, on))
        self.assertIsNone(self.m.respawn_delay_after(78, False, on))
        # A runtime failure (70), a panic's 101, a kill (negative: the signal) respawn.
        for code in (70, 1, 101, 143, -9, -11):
            self.assertEqual(self.m.respawn_delay_after(code, False, on), 5.0, code)
        self.assertEqual(self.m.respawn_delay_after(70, False, (True, 0.0)), 0.0)

    def test_never_while_shutting_down_or_when_off(self):
        for code in (0, 70, 78, -9):
            self.assertIsNone(self.m.respawn_delay_after(code, True, (True, 5.0)))
            self.assertIsNone(self.m.respawn_delay_after(code, False, (False, 5.0)))


class Stub:
    """A stand-in for a launch action or description: keeps its arguments."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def stub_launch_modules(share):
    """sys.modules entries standing in for launch, launch_ros and ament_index_python (not
    installable here), with the names generate_launch_description imports."""
    import types
    mods = {}
    for name in ('launch', 'launch.actions', 'launch.launch_description_sources', 'launch_ros',
                 'launch_ros.actions', 'ament_index_python', 'ament_index_python.packages'):
        mods[name] = types.ModuleType(name)
    mods['launch'].LaunchDescription = type('LaunchDescription', (Stub,), {})
    for action in ('DeclareLaunchArgument', 'OpaqueFunction', 'TimerAction',
                   'IncludeLaunchDescription'):
        setattr(mods['launch.actions'], action, type(action, (Stub,), {}))
    mods['launch.launch_description_sources'].PythonLaunchDescriptionSource = \
        type('PythonLaunchDescriptionSource', (Stub,), {})
    mods['launch_ros.actions'].Node = type('Node', (Stub,), {})
    mods['ament_index_python.packages'].get_package_share_directory = \
        lambda package: os.path.join(share, package)
    return mods


class LaunchRun(unittest.TestCase):
    """generate_launch_description with stand-in launch modules: the Node it starts, then
    what its on_exit callback returns for fake exit events, as launch would call it."""

    def launch_entities(self, path=None, **given):
        """The entities the launch file's OpaqueFunction returns for `given`."""
        from unittest import mock
        ctx = type('Ctx', (), {})()
        with mock.patch.dict(sys.modules, stub_launch_modules('/share')):
            m = load_launch_module(path)
            ld = m.generate_launch_description()
            (entities,) = ld.args
            (opaque,) = [e for e in entities if type(e).__name__ == 'OpaqueFunction']
            declared = {e.args[0]: e.kwargs['default_value'] for e in entities
                        if type(e).__name__ == 'DeclareLaunchArgument'}
            # launch hands every declared argument over, at its default unless given
            ctx.launch_configurations = {**declared, **given}
            return opaque.kwargs['function'](ctx)

    def start(self, **given):
        (node,) = self.launch_entities(**given)
        self.assertEqual(type(node).__name__, 'Node')
        return node

    def exit_with(self, node, returncode, shutting_down=False):
        event = type('ProcessExited', (), {'returncode': returncode})()
        ctx = type('Ctx', (), {'is_shutdown': shutting_down})()
        return node.kwargs['on_exit'](event, ctx)

    def test_the_node_action(self):
        node = self.start()
        kw = node.kwargs
        self.assertEqual((kw['package'], kw['executable'], kw['name']),
                         ('bpu_vlm', 'vlm_node', 'vlm_node'))
        self.assertEqual(kw['parameters'], ['/share/bpu_vlm/launch/vlm_params.yaml'])
        self.assertIs(kw['respawn'], False)
        self.assertGreaterEqual(float(kw['sigterm_timeout']), 20.0)
        self.assertTrue(callable(kw['on_exit']))

    def test_no_respawn_on_78_nor_0(self):
        node = self.start()
        self.assertIsNone(self.exit_with(node, 78))
        self.assertIsNone(self.exit_with(node, 0))

    def test_respawn_after_a_crash_is_a_fresh_node_after_the_delay(self):
        node = self.start(respawn_delay='2.5', name='vlm_front')
        for code in (70, -9):
            (timer,) = self.exit_with(node, code)
            self.assertEqual(type(timer).__name__, 'TimerAction')
            self.assertEqual(timer.kwargs['period'], 2.5)
            (again,) = timer.kwargs['actions']
            self.assertIsNot(again, node)
            self.assertEqual({k: v for k, v in again.kwargs.items() if k != 'on_exit'},
                             {k: v for k, v in node.kwargs.items() if k != 'on_exit'})
            # The respawned node follows the same rule.
            self.assertIsNone(self.exit_with(again, 78))
            self.assertIsNotNone(self.exit_with(again, 70))
        (again,) = self.exit_with(self.start(respawn_delay='0'), 70)
        self.assertEqual(type(again).__name__, 'Node')

    def test_no_respawn_when_off_or_shutting_down(self):
        self.assertIsNone(self.exit_with(self.start(respawn='false'), 70))
        self.assertIsNone(self.exit_with(self.start(), 70, shutting_down=True))

    def test_the_camera_example_remaps_image_raw_to_the_camera(self):
        path = os.path.join(os.path.dirname(LAUNCH_FILE), 'vlm_camera.launch.py')
        for given, package, topic in (({}, 'usb_cam', '/image_raw'),
                                      ({'camera_package': 'hobot_usb_cam',
                                        'camera_executable': 'hobot_usb_cam',
                                        'camera_topic': '/image'}, 'hobot_usb_cam', '/image')):
            camera, vlm = self.launch_entities(path, **given)
            self.assertEqual(camera.kwargs['package'], package)
            profile = '/share/bpu_vlm/launch/fastdds_large_frames.xml'
            self.assertEqual(camera.kwargs['additional_env']['FASTRTPS_DEFAULT_PROFILES_FILE'],
                             profile)
            self.assertEqual(type(vlm).__name__, 'IncludeLaunchDescription')
            (source,) = vlm.args
            self.assertEqual(source.args, ('/share/bpu_vlm/launch/vlm.launch.py',))
            self.assertEqual(dict(vlm.kwargs['launch_arguments']),
                             {'remappings': 'image_raw:=' + topic})
            # What the included file makes of it: the node's image_raw is the camera topic.
            node = self.start(remappings='image_raw:=' + topic)
            self.assertEqual(node.kwargs['remappings'], [('image_raw', topic)])


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
