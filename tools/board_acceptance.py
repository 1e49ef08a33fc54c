"""The sections of tools/board-acceptance.sh: runs them, writes board-report.json and
board-report.md, exits 1 when a section that ran did not pass.

Run by the shell script (which bootstraps ROS, builds the binaries and, with --sim, makes
the simulator packages); see `tools/board-acceptance.sh --help`. Published figures come
from the seed package's card (HF ruisv/bllm-qwen3.5-4b), restated in BENCHMARKS.md.
"""

import argparse
import datetime
import grp
import hashlib
import json
import math
import os
import platform
import pwd
import random
import signal
import subprocess
import sys
import time

import board_probe
import board_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A prompt that is longer than one prefill chunk (32 rows) with any Qwen tokenizer, before
# the chat template adds its rows.
PARITY_PROMPT = (
    'A mobile robot drives slowly along a warehouse aisle. On its left there are three '
    'shelves with blue boxes, on its right a yellow safety line and a forklift parked next '
    'to a charging station. A person in an orange vest walks towards the robot carrying a '
    'ladder. Describe what the robot should do next and why, step by step.')
CONTRAST_PROMPT = 'What is in this picture? Answer in one sentence.'
# A real photo with a narrow answer (tools/fixtures/images/chelsea.png, CC0): on a board the
# answer must name the animal. The simulator's random weights cannot, so there it is not judged.
KNOWN_ANSWER_PHOTO = os.path.join(ROOT, 'tools', 'fixtures', 'images', 'chelsea.png')
KNOWN_ANSWER_QUESTION = 'What animal is this? Answer with one word.'
KNOWN_ANSWER_EXPECT = 'cat'
KNOWN_ANSWER_NEW = 16
PARITY_NEW = 49  # the first token and a 48-token greedy continuation
CONTRAST_NEW = 24
TEXT_TTFT_ROWS = 31

# Greedy with no penalties: the continuation depends on the logits alone.
GREEDY = ['--temperature', '0', '--no-think', '--presence-penalty', '0',
          '--repetition-penalty', '1', '--frequency-penalty', '0']

# Published figures of the seed package, per context length (seed-package.md: "Measured on
# the board" for decode and image TTFT, 3 runs in performance mode, COCO cats photo and its
# own question; the 2026-11 update table for the 31-token text TTFT, padded tail with
# bllm 0.8.0 / stepped tail with bllm <= 0.7.0).
PUBLISHED = {
    4096: {'decode_tok_s': 6.14, 'image_ttft_s': 3.29, 'text_ttft_s': {True: 0.75, False: 5.09}},
    512: {'decode_tok_s': 7.54, 'image_ttft_s': 2.93, 'text_ttft_s': {True: 0.78, False: 4.24}},
}
PUBLISHED_SOURCE = ('seed package card (HF ruisv/bllm-qwen3.5-4b): S100P, performance mode, '
                    'board software 4.0.5')

# Device nodes a BLLM package needs in a container (seed package card, Docker section).
DEVICES = ['/dev/bpu', '/dev/bpu_core0', '/dev/ion', '/dev/ipcdrv', '/dev/dcore0_rpmsg_bpu']
# BLLM docs/MODELS.en.md (ruisv/bllm@c57382d): performance mode, once per boot.
PERF_REGS = ['0x2b047000', '0x2b047004']
PERF_VALUE = 0x99
PERF_SET = [f'sudo /usr/bin/busybox devmem {r} 32 0x99' for r in PERF_REGS]
GOVERNOR_SET = 'echo performance | sudo tee /sys/devices/system/cpu/cpufreq/policy*/scaling_governor'
ION_FIX = 'sudo /usr/hobot/bin/hb_switch_ion.sh bpu_first && sudo reboot'


class Runner:
    """Runs the tools, each with its output kept in OUT/logs/."""

    def __init__(self, out, env):
        self.logs = os.path.join(out, 'logs')
        os.makedirs(self.logs, exist_ok=True)
        self.env = env
        self.n = 0

    def run(self, name, cmd, env=None, timeout=1800):
        self.n += 1
        log = os.path.join(self.logs, f'{self.n:02d}-{name}.log')
        full_env = dict(self.env, **(env or {}))
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, env=full_env, capture_output=True, timeout=timeout)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = None, e.stdout or b'', (e.stderr or b'') + b'\n[timed out]'
        dt = time.monotonic() - t0
        with open(log, 'wb') as f:
            f.write(('$ ' + ' '.join(cmd) + '\n').encode())
            f.write(f'exit {rc} after {dt:.1f} s\n--- stdout\n'.encode() + out)
            f.write(b'\n--- stderr\n' + err)
        return rc, out.decode('utf-8', 'replace'), err.decode('utf-8', 'replace'), log


