"""`VlmClient`: vlm_node's /ask service, its Token stream and its Ask action from Python.

The node publishes every request's deltas on one topic; a client that wants only its own
must name its request (`request_id`) and be subscribed before the first delta goes out.
`stream` does both: it picks a random id (never starting with `req-`, which the node keeps
for the ids it assigns), waits until the node's tokens publisher is matched, then calls.
"""

import atexit
import threading
import time
import uuid

import rclpy
from rclpy.executors import MultiThreadedExecutor
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

from bpu_vlm_msgs.action import Ask as AskAction
from bpu_vlm_msgs.action import Detect as DetectAction
from bpu_vlm_msgs.action import Watch as WatchAction
from bpu_vlm_msgs.msg import Token
from bpu_vlm_msgs.srv import Ask, Cancel
from unique_identifier_msgs.msg import UUID

# rclpy's own ActionClient can lose a response to a request sent from this thread while the
# spin thread takes it: see the module.
from .action_client import ActionClient

# Error codes of a request the node answered after admitting it: its Tokens (with one
# `last`) were published. Any other failure was refused before generation and has none.
ADMITTED_ERRORS = ('cancelled', 'timeout', 'backend_error', 'context_overflow', 'incomplete')

# As the node publishes: reliable, deep enough for a long answer arriving in a burst.
TOKENS_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=4096,
                        reliability=ReliabilityPolicy.RELIABLE)


def resolve(namespace, name):
    """The absolute name `name` has for a node in `namespace` (absolute names stay)."""
    if name.startswith('/'):
        return name
    ns = '/' + namespace.strip('/') if namespace.strip('/') else ''
    return f'{ns}/{name}'


def new_request_id():
    return 'c-' + uuid.uuid4().hex


def admitted(response):
    """Whether the node generated for this response's request (so its Tokens exist)."""
    return bool(response.success or response.error_code in ADMITTED_ERRORS
                or response.finish_reason)


def request_of(kind, prompt, fields, first='prompt'):
    req = kind()
    setattr(req, first, prompt)
    for key, value in fields.items():
        if not hasattr(req, key):
            raise TypeError(f'{kind.__name__} has no field {key!r}')
        setattr(req, key, value)
    return req


class _Deltas:
    """Tokens of one request, handed out in `index` order."""

    def __init__(self):
        self.cond = threading.Condition()
        self.pending = {}
        self.next = 0
        self.done = False

    def add(self, token):
        with self.cond:
            self.pending[token.index] = token
            self.cond.notify_all()

    def take(self, until, give_up):
        """The next Token in order; None once the last was taken, `give_up()` says so, or
        `until` (monotonic) passed."""
        with self.cond:
            while not self.done:
                token = self.pending.pop(self.next, None)
                if token is not None:
                    self.next += 1
                    self.done = token.last
                    return token
                if give_up() or time.monotonic() >= until:
                    return None
                self.cond.wait(timeout=0.05)
            return None


class Stream:
    """One request's answer as it streams: iterate for text deltas (in order, answer text
    only unless `reasoning=True`); afterwards `response` holds the service response (or
    the action result) and `finish_reason` the last Token's reason."""

    def __init__(self, client, request_id, reasoning, timeout):
        self.request_id = request_id
        self.response = None
        self.finish_reason = ''
        self._client = client
        self._reasoning = reasoning
        self._timeout = timeout
        self._deltas = client._register(request_id)
        self._done = None  # set by the caller: () -> the response once it arrived, else None

    def __iter__(self):
        until = time.monotonic() + self._timeout
        try:
            while True:
                refused = self._refused
                token = self._deltas.take(until, refused)
                if token is None:
                    break
                if token.last:
                    self.finish_reason = token.finish_reason
                if token.text and (self._reasoning or not token.reasoning):
                    yield token.text
            self.response = self._client._wait(self._done, until, self.request_id)
        finally:
            self._client._unregister(self.request_id)

    def _refused(self):
        r = self._done()
        return r is not None and not admitted(r)

    def text(self):
        """Consumes the stream; returns the whole answer text."""
        return ''.join(self)


