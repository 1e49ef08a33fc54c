"""Example: a camera driver beside vlm_node. Copy it and change the driver to yours.

    ros2 launch bpu_vlm vlm_camera.launch.py model_dir:=/opt/models/qwen35-4b/s100p/ctx4k
    ros2 launch bpu_vlm vlm_camera.launch.py model_dir:=... \\
        camera_package:=hobot_usb_cam camera_executable:=hobot_usb_cam camera_topic:=/image

Starts the camera driver (default: usb_cam's usb_cam_node_exe, which publishes
sensor_msgs/Image on /image_raw) with the large-frame Fast DDS profile of this package (a
frame above 512 KiB is otherwise mostly lost between processes, docs/node.md "Large frames"),
and vlm.launch.py with the node's `image_raw` remapped to `camera_topic`, so the node's
default camera is that topic (its answers' `image_source` names it). Every argument of
vlm.launch.py (params_file, name, namespace, respawn, ...) applies as well. Arguments of
this file:

  camera_package     the driver's package (default usb_cam)
  camera_executable  its executable (default usb_cam_node_exe)
  camera_topic       the sensor_msgs/Image topic it publishes (default /image_raw)

The driver's own parameters stay its defaults; give it a params file by editing the Node
below. An RDK MIPI camera (mipi_cam) needs io_method ros (docs/node.md, "RDK cameras").
"""

import os

CAMERA_ARGUMENTS = (
    ('camera_package', 'usb_cam', "the camera driver's package"),
    ('camera_executable', 'usb_cam_node_exe', "the camera driver's executable"),
    ('camera_topic', '/image_raw', 'the sensor_msgs/Image topic the driver publishes'),
)


def camera_actions(values, share):
    """(camera Node keyword arguments, the launch arguments given to vlm.launch.py) from the
    argument values (missing or empty = default). Plain Python, so a unit test imports it
    without launch (tests/peers/test_launch_args.py)."""
    def value(name):
        (default,) = [d for n, d, _ in CAMERA_ARGUMENTS if n == name]
        return (values.get(name) or '').strip() or default

    profile = os.path.join(share, 'launch', 'fastdds_large_frames.xml')
    camera = {
        'package': value('camera_package'),
        'executable': value('camera_executable'),
        'output': 'screen',
        # Humble's Fast DDS reads the first name, later ones the second.
        'additional_env': {'FASTRTPS_DEFAULT_PROFILES_FILE': profile,
                           'FASTDDS_DEFAULT_PROFILES_FILE': profile},
    }
    vlm_arguments = {'remappings': 'image_raw:=' + value('camera_topic')}
    return camera, vlm_arguments


def generate_launch_description():
    # Imported here, not at module level: the unit test imports camera_actions without them.
    from ament_index_python.packages import get_package_share_directory
    from launch import LaunchDescription
    from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription, OpaqueFunction
    from launch.launch_description_sources import PythonLaunchDescriptionSource
    from launch_ros.actions import Node

    share = get_package_share_directory('bpu_vlm')

    def start(context):
        values = {name: context.launch_configurations.get(name, '')
                  for name, _, _ in CAMERA_ARGUMENTS}
        camera, vlm_arguments = camera_actions(values, share)
        vlm = IncludeLaunchDescription(
            PythonLaunchDescriptionSource(os.path.join(share, 'launch', 'vlm.launch.py')),
            launch_arguments=vlm_arguments.items())
        return [Node(**camera), vlm]

    return LaunchDescription([
        DeclareLaunchArgument(name, default_value=default, description=description)
        for name, default, description in CAMERA_ARGUMENTS
    ] + [OpaqueFunction(function=start)])
