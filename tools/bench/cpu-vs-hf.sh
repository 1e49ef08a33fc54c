#!/usr/bin/env bash
# Qwen3.5 on the CPU: crates/qwen35 (bf16 weights, bf16×f32 kernels) vs HF transformers
# (bf16 weights, torch CPU) on the same Qwen3.5-0.8B-shaped text model with random weights,
# in one run. Each side runs in its own process (clean peak RSS) with the same thread count.
#
#   tools/bench/cpu-vs-hf.sh                 # THREADS=2 PROMPT=512 DECODE=32 REPEATS=2
#   THREADS=1 DECODE=16 tools/bench/cpu-vs-hf.sh
#
# Needs the pinned venv tools/fixtures/.venv (tools/fixtures/setup.sh). Writes the two JSON
# results to $OUT (default: a temporary directory) and prints a table with the ratios.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
THREADS="${THREADS:-2}"
PROMPT="${PROMPT:-512}"
DECODE="${DECODE:-32}"
REPEATS="${REPEATS:-2}"
CONFIG="${CONFIG:-$ROOT/tools/bench/qwen35-0.8b-text.json}"
PY="${PY:-$ROOT/tools/fixtures/.venv/bin/python}"
OUT="${OUT:-$(mktemp -d)}"

[ -x "$PY" ] || { echo "missing $PY: run tools/fixtures/setup.sh" >&2; exit 1; }

# same thread count on both sides: rayon (ours), OpenMP/MKL intra-op (torch)
export RAYON_NUM_THREADS="$THREADS" OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

echo "== machine" >&2
{
    lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|L2|L3)' || true
    free -g | head -2
    echo "threads=$THREADS prompt=$PROMPT decode=$DECODE repeats=$REPEATS"
} >&2

echo "== building the qwen35 bench (release)" >&2
(cd "$ROOT" && cargo bench -p qwen35 --bench cpu_bf16 --no-run) >&2

echo "== qwen35 ($(uptime))" >&2
(cd "$ROOT" && cargo bench -q -p qwen35 --bench cpu_bf16 -- \
    --config "$CONFIG" --threads "$THREADS" --prompt "$PROMPT" --decode "$DECODE" \
    --repeats "$REPEATS") >"$OUT/qwen35.json"
cat "$OUT/qwen35.json" >&2

echo "== transformers ($(uptime))" >&2
"$PY" "$ROOT/tools/bench/hf_qwen35_cpu.py" --config "$CONFIG" --threads "$THREADS" \
    --prompt "$PROMPT" --decode "$DECODE" --repeats "$REPEATS" \
    2> >(grep -v -e FutureWarning -e 'return forward_call' >&2) >"$OUT/hf.json"
cat "$OUT/hf.json" >&2
echo "== done ($(uptime))" >&2

python3 - "$OUT/qwen35.json" "$OUT/hf.json" <<'EOF'
import json, sys
o = json.load(open(sys.argv[1]))
h = json.load(open(sys.argv[2]))
gib = 1024 ** 3
rows = [
    ("decode tok/s ({} steps, mean)".format(o["decode_tokens"]), o["decode_tok_s"], h["decode_tok_s"], "{:.2f}"),
    ("decode tok/s (1 / median step)", o["decode_tok_s_median"], h["decode_tok_s_median"], "{:.2f}"),
    ("prefill tok/s ({} tokens)".format(o["prompt_tokens"]), o["prefill_tok_s"], h["prefill_tok_s"], "{:.1f}"),
    ("peak RSS GiB", o["peak_rss_bytes"] / gib, h["peak_rss_bytes"] / gib, "{:.2f}"),
    ("weights GiB", o["checkpoint_bytes"] / gib, h["weight_bytes"] / gib, "{:.2f}"),
]
print("| metric | qwen35 | transformers | qwen35 / transformers |")
print("|---|---|---|---|")
for name, a, b, f in rows:
    print(f"| {name} | {f.format(a)} | {f.format(b)} | {a / b:.2f}× |")
print(f"| peak RSS / weights | {o['peak_rss_bytes'] / o['checkpoint_bytes']:.2f} | "
      f"{h['peak_rss_bytes'] / h['weight_bytes']:.2f} | |")
print()
print(f"decode weight stream {o['decode_weight_gb_s']:.1f} GB/s (qwen35), "
      f"{o['checkpoint_bytes'] / h['decode_median_step_s'] / 1e9:.1f} GB/s (transformers); "
      f"read bandwidth of this machine on {o['threads']} thread(s): {o['read_ceiling_gb_s']:.1f} GB/s")
print(f"threads {o['threads']} (both); qwen35 GEMV path {o['isa']}; "
      f"torch {h['torch']}, transformers {h['transformers']}, attention {h['attn_implementation']}")
EOF
