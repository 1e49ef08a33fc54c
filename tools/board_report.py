"""board-report.md from the report object of tools/board_acceptance.py: for the person holding
the board (what passed, every number beside its reference, what to do next)."""

import json
import os

SECTIONS = ['probe', 'environment', 'check', 'parity', 'contrast', 'timings', 'node']
WORD = {True: 'pass', False: '**FAIL**', None: 'skipped'}
LABEL = {
    'decode_tok_s': ('decode', 'tok/s'),
    'image_ttft_s': ('image TTFT', 's'),
    'text_ttft_s': ('31-token text TTFT', 's'),
}


def code(text, limit=240):
    """Model output, a path or an error as one inline code span: as it is when it is plain
    printable text, else JSON-escaped (any byte, U+0000 and newlines included); cut to
    `limit` characters, backticks replaced."""
    s = text if isinstance(text, str) else str(text)
    if not s.isprintable() or '`' in s or s != s.strip() or not s:
        s = json.dumps(s, ensure_ascii=False).replace('`', '\\u0060')
    if len(s) > limit:
        s = s[:limit] + '…'
    return '`' + s + '`'


def cell(text, limit=240):
    """`code` for a table cell: a `|` would end the cell, even inside a code span (GFM)."""
    return code(text, limit).replace('|', '\\|')


def plain(text, limit=1200):
    """Our own text (a probe step's detail) for a table cell: one line, `|` escaped."""
    s = ' '.join(str(text or '').split())
    if len(s) > limit:
        s = s[:limit] + '…'
    return s.replace('|', '\\|')


def gib(n):
    """A byte count for people: GiB, MiB or bytes."""
    if not isinstance(n, (int, float)):
        return 'unknown'
    if n >= 2**30:
        return f'{n / 2**30:.2f} GiB'
    if n >= 2**20:
        return f'{n / 2**20:.1f} MiB'
    return f'{n:,} bytes'


def yes(v):
    if v is None:
        return 'none'
    if isinstance(v, bool):
        return 'yes' if v else 'no'
    return str(v)


def num(v, unit, digits=2):
    return f'{v:.{digits}f} {unit}' if isinstance(v, (int, float)) else 'not measured'


def problems(sec):
    out = []
    if sec.get('error'):
        out.append(f"- error: {code(sec['error'], 600)}")
    out += [f'- problem: {code(p, 600)}' for p in sec.get('problems', [])]
    out += [f'- warning: {w}' for w in sec.get('warnings', [])]
    return out


def summary_line(name, sec):
    if sec.get('pass') is None:
        return sec.get('skipped', '')
    if sec.get('error'):
        return 'did not run to the end (see below)'
    if name == 'environment':
        lib = sec.get('libraries') or {}
        return (f"hbDNN {lib.get('dnn_version')}, hbUCP {lib.get('ucp_version')}; "
                f"ION {sec.get('ion', {}).get('verdict')}; performance mode: "
                f"{sec.get('performance_mode', {}).get('state', '?').split(' (')[0]}")
    if name == 'check':
        rep = sec.get('report') or {}
        return (f"{len(rep.get('graphs') or [])} graphs, {len(rep.get('violations') or [])} "
                f"violations (0 expected), ION pool: {(rep.get('memory') or {}).get('verdict')}, "
                f"prompt tail: {rep.get('prefill_tail')}"
                + (f" (pad rope {rep.get('pad_rope')}, pad mask {rep.get('pad_mask')})"
                   if rep.get('pad_rope') else '')
                + f", flush: {rep.get('flush')}")
    if name == 'parity':
        return (f"{sec.get('tokens_compared')} of {sec.get('tokens_wanted')} tokens compared, "
                f"first difference: {yes(sec.get('first_difference_at'))} "
                f"(prompt {sec.get('prompt_rows')} rows > chunk {sec.get('prefill_chunk')})")
    if name == 'probe':
        steps = sec.get('steps') or []
        bad = [st.get('name') for st in steps if st.get('pass') is not True]
        head = f"{len(steps)} steps, " + (f"failed: {', '.join(map(str, bad))}" if bad
                                          else 'all passed')
        if sec.get('stopped_at'):
            head += f"; stopped at {code(sec['stopped_at'])} ({sec.get('exit')})"
        return head
    if name == 'contrast':
        ka = sec.get('known_answer') or {}
        return (('the answers differ' if sec.get('pass') else 'the answers are the same')
                + f"; known answer {code(ka.get('expect'))}: "
                + {True: 'named', False: '**not named**', None: 'not judged'}[ka.get('pass')])
    if name == 'timings':
        parts = []
        for key, (label, unit) in LABEL.items():
            m = sec.get(key) or {}
            ref = m.get('published')
            parts.append(f"{label} {num(m.get('value'), unit)} (published "
                         f"{num(ref, unit) if ref else 'n/a'})")
        return '; '.join(parts)
    if name == 'node':
        peer = sec.get('peer') or {}
        return (f"{peer.get('tokens_streamed', 0)} tokens streamed on /ask, node exit "
                f"{sec.get('node_exit_code')} (0 expected)")
    return ''