def last_json(text):
    """The JSON object the tools print: the whole of `text` (`vlm check` pretty-prints), else
    its last line that parses as one (`vlm chat` prints one line per turn)."""
    try:
        v = json.loads(text)
        if isinstance(v, dict):
            return v
    except ValueError:
        pass
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith('{'):
            try:
                v = json.loads(line)
            except ValueError:
                continue
            if isinstance(v, dict):
                return v
    return None


def tail(text, n=6):
    return '\n'.join(text.strip().splitlines()[-n:])


def failed(what, rc, err, log):
    return {'pass': False, 'error': f'{what} exited {rc}: {tail(err, 1)}', 'log': log}


# ------------------------------------------------------------------------------ sections

def section_check(r, a):
    rc, out, err, log = r.run('check', [a.vlm, 'check', a.package, '--report', '--json'])
    rep = last_json(out)
    if rep is None:
        return failed('vlm check --report --json', rc, err, log)
    files = []
    for name in sorted(os.listdir(a.package)):
        path = os.path.join(a.package, name)
        if not os.path.isfile(path):
            continue
        h = hashlib.sha256()
        with open(path, 'rb') as f:
            for block in iter(lambda: f.read(1 << 22), b''):
                h.update(block)
        entry = {'name': name, 'bytes': os.path.getsize(path), 'sha256': h.hexdigest()}
        if os.path.islink(path):
            entry['link_to'] = os.path.realpath(path)
        files.append(entry)
    memory = rep.get('memory') or {}
    problems = []
    if rc != 0:
        problems.append(f'vlm check exited {rc}')
    if rep.get('runtime_error'):
        problems.append(f"runtime: {rep['runtime_error']}")
    if rep.get('violations'):
        problems.append(f"{len(rep['violations'])} contract violation(s)")
    if memory.get('verdict') == 'too small':
        problems.append('the ION pool is too small for the package')
    return {
        'pass': not problems,
        'problems': problems,
        'report': rep,
        'files': files,
        'log': log,
    }


def read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def ancestors():
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        stat = read_text(f'/proc/{pid}/stat')
        if not stat:
            break
        pid = int(stat.rsplit(')', 1)[1].split()[1])
    return pids


def program_name(argv):
    """The program a command line runs: the executable's base name, or for a Python
    interpreter the script's (or `-m` module's) name."""
    base = os.path.basename(argv[0])
    if not base.startswith('python'):
        return base
    args = iter(argv[1:])
    for x in args:
        if x == '-m':
            return next(args, base)
        if x in ('-c', '-'):
            return base
        if x.startswith('-m') and len(x) > 2:
            return x[2:]
        if x in ('-W', '-X', '-Q'):
            next(args, None)
        elif not x.startswith('-'):
            return os.path.basename(x)
    return base


def is_bpu_program(name):
    name = name.lower()
    if name.endswith('.py'):
        name = name[:-3]
    return name in ('vlm_node', 'vlm', 'bllm') or name.startswith(('bllm_', 'bllm-', 'bllm.'))


def bpu_processes():
    """Other processes that may hold the BPU, by the program they run (bllm, vlm_node, vlm),
    and, apart, the other command lines that merely name bllm (`tail -f bllm.log`, an
    editor, a grep): those are listed, not counted."""
    mine, found, mentions = ancestors(), [], []
    for d in os.listdir('/proc'):
        if not d.isdigit() or int(d) in mine:
            continue
        try:
            with open(f'/proc/{d}/cmdline', 'rb') as f:
                argv = [x.decode('utf-8', 'replace') for x in f.read().split(b'\0') if x]
        except OSError:
            continue
        if not argv:
            continue
        entry = {'pid': int(d), 'cmdline': ' '.join(argv)[:200]}
        if is_bpu_program(program_name(argv)):
            found.append(entry)
        elif any('bllm' in x.lower() for x in argv):
            mentions.append(entry)
    return found, mentions