class Goal:
    """An Ask action goal: `stream()` its deltas, `cancel()` it, `result()` when done."""

    def __init__(self, client, handle, stream):
        self._client = client
        self._handle = handle
        self._stream = stream
        self._result = handle.get_result_async()
        stream._done = lambda: (self._result.result().result if self._result.done() else None)

    @property
    def request_id(self):
        return self._stream.request_id

    def stream(self):
        return self._stream

    def cancel(self, timeout=10.0):
        """Asks the node to cancel the goal; True when it accepted the cancel."""
        f = self._handle.cancel_goal_async()
        resp = self._client._wait(lambda: f.result() if f.done() else None,
                                  time.monotonic() + timeout, self.request_id)
        return bool(resp.goals_canceling)

    def result(self, timeout=None):
        """The action result (the same fields as the Ask response)."""
        until = time.monotonic() + (self._stream._timeout if timeout is None else timeout)
        return self._client._wait(self._stream._done, until, self.request_id)


class Watching:
    """A running `vlm/watch` goal: `cancel()` it, `result()` once it ended."""

    def __init__(self, client, handle, key):
        self._client = client
        self._handle = handle
        self._key = key
        self._result = handle.get_result_async()
        # Its feedback callback goes with its end, whether or not `result()` is called.
        self._result.add_done_callback(lambda _: client._forget_watch(key))

    def done(self):
        return self._result.done()

    def cancel(self, timeout=10.0):
        """Asks the node to cancel the watch; True when it accepted the cancel."""
        f = self._handle.cancel_goal_async()
        resp = self._client._wait(lambda: f.result() if f.done() else None,
                                  time.monotonic() + timeout, 'the watch\'s cancel')
        return bool(resp.goals_canceling)

    def result(self, timeout=None):
        """The goal's result (`success`, `error_code`, `evaluations`, the last `answer` and
        its `image_header`); waits without limit when `timeout` is None."""
        until = float('inf') if timeout is None else time.monotonic() + timeout
        try:
            return self._client._wait(
                lambda: self._result.result().result if self._result.done() else None,
                until, 'the watch')
        finally:
            if self._result.done():
                self._client._forget_watch(self._key)