def environment_md(sec):
    out = []
    if sec.get('pass') is None:
        out.append(f"Skipped: {sec.get('skipped')}.")
        return out
    lib = sec.get('libraries') or {}
    out += ['| what | found | expected |', '|---|---|---|',
            f"| user, OS, kernel | {sec.get('user')}, {sec.get('os')}, {sec.get('kernel')} "
            f"({sec.get('machine')}) | aarch64; board software ≥ 4.0.5 (seed card) |",
            f"| hbDNN | {lib.get('dnn_version')} | the board's libdnn.so |",
            f"| hbUCP | {lib.get('ucp_version')} | the board's libhbucp.so |",
            f"| SoC | {lib.get('soc')} | S100P (J6M, nash-m); the S100 (J6E) cannot load "
            'the 4B package |']
    for path in lib.get('libraries') or []:
        out.append(f'| library | {cell(path)} | |')
    ion = sec.get('ion') or {}
    out.append(f"| ION carveout | {gib(ion.get('available'))} ({ion.get('source')}) | "
               f"≥ {gib((ion.get('hbm_bytes') or 0) + (ion.get('buffer_bytes') or 0))} "
               f"(the package's .hbm files and buffers): {ion.get('verdict')} |")
    for node in ion.get('reserved_memory') or []:
        out.append(f"| reserved-memory {cell(node.get('name'))} | {gib(node.get('bytes'))} "
                   f"{node.get('error') or ''} | |")
    perf = sec.get('performance_mode') or {}
    regs = ', '.join(f'{k} = {v}' for k, v in (perf.get('registers') or {}).items())
    out.append(f"| BPU performance mode | {perf.get('state')}{': ' + regs if regs else ''} | "
               '0x99 in both registers (BLLM docs/MODELS.en.md) |')
    gov = (sec.get('cpu_governor') or {}).get('governors') or {}
    out.append('| CPU governor | ' + (', '.join(f'{g} on {len(c)} cores' for g, c in gov.items())
                                   or 'no cpufreq') + ' | performance (docs/board.md) |')
    for d in sec.get('devices') or []:
        if d.get('exists'):
            out.append(f"| {d['path']} | {d['mode']} {d['owner']}:{d['group']}, this user "
                       f"{'can' if d['read_write'] else '**cannot**'} read+write | read+write |")
        else:
            out.append(f"| {d['path']} | missing | present (seed card's device list) |")
    procs = sec.get('bpu_processes') or []
    out.append('| other BPU processes | ' + ('; '.join(f"{p['pid']}: {cell(p['cmdline'], 80)}"
                                                     for p in procs) or 'none')
               + ' | none (a second BPU LLM process can take the board down) |')
    out += ['', 'To set up what this section flags:', '',
            f"- ION: `{sec.get('ion_fix')}`",
            '- BPU performance mode (once per boot): ' +
            '; '.join(f'`{c}`' for c in perf.get('set_with') or []) +
            ('; to read it back: ' + '; '.join(f'`{c}`' for c in perf['read_with'])
             if perf.get('read_with') else ''),
            f"- CPU governor: `{(sec.get('cpu_governor') or {}).get('set_with')}`",
            '- devices: see docs/board.md, "Before the first run"']
    return out


def trials_md(trials):
    """The pad-marking calibration, one row per trial (every trial, chosen or not)."""
    if not trials:
        return []
    out = ['', '| pads | pad rope | pad mask | cosine next token | cosine one step later '
               '| top-1 agrees | chosen |', '|---|---|---|---|---|---|---|']
    for t in trials:
        cos = list(t.get('cosine') or []) + [None, None]
        fig = ['n/a' if c is None else f'{c:.4f}' for c in cos[:2]]
        out.append(f"| {t.get('layout')} | {t.get('rope')} | {t.get('mask')} | {fig[0]} | "
                   f"{fig[1]} | {yes(t.get('top1_agree'))} | "
                   f"{'**yes**' if t.get('chosen') else 'no'} |")
    return out + ['']


