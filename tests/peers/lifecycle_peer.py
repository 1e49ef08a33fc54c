"""rclpy peer for tests/node_lifecycle.rs: drives vlm_node through its lifecycle as a manager
does (`ros2 lifecycle set`), speaking only lifecycle_msgs to the protocol, and asks between the
transitions (bpu_vlm_msgs/srv/Ask). Parameters are set over rcl_interfaces' SetParameters.

Run with .ros2/venv/bin/python. Prints one JSON line prefixed "REPORT " and then "PEER OK".

  drive   the acceptance sequence of docs/lifecycle.md: unconfigured, a refused activate, a
          configure of a broken package, configure, activate, a deactivate during a long
          answer, cleanup, a configure of --package, shutdown
  cycles  --count configure/activate/deactivate/cleanup cycles with one ask each; the
          diagnostics after each cleanup; prints "CYCLE i" after each
  running a node started with autostart: active at once, freed by deactivate + cleanup and
          serving again after configure + activate; prints "SERVING" and "RELEASED" (then
          waits a second each) so the test can try the engine lock
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rclpy  # noqa: E402
from lifecycle_msgs.msg import TransitionEvent  # noqa: E402
from lifecycle_msgs.srv import (ChangeState, GetAvailableStates,  # noqa: E402
                                GetAvailableTransitions, GetState)
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue  # noqa: E402
from rcl_interfaces.srv import SetParameters  # noqa: E402

from node_peer import Peer, peer_arguments, check, report_and_exit  # noqa: E402

CONFIGURE, CLEANUP, ACTIVATE, DEACTIVATE = 1, 2, 3, 4
SHUTDOWN_FROM = {1: 5, 2: 6, 3: 7}


class LifecyclePeer(Peer):
    def __init__(self, args):
        super().__init__(args)
        base = args.node.rstrip('/')
        self.events = []
        self.node.create_subscription(TransitionEvent, base + '/transition_event',
                                      self.on_event, 100)
        self.change = self.node.create_client(ChangeState, base + '/change_state')
        self.get = self.node.create_client(GetState, base + '/get_state')
        self.states = self.node.create_client(GetAvailableStates, base + '/get_available_states')
        self.transitions = self.node.create_client(GetAvailableTransitions,
                                                   base + '/get_available_transitions')
        self.graph = self.node.create_client(GetAvailableTransitions,
                                             base + '/get_transition_graph')
        self.params = self.node.create_client(SetParameters, base + '/set_parameters')

    def on_event(self, e):
        with self.lock:
            self.events.append([e.transition.id, e.start_state.id, e.goal_state.id])

    def call(self, client, req):
        check(client.wait_for_service(timeout_sec=self.left()), f'no {client.srv_name}')
        fut = client.call_async(req)
        done = threading.Event()
        fut.add_done_callback(lambda _: done.set())
        check(done.wait(self.left()), f'no answer from {client.srv_name}')
        return fut.result()

    def state(self):
        return self.call(self.get, GetState.Request()).current_state.id

    def transition(self, tid):
        req = ChangeState.Request()
        req.transition.id = tid
        return self.call(self.change, req).success

    def set_string(self, name, value):
        p = Parameter(name=name, value=ParameterValue(type=ParameterType.PARAMETER_STRING,
                                                      string_value=value))
        r = self.call(self.params, SetParameters.Request(parameters=[p]))
        return {'successful': r.results[0].successful, 'reason': r.results[0].reason}

    def text_ask(self, rid, **extra):
        return self.greedy(rid, self.args.prompt, camera='none', **extra)

    def diag_where(self, pred, what):
        while time.monotonic() < self.deadline:
            with self.lock:
                for d in reversed(self.diagnostics):
                    if pred(d):
                        return dict(d)
            time.sleep(0.05)
        raise AssertionError(f'no diagnostics with {what}: last {self.last_diag()}')

    def released(self):
        """The first status after a cleanup: unconfigured, nothing held."""
        with self.lock:
            self.diagnostics.clear()
        return self.diag_where(
            lambda d: d.get('lifecycle_state') == 'unconfigured'
            and d.get('device_memory_bytes') == '0' and d.get('sim_live_buffers') == '0'
            and d.get('sim_live_tasks') == '0', 'nothing held')

    def taken_events(self):
        with self.lock:
            ev, self.events = self.events, []
        return ev


def refusal(r):
    resp = r['response']
    return [resp['success'], resp['error_code'], resp['error_message']]


def mode_drive(p, a):
    rep = {}
    rep['start_state'] = p.state()
    rep['ask_unconfigured'] = refusal(p.text_ask('lc-0'))
    rep['activate_unconfigured'] = p.transition(ACTIVATE)
    rep['after_refused'] = p.state()
    rep['available'] = [t.transition.id for t in p.call(
        p.transitions, GetAvailableTransitions.Request()).available_transitions]
    rep['graph'] = len(p.call(p.graph, GetAvailableTransitions.Request()).available_transitions)
    rep['states'] = sorted(s.id for s in p.call(
        p.states, GetAvailableStates.Request()).available_states)
    rep['events_refused'] = p.taken_events()

    rep['set_broken'] = p.set_string('model_dir', a.broken)
    rep['configure_broken'] = p.transition(CONFIGURE)
    rep['after_broken'] = p.state()
    time.sleep(0.3)
    rep['events_broken'] = p.taken_events()

    rep['set_demo'] = p.set_string('model_dir', '')
    rep['configure'] = p.transition(CONFIGURE)
    rep['after_configure'] = p.state()
    rep['ask_inactive'] = refusal(p.text_ask('lc-1'))
    rep['activate'] = p.transition(ACTIVATE)
    rep['after_activate'] = p.state()
    rep['ask_active'] = p.text_ask('lc-2')

    # A long answer, and one queued behind it; the deactivate comes at the first token.
    long_req, long_fut = p.ask_async(request_id='lc-long', prompt=a.prompt, camera='none',
                                     temperature=0.0, max_new_tokens=400, use_default_stop=False)
    while time.monotonic() < p.deadline:
        with p.lock:
            if p.tokens.get('lc-long'):
                break
        time.sleep(0.01)
    queued_req, queued_fut = p.ask_async(request_id='lc-queued', prompt=a.prompt,
                                         camera='none', max_new_tokens=8)
    time.sleep(0.3)
    rep['set_model_dir_active'] = p.set_string('model_dir', a.package)
    rep['deactivate'] = p.transition(DEACTIVATE)
    rep['long'] = p.finish(long_req, long_fut)
    rep['queued'] = p.finish(queued_req, queued_fut)
    rep['after_deactivate'] = p.state()
    rep['ask_deactivated'] = refusal(p.text_ask('lc-3'))

    rep['cleanup'] = p.transition(CLEANUP)
    rep['after_cleanup'] = p.state()
    rep['released'] = p.released()

    rep['set_package'] = p.set_string('model_dir', a.package)
    rep['configure_package'] = p.transition(CONFIGURE)
    rep['activate_package'] = p.transition(ACTIVATE)
    rep['ask_package'] = p.text_ask('lc-4')
    rep['serving_package'] = p.diag_where(
        lambda d: d.get('lifecycle_state') == 'active' and d.get('model_dir') == a.package,
        'the new package')
    rep['shutdown'] = p.transition(SHUTDOWN_FROM[p.state()])
    time.sleep(0.5)
    rep['events'] = p.taken_events()
    return rep


def mode_cycles(p, a):
    rep = {'released': [], 'answers': []}
    for i in range(a.count):
        check(p.transition(CONFIGURE), f'configure {i}')
        check(p.transition(ACTIVATE), f'activate {i}')
        rep['answers'].append(p.text_ask(f'cy-{i}')['response']['success'])
        check(p.transition(DEACTIVATE), f'deactivate {i}')
        check(p.transition(CLEANUP), f'cleanup {i}')
        rep['released'].append(p.released())
        print(f'CYCLE {i}', flush=True)
    return rep


def mode_running(p, a):
    rep = {'start_state': p.state()}
    rep['ask'] = p.text_ask('run-0')['response']['success']
    print('SERVING', flush=True)
    time.sleep(1.0)
    rep['deactivate'] = p.transition(DEACTIVATE)
    rep['cleanup'] = p.transition(CLEANUP)
    rep['released'] = p.released()
    print('RELEASED', flush=True)
    time.sleep(1.0)
    rep['configure'] = p.transition(CONFIGURE)
    rep['activate'] = p.transition(ACTIVATE)
    rep['ask_again'] = p.text_ask('run-1')['response']['success']
    return rep


def main():
    ap = peer_arguments()
    ap.add_argument('mode', choices=['drive', 'cycles', 'running'])
    ap.add_argument('--node', default='/vlm_node')
    ap.add_argument('--prompt', default='Describe the robot.')
    ap.add_argument('--max-new-tokens', type=int, default=8)
    ap.add_argument('--broken', default='/nonexistent')
    ap.add_argument('--package', default='')
    ap.add_argument('--count', type=int, default=20)
    ap.add_argument('--timeout', type=float, default=300.0)
    a = ap.parse_args()
    rclpy.init()
    p = LifecyclePeer(a)
    report_and_exit(lambda: {'drive': mode_drive, 'cycles': mode_cycles,
                             'running': mode_running}[a.mode](p, a))


if __name__ == '__main__':
    main()
