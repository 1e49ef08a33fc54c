"""Starts vlm_node.

    ros2 launch bpu_vlm vlm.launch.py model_dir:=/opt/models/qwen35-4b/s100p/ctx4k
    ros2 launch bpu_vlm vlm.launch.py params_file:=/path/my_params.yaml namespace:=robot1

The params file is the source of truth: a launch argument overrides its parameter only when
it is given (an argument left at "" changes nothing). Arguments:

  params_file    parameter YAML (default: share/bpu_vlm/launch/vlm_params.yaml)
  model_dir      sets the parameter model_dir (the model package folder)
  image_topic    sets the parameter image_topics to the list [image_topic]
  namespace      the node's namespace (default: the enclosing launch namespace)
  use_sim_time   true|false: sets the parameter use_sim_time
  log_level      debug|info|warn|error|fatal: passed as --ros-args --log-level, which sets
                 rcutils' level and the node's own log filter (it wins over RUST_LOG)
  demo_model     true|false: sets the parameter demo_model (the embedded tiny random model)
  respawn        true|false (default true): start the node again after it exits
  respawn_delay  seconds to wait before that (default 5.0; Humble's launch has no retry
                 limit and respawns on any exit, e.g. a configuration error)

`node_kwargs` turns the argument values into the Node action's keyword arguments; it is
plain Python (the launch imports are inside generate_launch_description), so a unit test
imports this file without launch_ros (tests/peers/test_launch_args.py).
"""

import os

# (name, default, description); None = the installed vlm_params.yaml.
LAUNCH_ARGUMENTS = (
    ('params_file', None, 'parameter YAML for vlm_node (the source of truth)'),
    ('model_dir', '', 'overrides the parameter model_dir when given (model package folder)'),
    ('image_topic', '', 'overrides the parameter image_topics with [image_topic] when given'),
    ('namespace', '', "the node's namespace; empty = the enclosing launch namespace"),
    ('use_sim_time', '', 'true|false: overrides the parameter use_sim_time when given'),
    ('log_level', '', 'debug|info|warn|error|fatal: rcutils and the node log filter'),
    ('demo_model', '', 'true|false: overrides the parameter demo_model when given'),
    ('respawn', 'true', 'true|false: start vlm_node again after it exits'),
    ('respawn_delay', '5.0', 'seconds before a respawn (Humble has no retry limit)'),
)

LOG_LEVELS = ('debug', 'info', 'warn', 'error', 'fatal')


def _bool(name, text):
    value = text.strip().lower()
    if value not in ('true', 'false'):
        raise ValueError(f'launch argument {name}: {text!r} is not true or false')
    return value == 'true'


def node_kwargs(args, default_params_file):
    """Keyword arguments of launch_ros' Node for vlm_node.

    args: launch argument values as strings, by name (a missing or empty value = not
    given). The parameters are the params file, then a dict with only the given overrides
    (launch_ros passes dicts after the file, so they win).
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
    parameters = [given('params_file') or default_params_file]
    if overrides:
        parameters.append(overrides)

    kwargs = {
        'package': 'bpu_vlm',
        'executable': 'vlm_node',
        'name': 'vlm_node',
        'output': 'screen',
        'emulate_tty': True,
        'parameters': parameters,
        'respawn': _bool('respawn', given('respawn') or 'true'),
    }
    delay_text = given('respawn_delay') or '5.0'
    try:
        delay = float(delay_text)
    except ValueError:
        delay = -1.0
    if not delay >= 0.0:
        raise ValueError(f'launch argument respawn_delay: {delay_text!r} is not seconds >= 0')
    kwargs['respawn_delay'] = delay
    if given('namespace'):
        kwargs['namespace'] = given('namespace')
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
    from launch.actions import DeclareLaunchArgument, OpaqueFunction
    from launch_ros.actions import Node

    default_params = os.path.join(
        get_package_share_directory('bpu_vlm'), 'launch', 'vlm_params.yaml')

    def start_node(context):
        values = {name: context.launch_configurations.get(name, '')
                  for name, _, _ in LAUNCH_ARGUMENTS}
        return [Node(**node_kwargs(values, default_params))]

    return LaunchDescription([
        DeclareLaunchArgument(
            name, default_value=default_params if default is None else default,
            description=description)
        for name, default, description in LAUNCH_ARGUMENTS
    ] + [OpaqueFunction(function=start_node)])
