#!/usr/bin/env python3
"""HF transformers side of the Qwen3.5 CPU benchmark (see tools/bench/cpu-vs-hf.sh).

Builds the text model of --config (same JSON as the Rust bench) as Qwen3_5ForCausalLM with
random bf16 weights made in-process (speed does not depend on the values), then measures what
crates/qwen35/benches/cpu_bf16.rs measures: one forward of a --prompt-token prompt (best of
--repeats), --decode greedy one-token steps after it with the KV/GDN cache, and peak RSS
(ru_maxrss). Prints one JSON object on stdout.

Run with the pinned venv: tools/fixtures/.venv (torch 2.15.0, transformers 5.24.0).
"""

import argparse
import json
import os
import resource
import time


def status_bytes(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()

    import torch
    import transformers
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    with open(a.config) as f:
        raw = json.load(f)
    raw.pop("architectures", None)
    raw.pop("model_type", None)
    cfg = Qwen3_5TextConfig(**raw)

    t0 = time.perf_counter()
    # weights are created directly in bf16 (no f32 copy) and initialised randomly by HF's init
    model = Qwen3_5ForCausalLM._from_config(cfg, dtype=torch.bfloat16).eval()
    gen_s = time.perf_counter() - t0
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (1, a.prompt), generator=g)

    with torch.inference_mode():
        prefill_s = float("inf")
        out = None
        for _ in range(max(1, a.repeats)):
            t = time.perf_counter()
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            prefill_s = min(prefill_s, time.perf_counter() - t)
        cache = out.cache
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        steps = []
        for _ in range(a.decode):
            t = time.perf_counter()
            out = model(input_ids=tok, cache=cache, use_cache=True, logits_to_keep=1)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            steps.append(time.perf_counter() - t)
            cache = out.cache

    decode_s = sum(steps)
    steps.sort()
    print(
        json.dumps(
            {
                "impl": "transformers",
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "threads": torch.get_num_threads(),
                "config": a.config,
                "weights_dtype": "bf16",
                "weight_bytes": weight_bytes,
                "generate_s": gen_s,
                "prompt_tokens": a.prompt,
                "prefill_s": prefill_s,
                "prefill_tok_s": a.prompt / prefill_s,
                "decode_tokens": a.decode,
                "decode_s": decode_s,
                "decode_tok_s": a.decode / decode_s,
                "decode_median_step_s": steps[len(steps) // 2] if steps else None,
                "decode_tok_s_median": 1.0 / steps[len(steps) // 2] if steps else None,
                # Linux ru_maxrss is in KiB
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "final_rss_bytes": status_bytes("VmRSS:"),
                "attn_implementation": model.config._attn_implementation,
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            }
        )
    )


if __name__ == "__main__":
    main()
