"""The probe section of tools/board-acceptance.sh: `vlm probe` in a child process, each step
on disk (logs/probe.jsonl) before it runs, so when a vendor library takes the process down
the report still names the step and the signal; where the vendor headers are installed, also
hbdnn-sys/board-check.sh (our header's declarations against theirs) as the step board_check.

Used by tools/board_acceptance.py (its Runner runs the commands and keeps their output)."""

import json
import os
import signal
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def last_line(text):
    lines = text.strip().splitlines()
    return lines[-1] if lines else ''


PROBE_TIMEOUT = 600
BOARD_CHECK_TIMEOUT = 3600  # a first cargo build of hbdnn-sys's tests on the board
PROBE_STEPS = ('flush_whole', 'flush_range', 'decode', 'prefill', 'tower')


def vendor_include():
    """The include root holding the vendor's hobot/dnn/hb_dnn.h (HBDNN_SYS_HOBOT_INCLUDE, as
    hbdnn-sys's build script reads it, else /usr/include), or None when it is not there."""
    root = os.environ.get('HBDNN_SYS_HOBOT_INCLUDE') or '/usr/include'
    return root if os.path.isfile(os.path.join(root, 'hobot', 'dnn', 'hb_dnn.h')) else None


def append_synced(path, obj):
    """One JSON line appended to the probe log and on disk before this returns."""
    with open(path, 'a') as f:
        f.write(json.dumps(obj) + '\n')
        f.flush()
        os.fsync(f.fileno())


def read_probe_log(path):
    """The steps of a probe log in order: each {name, pass, ms, detail} from its end line,
    and the name of a step that started without ending (where the process died), if any."""
    steps, open_step = [], None
    try:
        with open(path, encoding='utf-8', errors='replace') as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            ev = json.loads(line)
        except ValueError:
            continue  # a line cut short by the crash
        if not isinstance(ev, dict) or 'step' not in ev:
            continue
        if ev.get('event') == 'start':
            open_step = ev['step']
        elif ev.get('event') == 'end':
            steps.append({'name': ev['step'], 'pass': ev.get('pass') is True, 'ms': ev.get('ms'),
                          'detail': ev.get('detail', '')})
            if open_step == ev['step']:
                open_step = None
    return steps, open_step


def how_it_ended(rc):
    if rc is None:
        return f'timed out after {PROBE_TIMEOUT} s and was killed'
    if rc < 0:
        try:
            return f'killed by {signal.Signals(-rc).name}'
        except ValueError:
            return f'killed by signal {-rc}'
    return f'exited {rc}'


def board_check_step(r, a, log_path):
    """hbdnn-sys/board-check.sh: our header's declarations against the vendor's installed
    ones (sizes, offsets, constants, signatures). Left out (None) where the headers are not
    installed."""
    root = vendor_include()
    if root is None:
        return None
    append_synced(log_path, {'step': 'board_check', 'event': 'start'})
    t0 = time.monotonic()
    rc, out, err, log = r.run('board-check', ['sh', os.path.join(ROOT, 'hbdnn-sys',
                                                                  'board-check.sh')],
                              env={'HBDNN_SYS_HOBOT_INCLUDE': root},
                              timeout=BOARD_CHECK_TIMEOUT)
    ms = round((time.monotonic() - t0) * 1e3, 3)
    summary = [l for l in (out + err).splitlines() if l.startswith('test result:')]
    detail = (f'headers under {root}/hobot: ' + (summary[-1] if summary else how_it_ended(rc))
              + f' (log {os.path.basename(log)})')
    step = {'name': 'board_check', 'pass': rc == 0, 'ms': ms, 'detail': detail}
    append_synced(log_path, {'step': 'board_check', 'event': 'end', 'pass': step['pass'],
                             'ms': ms, 'detail': detail})
    return step


def section_probe(r, a):
    """`vlm probe` in a child process: each step is on disk before it runs, so a crash of
    the libraries still names the step (the report says which and by what signal)."""
    probe_log = os.path.join(r.logs, 'probe.jsonl')
    rc, out, err, log = r.run('probe', [a.vlm, 'probe', a.package, '--log', probe_log],
                              timeout=PROBE_TIMEOUT)
    steps, stopped_at = read_probe_log(probe_log)
    res = {'pass': None, 'steps': steps, 'exit': how_it_ended(rc), 'probe_log': probe_log,
           'log': log}
    problems = []
    if stopped_at is not None:
        steps.append({'name': stopped_at, 'pass': False, 'ms': None,
                      'detail': f'the probe process stopped during this step: {how_it_ended(rc)}'})
        res['stopped_at'] = stopped_at
        res['signal'] = how_it_ended(rc) if rc is None or rc < 0 else None
        problems.append(f'the probe stopped at step {stopped_at}: {how_it_ended(rc)}')
    elif rc != 0:
        problems.append(f'vlm probe {how_it_ended(rc)}: {last_line(err)}')
    if not steps:
        problems.append('the probe log has no step')
    if not a.sim:
        bc = board_check_step(r, a, probe_log)
        if bc is not None:
            steps.append(bc)
    problems += [f"step {s['name']} failed: {s['detail']}" for s in steps
                 if not s['pass'] and s['name'] != stopped_at]
    res['pass'] = not problems
    res['problems'] = problems
    return res