class VlmClient:
    """A client of one vlm_node. `namespace` is the node's namespace (its services and
    topics are resolved under it, as the node resolves its relative names); the other names
    are the node's parameters of the same name. Without `node`, the client creates one and
    spins it on a background thread; with `node`, the caller spins it (an executor with more
    than one thread, so callbacks run while a call waits)."""

    def __init__(self, node=None, namespace='', *, ask_service='ask',
                 tokens_topic='vlm/tokens', cancel_service='vlm/cancel',
                 action_name='vlm/ask', detect_action='vlm/detect', watch_action='vlm/watch',
                 timeout=120.0):
        if not rclpy.ok():
            rclpy.init()
        self._own = node is None
        self.node = node or rclpy.create_node(f'bpu_vlm_client_{uuid.uuid4().hex[:8]}')
        self.timeout = timeout
        self.names = {key: resolve(namespace, name) for key, name in [
            ('ask', ask_service), ('tokens', tokens_topic), ('cancel', cancel_service),
            ('action', action_name), ('detect', detect_action), ('watch', watch_action)]}
        self._lock = threading.Lock()
        self._streams = {}
        self._matched = set()
        self.node.create_subscription(Token, self.names['tokens'], self._on_token, TOKENS_QOS)
        self._ask = self.node.create_client(Ask, self.names['ask'])
        self._cancel = self.node.create_client(Cancel, self.names['cancel'])
        self._action = ActionClient(self.node, AskAction, self.names['action'])
        self._detect = ActionClient(self.node, DetectAction, self.names['detect'])
        self._watch = ActionClient(self.node, WatchAction, self.names['watch'])
        # A watch's feedback from the topic itself, by goal id: the ActionClient drops what
        # arrives before it has processed the goal's response, and a watch's first evaluation
        # (from a pre-filled frame) can be that quick.
        self._watch_feedback = {}
        self.node.create_subscription(
            WatchAction.Impl.FeedbackMessage, self.names['watch'] + '/_action/feedback',
            self._on_watch_feedback, QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
        self._executor = None
        self._spinner = None
        if self._own:
            self._executor = MultiThreadedExecutor(num_threads=2)
            self._executor.add_node(self.node)
            self._spinner = threading.Thread(target=self._executor.spin, daemon=True)
            self._spinner.start()
            # A spin thread still inside rclpy when the interpreter exits aborts the process
            # (std::terminate, exit status 134) after the answer was printed: stop it first.
            atexit.register(self.close)

    def close(self):
        """Stops the client's own spin thread and node (also run at interpreter exit)."""
        if self._executor is not None:
            executor, self._executor = self._executor, None
            executor.shutdown()
            if self._spinner is not None:
                self._spinner.join(timeout=5.0)
            atexit.unregister(self.close)
            if self._own:
                self.node.destroy_node()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def wait_for_node(self):
        """Waits until the node offers /ask (it does once its model is loaded) and its
        tokens publisher is discovered; raises TimeoutError after `timeout`."""
        self._ready(self._ask.wait_for_service, 'service ' + self.names['ask'])
        self._tokens_matched()

    # -- the three ways to ask ---------------------------------------------------------

    def ask(self, prompt, **fields):
        """Calls /ask and returns its response (`answer`, `success`, `error_code`, ...)."""
        self._ready(self._ask.wait_for_service, 'service ' + self.names['ask'])
        fut = self._ask.call_async(request_of(Ask.Request, prompt, fields))
        return self._wait(lambda: fut.result() if fut.done() else None,
                          time.monotonic() + self.timeout, fields.get('request_id', ''))

    def stream(self, prompt, reasoning=False, **fields):
        """Calls /ask and returns a `Stream` of this request's text deltas only."""
        self._ready(self._ask.wait_for_service, 'service ' + self.names['ask'])
        self._tokens_matched()
        fields.setdefault('request_id', new_request_id())
        s = Stream(self, fields['request_id'], reasoning, self.timeout)
        fut = self._ask.call_async(request_of(Ask.Request, prompt, fields))
        s._done = lambda: fut.result() if fut.done() else None
        return s

    def send_goal(self, prompt, reasoning=False, **fields):
        """Sends an Ask action goal; returns a `Goal` (stream, cancel, result). Raises
        RuntimeError when the node rejects the goal."""
        self._ready(self._action.wait_for_server, 'action ' + self.names['action'])
        self._tokens_matched()
        fields.setdefault('request_id', new_request_id())
        s = Stream(self, fields['request_id'], reasoning, self.timeout)
        sent = self._action.send_goal_async(request_of(AskAction.Goal, prompt, fields))
        handle = self._wait(lambda: sent.result() if sent.done() else None,
                            time.monotonic() + self.timeout, fields['request_id'])
        if not handle.accepted:
            self._unregister(fields['request_id'])
            raise RuntimeError(f'goal {fields["request_id"]} rejected by the node')
        return Goal(self, handle, s)

    def cancel(self, request_id):
        """Calls /vlm/cancel for `request_id`; returns the response."""
        self._ready(self._cancel.wait_for_service, 'service ' + self.names['cancel'])
        req = Cancel.Request()
        req.request_id = request_id
        fut = self._cancel.call_async(req)
        return self._wait(lambda: fut.result() if fut.done() else None,
                          time.monotonic() + self.timeout, request_id)

    # -- finding things ----------------------------------------------------------------

    def detect(self, query, on_detection=None, **fields):
        """Sends a `vlm/detect` goal and returns its result: `detections` (a
        vision_msgs/Detection2DArray in the source frame's pixels, with its header), `text`
        (the model's answer as generated), `success`, `error_code`, ... `on_detection(d)` is
        called with each vision_msgs/Detection2D as soon as the node has found it (with the
        score the result gives it). Raises RuntimeError when the node rejects the goal."""
        self._ready(self._detect.wait_for_server, 'action ' + self.names['detect'])
        fields.setdefault('request_id', new_request_id())
        rid = fields['request_id']
        seen = []

        def feedback(msg):
            # Each feedback holds every object found so far: hand out the new ones.
            for d in list(msg.feedback.detections.detections)[len(seen):]:
                seen.append(d)
                if on_detection is not None:
                    on_detection(d)

        goal = request_of(DetectAction.Goal, query, fields, first='query')
        sent = self._detect.send_goal_async(goal, feedback_callback=feedback)
        until = time.monotonic() + self.timeout
        handle = self._wait(lambda: sent.result() if sent.done() else None, until, rid)
        if not handle.accepted:
            raise RuntimeError(f'goal {rid} rejected by the node')
        res = handle.get_result_async()
        return self._wait(lambda: res.result().result if res.done() else None, until, rid)

    # -- standing questions ------------------------------------------------------------

    def watch(self, question, on_feedback=None, **fields):
        """Sends a `vlm/watch` goal and returns a `Watching` (cancel, result) once the node
        accepted it. `on_feedback(f)` is called with each bpu_vlm_msgs/action/Watch
        Feedback: an evaluation (`f.answer` as JSON text, `f.changed`, `f.image_header`, ...)
        or, with `f.camera_silent`, a notice that the camera fell silent. Other fields are the
        goal's (`json_schema`, `camera`, `min_interval_s`, `max_interval_s`, `until`,
        `timeout_s`). Raises RuntimeError when the node rejects the goal."""
        self._ready(self._watch.wait_for_server, 'action ' + self.names['watch'])
        if on_feedback is not None:
            # The first evaluation may come at once: the feedback must reach us by then.
            self._publisher_matched(self.names['watch'] + '/_action/feedback')
        goal = request_of(WatchAction.Goal, question, fields, first='question')
        goal_id = UUID(uuid=list(uuid.uuid4().bytes))
        key = bytes(goal_id.uuid)
        if on_feedback is not None:
            with self._lock:
                self._watch_feedback[key] = on_feedback
        sent = self._watch.send_goal_async(goal, goal_uuid=goal_id)
        try:
            handle = self._wait(lambda: sent.result() if sent.done() else None,
                                time.monotonic() + self.timeout, 'the watch')
        except TimeoutError:
            self._forget_watch(key)
            raise
        if not handle.accepted:
            self._forget_watch(key)
            raise RuntimeError('watch goal rejected by the node')
        return Watching(self, handle, key)

    # -- plumbing --------------------------------------------------------------------

    def _forget_watch(self, key):
        with self._lock:
            self._watch_feedback.pop(key, None)

    def _on_watch_feedback(self, msg):
        with self._lock:
            callback = self._watch_feedback.get(bytes(msg.goal_id.uuid))
        if callback is not None:
            callback(msg.feedback)

    def _on_token(self, token):
        with self._lock:
            deltas = self._streams.get(token.request_id)
        if deltas is not None:
            deltas.add(token)

    def _register(self, request_id):
        with self._lock:
            if request_id in self._streams:
                raise ValueError(f'request id {request_id!r} is already streaming')
            deltas = self._streams[request_id] = _Deltas()
        return deltas

    def _unregister(self, request_id):
        with self._lock:
            self._streams.pop(request_id, None)

    def _ready(self, wait, what):
        if not wait(timeout_sec=self.timeout):
            raise TimeoutError(f'{what} not available after {self.timeout} s')

    def _tokens_matched(self):
        """Waits until the node's tokens publisher is discovered: Tokens sent before that
        would not reach this subscription."""
        self._publisher_matched(self.names['tokens'])

    def _publisher_matched(self, topic):
        """Waits (once per topic) until the node's publisher on `topic` is discovered, so
        what it publishes from then on reaches this client's subscription."""
        if topic in self._matched:
            return
        until = time.monotonic() + self.timeout
        while self.node.count_publishers(topic) == 0:
            if time.monotonic() >= until:
                raise TimeoutError(f'no publisher on {topic}')
            time.sleep(0.02)
        # Discovery names the publisher a moment before its writer is matched to us.
        time.sleep(0.3)
        self._matched.add(topic)

    @staticmethod
    def _wait(result, until, what):
        while True:
            r = result()
            if r is not None:
                return r
            if time.monotonic() >= until:
                raise TimeoutError(f'no answer for {what!r} in time')
            time.sleep(0.005)
