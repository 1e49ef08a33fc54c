#!/usr/bin/env bash
# The board's Python: Ubuntu 22.04 on the RDK S100P has Python 3.10, and everything the board
# owner runs there (tools/board-acceptance.sh and its Python, tools/vlm-ask.py, the client
# package bpu_vlm_client, the launch file, the ROS 2 peers it shares) must work on it. CI has a
# newer Python, so this checks the minimum version statically with vermin (pinned, in its own venv under .cache/) and fails
# when any file needs more than 3.10.
#
#   bash tools/py-compat.sh        (tools/test.sh phase py-compat)
#
# vermin parses with the interpreter it runs on: a file that interpreter cannot parse (say a
# Python 3.12 f-string under 3.11) is reported as an "error:" line with exit 0, so such a
# line fails the check too.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
VERMIN_VERSION=1.9.2
VENV=$ROOT/.cache/py-compat-venv
PY=${PY:-python3}
if [ "$("$VENV/bin/vermin" --version 2>/dev/null)" != "$VERMIN_VERSION" ]; then
  rm -rf "$VENV"
  "$PY" -m venv "$VENV" || { echo "py-compat: $PY -m venv failed (apt-get install python3-venv)" >&2; exit 1; }
  "$VENV/bin/pip" install -q --disable-pip-version-check "vermin==$VERMIN_VERSION"
fi
FILES=(tools/*.py tools/bench/*.py launch/*.py tests/peers/*.py client/setup.py client/bpu_vlm_client/*.py)
set +e
out=$("$VENV/bin/vermin" --no-tips --violations -t=3.10- --eval-annotations \
  --feature fstring-pep701 "${FILES[@]}" 2>&1)
rc=$?
set -e
echo "$out"
if [ "$rc" != 0 ] || grep -q 'error:' <<<"$out"; then
  echo "py-compat: a file above needs a Python newer than 3.10 (the board's), or could not be" \
    "parsed (vermin exit $rc)" >&2
  exit 1
fi
echo "py-compat: ${#FILES[@]} files run on Python 3.10"