def device_info(path):
    try:
        st = os.stat(path)
    except OSError:
        return {'path': path, 'exists': False}
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return {'path': path, 'exists': True, 'mode': oct(st.st_mode & 0o777), 'owner': owner,
            'group': group, 'read_write': os.access(path, os.R_OK | os.W_OK)}


def perf_mode(r):
    """Reads the performance-mode registers without running anything else as root: directly
    when this is root (--allow-root), else through `sudo -n` (only when sudo needs no
    password); otherwise says which commands read them."""
    busybox = '/usr/bin/busybox'
    regs = {}
    read_with = [f'sudo {busybox} devmem {reg} 32' for reg in PERF_REGS]
    base = {'registers': regs, 'set_with': PERF_SET, 'read_with': read_with}
    if not os.path.exists(busybox):
        return dict(base, state=f'not read ({busybox} not found)')
    prefix = [] if os.geteuid() == 0 else ['sudo', '-n']
    for reg in PERF_REGS:
        try:
            rc, out, err, _log = r.run('devmem', prefix + [busybox, 'devmem', reg, '32'],
                                       timeout=30)
        except OSError as e:  # no sudo on this system
            rc, out, err = None, '', str(e)
        if rc != 0 and prefix:
            return dict(base, state='not read (it needs root, and `sudo -n` could not run it: '
                                    f'{tail(err, 1) or "no sudo"}; run the read_with commands)')
        try:
            regs[reg] = int(out.strip(), 16) if rc == 0 else None
        except ValueError:
            regs[reg] = None
    ok = all(v == PERF_VALUE for v in regs.values())
    return dict(base, state='set (both registers read 0x99)' if ok else 'not set',
                registers={k: (hex(v) if v is not None else None) for k, v in regs.items()})


def governors():
    base = '/sys/devices/system/cpu'
    seen = {}
    for d in sorted(os.listdir(base)):
        if d.startswith('cpu') and d[3:].isdigit():
            g = read_text(f'{base}/{d}/cpufreq/scaling_governor')
            if g is not None:
                seen.setdefault(g, []).append(int(d[3:]))
    return seen


def section_environment(r, a, rep):
    if a.sim:
        return {'pass': None, 'skipped': 'simulator run (--sim): no board to inspect'}
    runtime = (rep or {}).get('runtime') or {}
    memory = (rep or {}).get('memory') or {}
    problems, warnings = [], []
    if runtime.get('source') in (None, 'bpu-sim'):
        problems.append('the board libraries (libdnn.so, libhbucp.so) were not loaded: '
                        f"{(rep or {}).get('runtime_error') or 'see the check section'}")
    if runtime.get('missing_entry_points'):
        warnings.append('missing entry points: ' + ', '.join(runtime['missing_entry_points']))
    verdict = memory.get('verdict')
    if verdict == 'too small':
        problems.append(f'the ION carveout cannot hold the package: {ION_FIX}')
    elif verdict != 'fits':
        warnings.append(f'the ION carveout size could not be read ({memory.get("source")})')
    devices = [device_info(p) for p in sorted(set(DEVICES) | set(
        os.path.join('/dev', d) for d in os.listdir('/dev') if d.startswith('bpu')))]
    by_path = {d['path']: d for d in devices}
    for need in ('/dev/ion', '/dev/bpu'):
        if not any(d['exists'] for p, d in by_path.items() if p.startswith(need)):
            problems.append(f'{need}* does not exist')
    no_access = [d['path'] for d in devices if d['exists'] and not d['read_write']]
    if no_access:
        problems.append('this user cannot read and write ' + ', '.join(no_access))
    others, mentions = bpu_processes()
    if others:
        problems.append('another BPU process is running: ' +
                        '; '.join(f"{o['pid']} {o['cmdline']}" for o in others))
    if mentions:
        warnings.append('running commands that name bllm without running it (check they do not '
                        'hold the BPU): ' +
                        '; '.join(f"{o['pid']} {o['cmdline']}" for o in mentions))
    perf = perf_mode(r)
    if perf['state'] == 'not set':
        warnings.append('BPU performance mode is not set: decode runs slower than published')
    gov = governors()
    if gov and set(gov) != {'performance'}:
        warnings.append('CPU governor is not `performance` on every core')
    os_name = None
    for line in (read_text('/etc/os-release') or '').splitlines():
        if line.startswith('PRETTY_NAME='):
            os_name = line.split('=', 1)[1].strip('"')
    return {
        'pass': not problems,
        'problems': problems,
        'warnings': warnings,
        'user': pwd.getpwuid(os.geteuid()).pw_name,
        'os': os_name,
        'kernel': platform.release(),
        'machine': platform.machine(),
        'libraries': {k: runtime.get(k) for k in ('source', 'libraries', 'dnn_version',
                                                  'ucp_version', 'soc', 'missing_entry_points')},
        'ion': {k: memory.get(k) for k in ('source', 'available', 'hbm_bytes', 'buffer_bytes',
                                           'verdict', 'reserved_memory', 'fix')},
        'ion_fix': ION_FIX,
        'performance_mode': perf,
        'cpu_governor': {'governors': gov, 'set_with': GOVERNOR_SET},
        'devices': devices,
        'bpu_processes': others,
        'bllm_mentions': mentions,
    }


