"""Starts vlm_node.

    ros2 launch bpu_vlm vlm.launch.py model_dir:=/opt/models/qwen35-4b/s100p/ctx4k
    ros2 launch bpu_vlm vlm.launch.py params_file:=/path/my_params.yaml namespace:=robot1
    ros2 launch bpu_vlm vlm.launch.py model_dir:=... remappings:=image_raw:=/my_cam/image

The params file is the source of truth: a launch argument overrides its parameter only when
it is given (an argument left at "" changes nothing). Its entries sit under `/**:`, so they
apply whatever the node's name and namespace. Arguments:

  params_file      parameter YAML (default: share/bpu_vlm/launch/vlm_params.yaml)
  model_dir        sets the parameter model_dir (the model package folder)
  image_topic      sets the parameter image_topics to the list [image_topic]
  name             the node's name (default vlm_node)
  namespace        the node's namespace (default: the enclosing launch namespace)
  remappings       remapping rules `from:=to`, separated by spaces or commas, e.g.
                   image_raw:=/my_cam/image (the node reports the remapped names)
  use_sim_time     true|false: sets the parameter use_sim_time
  log_level        debug|info|warn|error|fatal: passed as --ros-args --log-level, which sets
                   rcutils' level and the node's own log filter (it wins over RUST_LOG)
  demo_model       true|false: sets the parameter demo_model (the embedded tiny random model)
  autostart        true|false: sets the parameter autostart (false: the node starts
                   unconfigured and waits for a lifecycle manager; docs/lifecycle.md)
  respawn          true|false (default true): start the node again after it exits with a
                   code other than 0 (stopped) and 78 (configuration error: the same
                   settings fail the same way); a crash, exit 70 or a kill is restarted
  respawn_delay    seconds to wait before that (default 5.0)
  sigterm_timeout  seconds from Ctrl-C (SIGINT) to SIGTERM (default 30; launch's own default
                   of 5 s is shorter than a board's model load, which cannot be interrupted)

`node_kwargs` turns the argument values into the Node action's keyword arguments and
`respawn_delay_after` decides a respawn; both are plain Python (the launch imports are
inside generate_launch_description), so a unit test imports this file without launch_ros
(tests/peers/test_launch_args.py). launch_ros' own `respawn` restarts after any exit, so
the Node action gets respawn=False and an on_exit callback that starts a fresh Node.
"""

import os
import re

# (name, default, description); None = the installed vlm_params.yaml.
LAUNCH_ARGUMENTS = (
    ('params_file', None, 'parameter YAML for vlm_node (the source of truth)'),
    ('model_dir', '', 'overrides the parameter model_dir when given (model package folder)'),
    ('image_topic', '', 'overrides the parameter image_topics with [image_topic] when given'),
    ('name', 'vlm_node', "the node's name"),
    ('namespace', '', "the node's namespace; empty = the enclosing launch namespace"),
    ('remappings', '', 'remapping rules from:=to, separated by spaces or commas'),
    ('use_sim_time', '', 'true|false: overrides the parameter use_sim_time when given'),
    ('log_level', '', 'debug|info|warn|error|fatal: rcutils and the node log filter'),
    ('demo_model', '', 'true|false: overrides the parameter demo_model when given'),
    ('autostart', '', 'true|false: overrides the parameter autostart when given '
     '(false: wait for a lifecycle manager)'),
    ('respawn', 'true', 'true|false: start vlm_node again after an exit other than 0 and 78'),
    ('respawn_delay', '5.0', 'seconds before a respawn'),
    ('sigterm_timeout', '30', 'seconds from SIGINT to SIGTERM (a board load takes ~15 s)'),
)

LOG_LEVELS = ('debug', 'info', 'warn', 'error', 'fatal')

# vlm_node's exit codes after which a restart cannot help (docs/node.md, "Exit codes"):
# 0 = stopped on purpose (SIGINT/SIGTERM), 78 = configuration error (EX_CONFIG).
NO_RESPAWN_EXIT_CODES = (0, 78)

# A ROS name: letters, digits, _, / and ~ (rcl checks the rest); a rule is `from:=to`,
# optionally `node:from:=to`.
_RULE = re.compile(r'^([A-Za-z0-9_~/{}]+:)?[A-Za-z0-9_~/{}]+:=[A-Za-z0-9_~/{}]+$')


def _bool(name, text):
    value = text.strip().lower()
    if value not in ('true', 'false'):
        raise ValueError(f'launch argument {name}: {text!r} is not true or false')
    return value == 'true'


def _seconds(name, text):
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0.0:
        raise ValueError(f'launch argument {name}: {text!r} is not seconds >= 0')
    return value