def check_md(sec):
    rep = sec.get('report') or {}
    if not rep:
        return []
    out = []
    m = rep.get('manifest') or {}
    out.append(f"Package {code(m.get('name'))}: cache_len {m.get('cache_len')} (seed: 4096 "
               f"ctx4k, 512 ctx512), prefill chunk {rep.get('prefill_chunk')} rows (seed: 32), "
               f"`prefill_pads` {yes(m.get('prefill_pads'))} (seed since 2026-11: yes), "
               f"`prefill_min_tail` {m.get('prefill_min_tail')} (seed: 5 ctx4k, 6 ctx512), "
               f"vision {yes(m.get('vision'))}; runtime: {rep.get('implementation')}.")
    d = rep.get('prefill_tail_decision') or {}
    marking = (f" (pad rope {rep.get('pad_rope')}, pad mask {rep.get('pad_mask')})"
               if rep.get('pad_rope') else '')
    out.append(f"Prompt tail: **{d.get('mode')}**{marking} (asked {d.get('requested')}): "
               f"{d.get('reason')}"
               + (' — calibration: ' + code(d.get('calibration'), 400) if d.get('calibration')
                  else ''))
    out += trials_md(rep.get('calibration_trials') or [])
    mem = rep.get('memory') or {}
    avail = 'unlimited' if mem.get('unlimited') else gib(mem.get('available'))
    out.append(f"ION pool: {avail} available ({mem.get('source')}), "
               f"{gib(mem.get('hbm_bytes'))} of .hbm + {gib(mem.get('buffer_bytes'))} of buffers "
               f"needed: **{mem.get('verdict')}** (seed: the 4B needs `bpu_first`)"
               + (f" — fix: `{mem.get('fix')}`" if mem.get('fix') else ''))
    out += ['', '| graph | file | inputs | outputs |', '|---|---|---|---|']
    for g in rep.get('graphs') or []:
        out.append(f"| {g.get('name')} | {os.path.basename(g.get('file') or '')} | "
                   f"{len(g.get('inputs') or [])} | {len(g.get('outputs') or [])} |")
    if rep.get('violations'):
        out += ['', 'Violations:'] + [f'- {code(v, 400)}' for v in rep['violations']]
    out += ['', '| file | bytes | sha256 |', '|---|---|---|']
    for f in sec.get('files') or []:
        link = f" → {cell(f['link_to'])}" if f.get('link_to') else ''
        out.append(f"| {f['name']}{link} | {f['bytes']:,} | `{f['sha256']}` |")
    out.append('')
    out.append('The whole `vlm check --report --json` output is under `check.report` in '
               'board-report.json.')
    return out


def parity_md(sec):
    runs = sec.get('runs') or {}
    if not runs:
        return []
    a, b = runs.get('prefill_graph', {}), runs.get('no_prefill_graph', {})
    return [
        f"Greedy, {sec.get('tokens_wanted')} new tokens (the first + a 48-token continuation), "
        f"text only, a {sec.get('prompt_rows')}-row prompt (one prefill chunk is "
        f"{sec.get('prefill_chunk')} rows). The model zoo's gate: identical with and without "
        'the prefill graph (`--no-prefill-graph`).', '',
        '| run | tokens | finish | first token | answer |', '|---|---|---|---|---|',
        f"| prefill graph | {len(a.get('tokens') or [])} | {a.get('finish_reason')} | "
        f"{(a.get('tokens') or [None])[0]} | {cell(a.get('answer'), 160)} |",
        f"| `--no-prefill-graph` | {len(b.get('tokens') or [])} | {b.get('finish_reason')} | "
        f"{(b.get('tokens') or [None])[0]} | {cell(b.get('answer'), 160)} |",
        '', f"First token equal: {yes(sec.get('first_token_equal'))} (yes expected); first "
        f"difference at token: {yes(sec.get('first_difference_at'))} (none expected). A near-tie "
        'can flip between two int8 graphs (seed card: "1+1等于几?" 0.502 vs 0.489); a '
        'difference is worth a report either way.',
    ] + flush_rerun_md(sec.get('flush_whole_rerun'))


def flush_rerun_md(rerun):
    """The parity rerun flushing whole buffers (made only when parity failed)."""
    if rerun is None:
        return []
    verdict = ('agree: range flushes are accepted but wrong on this runtime; run with '
               '`--flush whole` (node parameter `bpu_flush: whole`)' if rerun.get('pass')
               else f"still fail ({'; '.join(rerun.get('problems') or [rerun.get('error', '?')])})"
               ': not a flush problem')
    return ['', f"Rerun with `--flush whole` (parity failed with the default flushes): the "
            f"continuations {verdict}; first difference at token: "
            f"{yes(rerun.get('first_difference_at'))}."]