def chat(r, a, name, extra, new_tokens, prompt):
    cmd = [a.vlm, 'chat', a.package, '--json', '--max-new-tokens', str(new_tokens)] + GREEDY
    rc, out, err, log = r.run(name, cmd + extra + ['-p', prompt])
    res = last_json(out)
    return rc, res, err, log


def parity_runs(r, a, chunk, flags, tag):
    """The prompt with and without the prefill graph under `flags`; the section's result."""
    runs = {}
    for key, extra in (('prefill_graph', []), ('no_prefill_graph', ['--no-prefill-graph'])):
        rc, res, err, log = chat(r, a, f'parity-{key}{tag}', ['--no-vision'] + flags + extra,
                                 PARITY_NEW, PARITY_PROMPT)
        if rc != 0 or res is None:
            return failed(f'vlm chat ({key}{tag})', rc, err, log)
        runs[key] = {'tokens': res.get('tokens') or [], 'answer': res.get('answer', ''),
                     'prompt_tokens': res.get('prompt_tokens'),
                     'finish_reason': res.get('finish_reason'), 'log': log}
    a_t, b_t = runs['prefill_graph']['tokens'], runs['no_prefill_graph']['tokens']
    first_diff = next((i for i, (x, y) in enumerate(zip(a_t, b_t)) if x != y),
                      None if len(a_t) == len(b_t) else min(len(a_t), len(b_t)))
    prompt_rows = runs['prefill_graph']['prompt_tokens'] or 0
    problems = []
    if prompt_rows <= chunk:
        problems.append(f'the prompt ({prompt_rows} rows) is not longer than one chunk ({chunk})')
    if not a_t:
        problems.append('no token was generated')
    if first_diff is not None:
        problems.append(f'the continuations differ from token {first_diff} on')
    return {
        'pass': not problems,
        'problems': problems,
        'prompt_rows': prompt_rows,
        'prefill_chunk': chunk,
        'tokens_compared': min(len(a_t), len(b_t)),
        'tokens_wanted': PARITY_NEW,
        'first_token_equal': bool(a_t and b_t and a_t[0] == b_t[0]),
        'first_difference_at': first_diff,
        'runs': runs,
    }


def section_parity(r, a, rep):
    chunk = (rep or {}).get('prefill_chunk') or 32
    res = parity_runs(r, a, chunk, [], '')
    # A runtime may accept a flush of part of a buffer and get it wrong, which the probe at
    # open cannot see: when parity fails with range flushes, it is run again flushing whole
    # buffers. Both are kept; the section's verdict stays the default's.
    if res.get('pass') is False and (rep or {}).get('flush') != 'whole':
        rerun = parity_runs(r, a, chunk, ['--flush', 'whole'], '-flush-whole')
        res['flush_whole_rerun'] = rerun
        if rerun.get('pass'):
            res.setdefault('problems', []).append(
                'with --flush whole the continuations agree: this runtime accepts flushes of '
                'part of a buffer but gets them wrong; run with --flush whole (node parameter '
                'bpu_flush: whole)')
    return res


