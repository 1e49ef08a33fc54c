"""`ActionClient`: rclpy's ActionClient without its lost-response race.

rclpy's ActionClient (Jazzy's rclpy 7.1.x) sends a goal, cancel or get_result request first
and only then records the request's sequence number (the key its executor looks the response
up by). When the caller's thread is not the thread that spins the node — a background spin
thread, a MultiThreadedExecutor — the response can arrive, be taken and be looked up between
those two steps: rclpy logs "Ignoring unexpected goal response" (or cancel / result
response), drops it, and the future never completes. The server did answer. The window is
a few bytecodes wide, so it takes a loaded machine (the caller's thread preempted right
after sending) or a server that answers at once (a goal response always comes at once; so
does the result of a goal that has already ended); docs/ask-action.md has the details.

Here each request is sent and recorded under one lock, and responses are looked up under
the same lock: a response taken early waits until its request is recorded. rclpy's own
Client (services) has had such a lock for long; the action client got one only in later
rclpy releases, which this subclass then merely duplicates.
"""

import threading

from rclpy.action import ActionClient as _RclpyActionClient

# The keys of `take_data`'s dict that hold responses to this client's requests.
_RESPONSES = ('goal', 'cancel', 'result')


class ActionClient(_RclpyActionClient):
    """rclpy's ActionClient (same constructor and methods) with requests recorded before
    their responses can be looked up."""

    def __init__(self, *args, **kwargs):
        # Re-entrant: a future completed inside `execute` may run its done callbacks (which
        # forget the request) on the same thread.
        self._requests_lock = threading.RLock()
        super().__init__(*args, **kwargs)

    def send_goal_async(self, *args, **kwargs):
        with self._requests_lock:
            return super().send_goal_async(*args, **kwargs)

    def _cancel_goal_async(self, goal_handle):
        with self._requests_lock:
            return super()._cancel_goal_async(goal_handle)

    def _get_result_async(self, goal_handle):
        with self._requests_lock:
            return super()._get_result_async(goal_handle)

    async def execute(self, taken_data):
        # The responses are looked up under the lock; feedback and status run outside it (a
        # feedback callback may be a coroutine that really suspends).
        responses = {k: v for k, v in taken_data.items() if k in _RESPONSES}
        if responses:
            with self._requests_lock:
                await super().execute(responses)
        others = {k: v for k, v in taken_data.items() if k not in _RESPONSES}
        if others:
            await super().execute(others)