def contrast_md(sec):
    runs = sec.get('runs') or {}
    if not runs:
        return []
    w, wo = runs.get('with_image', {}), runs.get('without_image', {})
    return [
        f"Question {code(sec.get('question'))} about {code(sec.get('photo'))}, greedy:", '',
        '| run | prompt rows | answer |', '|---|---|---|',
        f"| with the photo | {w.get('prompt_tokens')} | {cell(w.get('answer'))} |",
        f"| without | {wo.get('prompt_tokens')} | {cell(wo.get('answer'))} |",
        '', 'Expected: different answers, the first about the photo (read them: a model that '
        'ignores the image still passes the mechanical check if its two answers differ).',
    ] + known_answer_md(sec.get('known_answer')) + (
        ['', 'Simulator run: the tiny random test model answers noise; only that the two '
         'answers differ means anything here.'] if sec.get('simulator') else [])


def known_answer_md(ka):
    if not ka:
        return []
    verdict = {True: 'pass', False: '**FAIL**', None: 'not judged (simulator: random weights)'}
    return ['', f"Known answer: {code(ka.get('question'))} about the real photo "
            f"{code(ka.get('photo'))} must contain {code(ka.get('expect'))} "
            f"(case-insensitive): answer {code(ka.get('answer') or '')} — "
            f"{verdict[ka.get('pass')]}"
            + (f" ({code(ka['error'], 400)})" if ka.get('error') else '') + '.',
            'This is reported beside the contrast check; `contrast.pass` is the with/without '
            'check alone.']


def probe_md(sec):
    steps = sec.get('steps') or []
    out = []
    if sec.get('stopped_at'):
        out += [f"**The probe stopped at step {code(sec['stopped_at'])}** "
                f"({sec.get('exit')}): the step's "
                'start line is the last one on disk, so this step is where the process died. '
                'Please send `board-report.json` and the probe log back.', '']
    out += ['Each step runs in a child process that writes its start line to disk before the '
            'step runs, so a crash still shows where it stopped.', '',
            '| step | result | ms | detail |', '|---|---|---|---|']
    for st in steps:
        ms = st.get('ms')
        out.append(f"| {st.get('name')} | {WORD.get(st.get('pass'), '?')} | "
                   f"{'' if ms is None else f'{ms:.1f}'} | {plain(st.get('detail'))} |")
    if sec.get('probe_log'):
        out += ['', f"Probe log (JSON lines): `logs/{os.path.basename(sec['probe_log'])}`"]
    return out


def timings_md(sec):
    if 'decode_tok_s' not in sec:
        return []
    ctx = sec.get('cache_len')
    out = []
    if sec.get('implementation') == 'simulator':
        out.append(f"**Simulator:** these are predictions of the BPU simulator's timing model "
                   f"(`BPU_SIM_TIMING={sec.get('sim_timing')}`) on a 4B-shaped package without "
                   'weights, not measurements of a board.')
    name = {4096: 'ctx4k', 512: 'ctx512'}.get(ctx, f'cache_len {ctx}: none published')
    out += ['', f"| measure | ours | published (seed package, {name}) | ours / published |",
            '|---|---|---|---|']
    for key, (label, unit) in LABEL.items():
        m = sec.get(key) or {}
        ratio = m.get('ratio')
        better = 'higher is better' if m.get('better') == 'higher' else 'lower is better'
        out.append(f"| {label} (`{key}`) | {num(m.get('value'), unit)} | "
                   f"{num(m.get('published'), unit) if m.get('published') else 'none published'}"
                   f" | {f'{ratio:.2f}' if ratio else '—'} ({better}) |")
    reps = sec.get('repeats')
    out += ['', f"How: `vlm bench --json`, {reps} run{'s (medians)' if reps != 1 else ''}, "
            f"{sec.get('max_new')} new tokens per run; text TTFT on exactly "
            f"{sec.get('text_prompt_rows')} prompt token ids (no template, as the seed "
            f"measures it); image TTFT on {code(sec.get('photo'))} ({sec.get('image_prompt_rows')} "
            f"prompt rows); prompt tail {sec.get('prefill_tail')}; load "
            f"{num(sec.get('load_s'), 's')} (published: 15.02 s ctx4k / 14.59 s ctx512).",
            f"Published: {sec.get('published_source')}; its image TTFT is on a COCO cats photo "
            'with its own question (not published), so that ratio is approximate. The text '
            'TTFT reference is the padded-tail figure when the package sets `prefill_pads` '
            '(0.75 s ctx4k / 0.78 s ctx512), else the stepped one (5.09 s / 4.24 s). '
            'Decode below the published figure: check the BPU performance mode first.']
    return out