def remapping_rules(text):
    """`from:=to` rules separated by whitespace or commas → [(from, to)] for launch_ros."""
    rules = []
    for rule in re.split(r'[\s,]+', text.strip()):
        if not rule:
            continue
        if not _RULE.match(rule):
            raise ValueError(f'launch argument remappings: {rule!r} is not a from:=to rule')
        source, target = rule.split(':=', 1)
        rules.append((source, target))
    return rules


def respawn_policy(args):
    """(respawn, delay in seconds) from the launch argument values (missing = default)."""
    def given(name):
        return (args.get(name) or '').strip()
    return (_bool('respawn', given('respawn') or 'true'),
            _seconds('respawn_delay', given('respawn_delay') or '5.0'))


def respawn_delay_after(returncode, shutting_down, policy):
    """Seconds to wait before starting vlm_node again after it exited with `returncode`
    (negative: killed by that signal), or None for no respawn: not while launch is shutting
    down, not when respawn is off, not after exit 0 or 78."""
    respawn, delay = policy
    if shutting_down or not respawn or returncode in NO_RESPAWN_EXIT_CODES:
        return None
    return delay


def node_kwargs(args, default_params_file, on_exit=None):
    """Keyword arguments of launch_ros' Node for vlm_node.

    args: launch argument values as strings, by name (a missing or empty value = not
    given). The parameters are the params file, then a dict with only the given overrides
    (launch_ros passes dicts after the file, so they win). on_exit: the callback that
    decides a respawn (launch's own respawn stays off).
    """
    unknown = set(args) - {name for name, _, _ in LAUNCH_ARGUMENTS}
    if unknown:
        raise ValueError(f'unknown launch arguments: {sorted(unknown)}')

    def given(name):
        return (args.get(name) or '').strip()

    overrides = {}
    if given('model_dir'):
        overrides['model_dir'] = given('model_dir')
    if given('image_topic'):
        overrides['image_topics'] = [given('image_topic')]
    if given('use_sim_time'):
        overrides['use_sim_time'] = _bool('use_sim_time', given('use_sim_time'))
    if given('demo_model'):
        overrides['demo_model'] = _bool('demo_model', given('demo_model'))
    if given('autostart'):
        overrides['autostart'] = _bool('autostart', given('autostart'))
    parameters = [given('params_file') or default_params_file]
    if overrides:
        parameters.append(overrides)

    respawn_policy(args)  # refuses a bad respawn or respawn_delay before anything starts
    kwargs = {
        'package': 'bpu_vlm',
        'executable': 'vlm_node',
        'name': given('name') or 'vlm_node',
        'output': 'screen',
        'emulate_tty': True,
        'parameters': parameters,
        'respawn': False,
        'sigterm_timeout': str(_seconds('sigterm_timeout', given('sigterm_timeout') or '30')),
    }
    if on_exit is not None:
        kwargs['on_exit'] = on_exit
    if given('namespace'):
        kwargs['namespace'] = given('namespace')
    rules = remapping_rules(given('remappings'))
    if rules:
        kwargs['remappings'] = rules
    if given('log_level'):
        level = given('log_level').lower()
        if level not in LOG_LEVELS:
            raise ValueError(
                f'launch argument log_level: {given("log_level")!r} is not one of {LOG_LEVELS}')
        kwargs['ros_arguments'] = ['--log-level', level]
    return kwargs


def generate_launch_description():
    # Imported here, not at module level: the unit test imports node_kwargs without them.
    from ament_index_python.packages import get_package_share_directory
    from launch import LaunchDescription
    from launch.actions import DeclareLaunchArgument, OpaqueFunction, TimerAction
    from launch_ros.actions import Node

    default_params = os.path.join(
        get_package_share_directory('bpu_vlm'), 'launch', 'vlm_params.yaml')

    def start_node(context):
        values = {name: context.launch_configurations.get(name, '')
                  for name, _, _ in LAUNCH_ARGUMENTS}
        policy = respawn_policy(values)

        def make_node():
            return Node(**node_kwargs(values, default_params, on_exit))

        def on_exit(event, exit_context):
            shutting_down = getattr(exit_context, 'is_shutdown', False)
            delay = respawn_delay_after(event.returncode, shutting_down, policy)
            if delay is None:
                return None
            # An action runs once: a respawn is a fresh Node with this same callback.
            again = make_node()
            return [TimerAction(period=delay, actions=[again])] if delay > 0 else [again]

        return [make_node()]

    return LaunchDescription([
        DeclareLaunchArgument(
            name, default_value=default_params if default is None else default,
            description=description)
        for name, default, description in LAUNCH_ARGUMENTS
    ] + [OpaqueFunction(function=start_node)])
