#!/usr/bin/env bash
# Set up a virtual environment (if needed) and run the whole test suite.
# Fails when no test ran (pytest exit code 5), so CI never passes on an empty run.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv || exit 1
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[torch,test]' || exit 1
.venv/bin/python -m pytest -q "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "scripts/test.sh: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