def section_contrast(r, a):
    runs = {}
    for key, extra in (('with_image', ['--image', a.photo]), ('without_image', [])):
        rc, res, err, log = chat(r, a, f'contrast-{key}', extra, CONTRAST_NEW, CONTRAST_PROMPT)
        if rc != 0 or res is None:
            return failed(f'vlm chat ({key})', rc, err, log)
        runs[key] = {'tokens': res.get('tokens') or [], 'answer': res.get('answer', ''),
                     'prompt_tokens': res.get('prompt_tokens'), 'log': log}
    differ = runs['with_image']['tokens'] != runs['without_image']['tokens']
    problems = [] if differ else ['the answers with and without the image are the same']
    known = known_answer(r, a)
    warnings = []
    if known['pass'] is False or known.get('error'):
        # Beside the contrast check, which alone decides `contrast.pass`.
        warnings.append(known.get('error') or
                        f"known answer: {KNOWN_ANSWER_EXPECT!r} is not in the answer "
                        f"{known['answer']!r} about {known['photo']}")
    return {
        'pass': differ and bool(runs['with_image']['tokens']),
        'problems': problems,
        'warnings': warnings,
        'photo': os.path.relpath(a.photo, ROOT) if a.photo.startswith(ROOT) else a.photo,
        'question': CONTRAST_PROMPT,
        'simulator': a.sim,
        'runs': runs,
        'known_answer': known,
    }


def known_answer(r, a):
    """The real photo's question: `pass` is whether the answer contains the expected word
    (case-insensitive) on a board, null on the simulator (random weights answer at random)."""
    rc, res, err, log = chat(r, a, 'contrast-known-answer', ['--image', KNOWN_ANSWER_PHOTO],
                             KNOWN_ANSWER_NEW, KNOWN_ANSWER_QUESTION)
    answer = res.get('answer', '') if res is not None else None
    out = {
        'question': KNOWN_ANSWER_QUESTION,
        'expect': KNOWN_ANSWER_EXPECT,
        'answer': answer,
        'pass': None,
        'photo': os.path.relpath(KNOWN_ANSWER_PHOTO, ROOT),
        'log': log,
    }
    if rc != 0 or res is None:
        out['error'] = f'known answer: vlm chat exited {rc}: {tail(err, 1)}'
        if not a.sim:
            out['pass'] = False
        return out
    if not a.sim:
        out['pass'] = KNOWN_ANSWER_EXPECT in (answer or '').lower()
    return out


def published_for(package):
    try:
        with open(os.path.join(package, 'model.json')) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        manifest = {}
    ctx = manifest.get('cache_len') if isinstance(manifest, dict) else None
    pads = bool(manifest.get('prefill_pads')) if isinstance(manifest, dict) else False
    pub = PUBLISHED.get(ctx)
    if pub is None:
        return ctx, pads, None
    return ctx, pads, {'decode_tok_s': pub['decode_tok_s'], 'image_ttft_s': pub['image_ttft_s'],
                       'text_ttft_s': pub['text_ttft_s'][pads]}


def section_timings(r, a):
    pkg = a.timing_package or a.package
    cmd = [a.vlm, 'bench', pkg, '--json', '--repeats', str(a.repeats), '--max-new',
           str(a.max_new), '--prompt-tokens', str(TEXT_TTFT_ROWS), '--image', a.photo]
    env = {}
    if a.sim:
        # A package without weights cannot calibrate its pad layout: name the one it was
        # built with (make-sim-package --pad-layout first), as BENCHMARKS.md does.
        cmd += ['--prefill-tail', 'pads_first']
        env['BPU_SIM_TIMING'] = a.sim_timing
    rc, out, err, log = r.run('timings', cmd, env=env)
    res = last_json(out)
    if rc != 0 or res is None:
        return failed('vlm bench', rc, err, log)
    ctx, pads, pub = published_for(pkg)
    metrics, problems = {}, []
    for key, better in (('decode_tok_s', 'higher'), ('image_ttft_s', 'lower'),
                        ('text_ttft_s', 'lower')):
        v = res.get(key)
        ok = isinstance(v, (int, float)) and math.isfinite(v) and v > 0
        if not ok:
            problems.append(f'{key} was not measured')
        ref = pub[key] if pub else None
        metrics[key] = {'value': v if ok else None, 'published': ref,
                        'ratio': (v / ref) if ok and ref else None, 'better': better}
    return {
        'pass': not problems,
        'problems': problems,
        'package': pkg,
        'cache_len': ctx,
        'prefill_pads': pads,
        'implementation': res.get('implementation'),
        'sim_timing': res.get('sim_timing'),
        'published_source': PUBLISHED_SOURCE,
        **metrics,
        'text_prompt_rows': res.get('text_prompt_rows'),
        'image_prompt_rows': res.get('image_prompt_rows'),
        'prefill_tail': res.get('prefill_tail'),
        'load_s': res.get('load_s'),
        'repeats': res.get('repeats'),
        'max_new': a.max_new,
        'photo': os.path.relpath(a.photo, ROOT) if a.photo.startswith(ROOT) else a.photo,
        'log': log,
    }


