#!/usr/bin/env python3
"""The shape limits every change keeps (docs/conventions.md, "Limits"), checked on the
tracked files of the repository:

- no Rust source file over 600 lines before its `#[cfg(test)]` module (files under a
  `tests/` or `benches/` folder are tests);
- no non-test Rust function over 100 lines;
- at most 12 `.rs` files directly in `src/` (the node crate keeps its code in rooms);
- README.md at most 300 lines;
- no mention of a document that is not in the repository (the documents the project grew
  from are named in the list below, spelled so that this file does not match itself).

    python3 tools/limits.py          (tools/test.sh phase limits)

Exit 1 with one line per violation. The function scan counts braces outside strings,
character literals and line comments: good enough for rustfmt-formatted code.
"""
import re
import subprocess
import sys
from pathlib import Path

MAX_FILE_LINES = 600
MAX_FN_LINES = 100
MAX_SRC_FILES = 12
MAX_README_LINES = 300
OUTSIDE_DOCS = ["STYLE" + ".md", "design " + "card", "../" + "shared"]

FN_RE = re.compile(
    r'\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"C"\s+)?fn\s+(\w+)'
)
STRING_RE = re.compile(r'"(\\.|[^"\\])*"')
CHAR_RE = re.compile(r"'(\\.|[^'\\])'")


def tracked(root, *patterns):
    out = subprocess.check_output(["git", "ls-files", "--", *patterns], cwd=root, text=True)
    return [p for p in out.split("\n") if p]


def is_test_path(path):
    parts = Path(path).parts
    return "tests" in parts or "benches" in parts


def code_lines(text):
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for i, line in enumerate(lines):
        if line.startswith("#[cfg(test)]"):
            return lines[:i]
    return lines


def strip(line):
    line = STRING_RE.sub('""', line)
    line = CHAR_RE.sub("''", line)
    return line.split("//")[0]


def fn_end(lines, start):
    """Index of the line closing the function starting at `start`, or None (a declaration)."""
    depth = 0
    opened = False
    for j in range(start, len(lines)):
        s = strip(lines[j])
        for ch in s:
            if ch == "{":
                depth += 1
                opened = True
            elif ch == "}":
                depth -= 1
        if not opened and ";" in s:
            return None
        if opened and depth <= 0:
            return j
    return None


def long_functions(path, lines):
    out = []
    for i, line in enumerate(lines):
        m = FN_RE.match(line)
        if not m:
            continue
        end = fn_end(lines, i)
        if end is not None and end - i + 1 > MAX_FN_LINES:
            out.append(f"{path}:{i + 1}: fn {m.group(7)} is {end - i + 1} lines (max {MAX_FN_LINES})")
    return out


def main():
    root = Path(__file__).resolve().parent.parent
    problems = []
    for path in tracked(root, "*.rs"):
        if is_test_path(path):
            continue
        lines = code_lines((root / path).read_text(encoding="utf-8", errors="replace"))
        if len(lines) > MAX_FILE_LINES:
            problems.append(f"{path}: {len(lines)} lines before its tests (max {MAX_FILE_LINES})")
        problems += long_functions(path, lines)
    in_src = [p for p in tracked(root, "src/*.rs") if "/" not in p[len("src/"):]]
    if len(in_src) > MAX_SRC_FILES:
        problems.append(f"src/: {len(in_src)} .rs files directly in it (max {MAX_SRC_FILES})")
    readme = (root / "README.md").read_text(encoding="utf-8").split("\n")
    if len(readme) > MAX_README_LINES:
        problems.append(f"README.md: {len(readme)} lines (max {MAX_README_LINES})")
    for path in tracked(root):
        if path.startswith(".cache/") or not (root / path).is_file():
            continue
        try:
            text = (root / path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for name in OUTSIDE_DOCS:
            if name in text:
                problems.append(f"{path}: names {name!r}, a document outside the repository")
    for p in problems:
        print(p)
    print(f"limits: {len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
