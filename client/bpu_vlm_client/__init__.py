"""Python client of vlm_node (bpu_vlm): ask, stream one's own answer, the Ask action,
find things (detect) and standing questions (watch).

    import rclpy
    from bpu_vlm_client import VlmClient

    with VlmClient(namespace='/') as vlm:
        for delta in vlm.stream('What do you see?'):
            print(delta, end='', flush=True)
        print(vlm.ask('And now?', max_new_tokens=32).answer)

See docs/client.md in the bpu_vlm repository.
"""

from .client import (ADMITTED_ERRORS, Goal, Stream, VlmClient, Watching, admitted, new_request_id,
                     resolve)

__all__ = ['ADMITTED_ERRORS', 'Goal', 'Stream', 'VlmClient', 'Watching', 'admitted',
           'new_request_id', 'resolve']