def section_node(r, a):
    domain = os.environ.get('BOARD_ACCEPTANCE_DOMAIN') or str(random.randint(40, 99))
    ns = '/board_acceptance'
    # Discovery stays on this machine: the acceptance node must not join a robot's graph.
    local = ({'ROS_LOCALHOST_ONLY': '1'} if os.environ.get('ROS_DISTRO') == 'humble'
             else {'ROS_AUTOMATIC_DISCOVERY_RANGE': 'LOCALHOST'})
    env = dict(r.env, ROS_DOMAIN_ID=domain, **local)
    node_log = os.path.join(r.logs, 'node.log')
    peer_log = os.path.join(r.logs, 'node-peer.log')
    cmd = [a.node, '--ros-args', '-r', f'__ns:={ns}', '--params-file',
           os.path.join(ROOT, 'launch', 'vlm_params.yaml'), '-p', f'model_dir:={a.package}']
    profile = os.path.join(ROOT, 'launch', 'fastdds_large_frames.xml')
    peer_cmd = [a.peer_python, os.path.join(ROOT, 'tools', 'board_node_peer.py'), '--ns', ns,
                '--photo', a.photo, '--timeout', str(a.node_timeout)]
    peer_env = dict(r.env, ROS_DOMAIN_ID=domain, FASTRTPS_DEFAULT_PROFILES_FILE=profile,
                    FASTDDS_DEFAULT_PROFILES_FILE=profile, **local)
    node_died = timed_out = False
    peer = None
    # The peer ends itself after its timeout; this deadline holds when it hangs anyway (a
    # stuck DDS shutdown, say), with a minute for its start-up and its own report.
    deadline = time.monotonic() + a.node_timeout + 60
    with open(node_log, 'wb') as log, open(peer_log, 'w+b') as plog:
        log.write(('$ ' + ' '.join(cmd) + '\n').encode())
        log.flush()
        node = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            peer = subprocess.Popen(peer_cmd, env=peer_env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=plog)
            # The peer waits up to its timeout for /ask; a node that exits first (a bad
            # package, a refused ION pool) ends the wait at once.
            out = b''
            while peer.poll() is None:
                if node.poll() is not None:
                    node_died = True
                    peer.kill()
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    peer.kill()
                    break
                time.sleep(0.2)
            out = peer.communicate()[0]
            rc = peer.returncode
        finally:
            # Also on Ctrl-C or a crash here: neither process may outlive the section.
            if peer is not None and peer.poll() is None:
                peer.kill()
                peer.wait()
            if node.poll() is None:
                node.send_signal(signal.SIGTERM)
            try:
                node_rc = node.wait(timeout=30)
            except subprocess.TimeoutExpired:
                node.kill()
                node_rc = node.wait()
        plog.seek(0)
        err = plog.read().decode('utf-8', 'replace')
        plog.write(b'\n--- stdout\n' + out)
    rep = None
    for line in out.decode('utf-8', 'replace').splitlines():
        if line.startswith('REPORT '):
            rep = json.loads(line[len('REPORT '):])
    problems = []
    if node_died:
        with open(node_log, encoding='utf-8', errors='replace') as f:
            last = tail(f.read(), 1)
        problems.append(f'vlm_node exited {node_rc} before the ask was answered: {last}')
    else:
        if timed_out:
            problems.append(f'the ROS 2 peer did not end within {a.node_timeout + 60:.0f} s '
                            '(its timeout + 60 s) and was killed')
        elif rc != 0 or rep is None:
            problems.append(f'the ROS 2 peer failed (exit {rc}): {tail(err, 1)}')
        if node_rc != 0:
            problems.append(f'vlm_node exited {node_rc} after SIGTERM (0 expected)')
    return {
        'pass': not problems,
        'problems': problems,
        'namespace': ns,
        'ros_domain_id': int(domain),
        'ros_distro': os.environ.get('ROS_DISTRO'),
        'node_exit_code': node_rc,
        'peer': rep,
        'log': node_log,
        'peer_log': peer_log,
    }


