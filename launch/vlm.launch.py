"""Starts vlm_node.

    ros2 launch bpu_vlm vlm.launch.py model_dir:=/path/to/package image_topic:=/image_raw

Arguments:
  model_dir    model package folder ("" = the node's default)
  image_topic  camera topic (sensor_msgs/Image) the node reads frames from
  params_file  parameter YAML (default: share/bpu_vlm/launch/vlm_params.yaml)

It only starts the node with these parameters; everything else is the node's job.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node


def generate_launch_description():
    default_params = os.path.join(
        get_package_share_directory('bpu_vlm'), 'launch', 'vlm_params.yaml')
    return LaunchDescription([
        DeclareLaunchArgument('model_dir', default_value='',
                              description='model package folder'),
        DeclareLaunchArgument('image_topic', default_value='/image_raw',
                              description='camera topic (sensor_msgs/Image)'),
        DeclareLaunchArgument('params_file', default_value=default_params,
                              description='parameter YAML for vlm_node'),
        Node(
            package='bpu_vlm',
            executable='vlm_node',
            name='vlm_node',
            output='screen',
            emulate_tty=True,
            parameters=[
                LaunchConfiguration('params_file'),
                {
                    'model_dir': LaunchConfiguration('model_dir'),
                    'image_topics': [LaunchConfiguration('image_topic')],
                },
            ],
        ),
    ])
