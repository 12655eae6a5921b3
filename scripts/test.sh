#!/usr/bin/env bash
# Set up a virtual environment (if needed), the browser the status-page test drives
# (Debian's chromium, when running as root and it is missing), then lint (ruff),
# type-check the seams (mypy, files listed in pyproject.toml, beside the tests) and run the whole test suite.
# Fails when no test ran (pytest exit code 5), so CI never passes on an empty run.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Debian's chromium installs in the background while pip works (both mostly wait on the network).
browser_pid=""
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "scripts/test.sh: installing Debian's chromium for the status-page test" >&2
    browser_log=$(mktemp)
    (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium) >"$browser_log" 2>&1 &
    browser_pid=$!
  else
    echo "scripts/test.sh: no chromium (apt-get install chromium): the status-page test will be skipped" >&2
  fi
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv || exit 1
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[torch,service,test]' || exit 1
.venv/bin/ruff check . || exit 1
# mypy (about 30 s cold, one core) runs beside the first tests; its verdict is awaited
# before the tests' exit code is returned.
mypy_log=$(mktemp)
.venv/bin/mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
if [ -n "$browser_pid" ] && ! wait "$browser_pid"; then
  echo "scripts/test.sh: installing chromium failed:" >&2
  tail -20 "$browser_log" >&2
  exit 1
fi
# One pytest worker per core (pytest-xdist; at most 4): most tests wait on subprocesses
# (mpiexec, torch ranks, a service) part of the time. The long ones start first
# (tests/conftest.py) and an idle worker takes tests from a busy one (worksteal).
.venv/bin/python -m pytest -q -n auto --maxprocesses 4 --dist worksteal \
  --durations=15 "$@"     # the slowest tests: where the CI budget goes
rc=$?
wait "$mypy_pid"
mypy_rc=$?
cat "$mypy_log"
if [ "$mypy_rc" -ne 0 ]; then
  echo "scripts/test.sh: mypy failed (above)" >&2
  exit 1
fi
if [ "$rc" -eq 5 ]; then
  echo "scripts/test.sh: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