def guarded(name, fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # a crash of one section is that section's failure
        return {'pass': False, 'error': f'{name}: {type(e).__name__}: {e}'}


def git_describe():
    try:
        rev = subprocess.run(['git', '-C', ROOT, 'rev-parse', '--short', 'HEAD'],
                             capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(['git', '-C', ROOT, 'status', '--porcelain', '--untracked-files=no'],
                               capture_output=True, text=True).stdout.strip()
        return rev + (' (with uncommitted changes)' if dirty else '') if rev else None
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--out', required=True)
    ap.add_argument('--vlm', required=True)
    ap.add_argument('--node', required=True)
    ap.add_argument('--peer-python', required=True)
    ap.add_argument('--package', required=True)
    ap.add_argument('--timing-package')
    ap.add_argument('--photo', required=True)
    ap.add_argument('--sim', action='store_true')
    ap.add_argument('--sim-timing', default='s100p')
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--max-new', type=int, default=32)
    ap.add_argument('--node-timeout', type=float, default=300.0)
    ap.add_argument('--setup', help='JSON file with the setup steps the shell script timed')
    a = ap.parse_args()
    a.package = os.path.abspath(a.package)
    a.photo = os.path.abspath(a.photo)
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ)
    env.pop('BPU_SIM_TIMING', None)  # only the timings section runs with a timing model
    r = Runner(a.out, env)
    t_all = time.monotonic()
    durations = {}

    def timed(name, fn, *args):
        t0 = time.monotonic()
        res = guarded(name, fn, *args)
        durations[name] = round(time.monotonic() - t0, 1)
        print(f'[board-acceptance] {name}: '
              f"{ {True: 'pass', False: 'FAIL', None: 'skipped'}.get(res.get('pass'), '?') } "
              f'({durations[name]} s)', flush=True)
        return res

    probe = timed('probe', board_probe.section_probe, r, a)
    check = timed('check', section_check, r, a)
    rep = check.get('report')
    result = {
        'probe': probe,
        'environment': timed('environment', section_environment, r, a, rep),
        'check': check,
        'parity': timed('parity', section_parity, r, a, rep),
        'contrast': timed('contrast', section_contrast, r, a),
        'timings': timed('timings', section_timings, r, a),
        'node': timed('node', section_node, r, a),
    }
    for name, seconds in durations.items():
        result[name]['seconds'] = seconds
    setup = {}
    if a.setup and os.path.exists(a.setup):
        with open(a.setup) as f:
            setup = json.load(f)
    # What ran where: under `environment`, the section about the machine (the report has
    # exactly the seven section keys).
    result['environment']['run'] = {
        'mode': 'sim' if a.sim else 'board',
        'package': a.package,
        'timing_package': a.timing_package,
        'vlm_node': a.node,
        'commit': git_describe(),
        'finished_utc': datetime.datetime.now(datetime.timezone.utc).strftime(
            '%Y-%m-%d %H:%M UTC'),
        'host': platform.node(),
        'sections_seconds': round(time.monotonic() - t_all, 1),
        'setup': setup,
    }
    with open(os.path.join(a.out, 'board-report.json'), 'w') as f:
        json.dump(result, f, indent=2, ensure_ascii=True)
        f.write('\n')
    with open(os.path.join(a.out, 'board-report.md'), 'w') as f:
        f.write(board_report.markdown(result))
    bad = [k for k, v in result.items() if v.get('pass') is False]
    print(f"[board-acceptance] wrote {os.path.join(a.out, 'board-report.md')} and "
          f"board-report.json; {'FAILED: ' + ', '.join(bad) if bad else 'every section that ran passed'}",
          flush=True)
    sys.exit(1 if bad else 0)


if __name__ == '__main__':
    main()