def node_md(sec, doc):
    peer = sec.get('peer') or {}
    image_ttft = ((doc.get('timings') or {}).get('image_ttft_s') or {}).get('value')
    rows = ((((doc.get('contrast') or {}).get('runs') or {}).get('with_image') or {})
            .get('prompt_tokens'))
    sim = (((doc.get('environment') or {}).get('run') or {}).get('mode')) == 'sim'
    out = [f"`vlm_node` in namespace `{sec.get('namespace')}` (ROS_DOMAIN_ID "
           f"{sec.get('ros_domain_id')}, ROS {sec.get('ros_distro')}), one camera frame on "
           f"`{sec.get('namespace')}/image_raw`, one `/ask` (greedy) answered over the graph."]
    if peer:
        fr = peer.get('frame') or {}
        out += ['', '| what | found | expected |', '|---|---|---|',
                f"| frame | {fr.get('width')}×{fr.get('height')} {fr.get('encoding')}, "
                f"{peer.get('frames_sent')} sent | the answer's image_width/height equal it |",
                f"| image_source | {cell(peer.get('image_source'))} | the camera topic |",
                f"| tokens streamed | {peer.get('tokens_streamed')} (indices in order, the "
                f"last one flagged `last`) | one per text piece: at most the "
                f"{peer.get('completion_tokens')} completion tokens |",
                f"| prompt tokens | {peer.get('prompt_tokens')} | {rows}, as in contrast with the "
                'photo (same question) |',
                f"| TTFT | {num(peer.get('ttft_s'), 's', 3)} | compare the image TTFT of timings, "
                f"{num(image_ttft, 's', 3)} ("
                + ('measured on the 4B-shaped package, not this one)' if sim else
                   'same photo and question; the node may priming the newest frame before an '
                   'ask)') + ' |',
                f"| answer | {cell(peer.get('answer'))} | the tokens' text, joined |",
                f"| finish | {peer.get('finish_reason')} | stop or length |"]
    out.append(f"\nNode exit code: {sec.get('node_exit_code')} (0 expected: it is stopped with "
               'SIGTERM once the ask is answered).')
    return out


def markdown(doc):
    env = doc.get('environment') or {}
    run = env.get('run') or {}
    failed = [s for s in SECTIONS if (doc.get(s) or {}).get('pass') is False]
    sim = run.get('mode') == 'sim'
    lines = ['# bpu_vlm board acceptance report', '']
    lines.append(f"**{'FAIL: ' + ', '.join(failed) if failed else 'PASS'}** — "
                 f"{'simulator run (`--sim`), no board' if sim else 'board run'}; "
                 f"commit {run.get('commit')}; {run.get('finished_utc')}; host "
                 f"{code(run.get('host'))}.")
    lines.append('')
    lines.append(f"Package: {code(run.get('package'))}"
                 + (f"; timings on {code(run.get('timing_package'))}"
                    if run.get('timing_package') else '')
                 + (f"; node: {code(run.get('vlm_node'))}" if run.get('vlm_node') else '') + '.')
    if not sim:
        lines += ['', 'Please send this file and `board-report.json` (same folder) back: they '
                  'hold no credentials, only versions, sizes, hashes, timings and the model\'s '
                  'answers. The `logs/` folder beside them has every command\'s full output.']
    lines += ['', '| section | result | in short |', '|---|---|---|']
    for s in SECTIONS:
        sec = doc.get(s) or {}
        secs = f" ({sec['seconds']} s)" if 'seconds' in sec else ''
        lines.append(f"| [{s}](#{s}) | {WORD.get(sec.get('pass'), '?')}{secs} | "
                     f'{summary_line(s, sec)} |')
    render = {'probe': probe_md, 'environment': environment_md, 'check': check_md, 'parity': parity_md,
              'contrast': contrast_md, 'timings': timings_md, 'node': node_md}
    for s in SECTIONS:
        sec = doc.get(s) or {}
        lines += ['', f'## {s}', '', f"Result: {WORD.get(sec.get('pass'), '?')}"]
        p = problems(sec)
        if p:
            lines += [''] + p
        body = render[s](sec, doc) if s == 'node' else render[s](sec)
        if body:
            lines += [''] + body
        logs = [f'`logs/{os.path.basename(sec[k])}`' for k in ('log', 'peer_log') if sec.get(k)]
        if logs:
            lines += ['', 'Log: ' + ', '.join(logs)]
    setup = run.get('setup') or {}
    if setup:
        lines += ['', '## setup', '', '| step | seconds |', '|---|---|']
        lines += [f'| {k} | {v} |' for k, v in setup.items()]
    return '\n'.join(lines) + '\n'
