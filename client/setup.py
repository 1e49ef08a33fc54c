from setuptools import setup

PACKAGE = 'bpu_vlm_client'

setup(
    name=PACKAGE,
    version='0.1.0',
    packages=[PACKAGE],
    data_files=[
        ('share/ament_index/resource_index/packages', [f'resource/{PACKAGE}']),
        (f'share/{PACKAGE}', ['package.xml']),
    ],
    install_requires=['setuptools'],
    zip_safe=True,
    description='Python client of vlm_node (bpu_vlm): ask, stream, and the Ask action.',
    license='Apache-2.0',
)
