#!/usr/bin/env bash
# Set up a virtual environment (if needed), the browser the status-page test drives, the Slurm
# daemons the Slurm tests start and the ssh daemon and network tools of the test hosts (Debian's
# chromium, slurmctld, slurmd, slurm-client, munge, openssh-server, openssh-client and iproute2, when
# running as root and they are missing), then lint (ruff),
# type-check the seams (mypy, files listed in pyproject.toml, beside the tests), build the documentation
# site (mkdocs build --strict into a temporary folder: a broken link or anchor, or a page left out of
# mkdocs.yml's navigation, fails) and run the whole test suite.
# Fails when no test ran (pytest exit code 5), so CI never passes on an empty run.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Debian's chromium (the status-page test) and Slurm with munge (the Slurm tests: a real cluster of
# several slurmd on this host, tests/slurm_cluster.py) install in the background while pip works
# (both mostly wait on the network).
apt_pkgs=""
command -v chromium >/dev/null 2>&1 || apt_pkgs="chromium"
for b in slurmctld slurmd sinfo munged; do
  if ! PATH="$PATH:/usr/sbin:/sbin" command -v "$b" >/dev/null 2>&1; then
    apt_pkgs="$apt_pkgs slurmctld slurmd slurm-client munge"
    break
  fi
done
# the test hosts (tests/hosts.py): network namespaces with an sshd each
for b in sshd ssh ssh-keygen ip unshare; do
  if ! PATH="$PATH:/usr/sbin:/sbin" command -v "$b" >/dev/null 2>&1; then
    apt_pkgs="$apt_pkgs openssh-server openssh-client iproute2 util-linux"
    break
  fi
done
apt_pid=""
if [ -n "$apt_pkgs" ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "scripts/test.sh: installing Debian's$apt_pkgs for the status-page, Slurm and test-host tests" >&2
    apt_log=$(mktemp)
    (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $apt_pkgs) >"$apt_log" 2>&1 &
    apt_pid=$!
  else
    echo "scripts/test.sh: not root or no apt-get: cannot apt-get install$apt_pkgs; the tests that need" \
         "them (status page: chromium; Slurm: Slurm as root; test hosts: sshd as root) are skipped," \
         "each saying why" >&2
  fi
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv || exit 1
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[torch,service,test,docs]' || exit 1
.venv/bin/ruff check . || exit 1
# mypy (about 30 s cold, one core) runs beside the first tests; its verdict is awaited
# before the tests' exit code is returned.
mypy_log=$(mktemp)
.venv/bin/mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
# The docs site (about 10 s), beside mypy; never written into the tree.
docs_dir=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict -q -d "$docs_dir/site" >"$docs_dir/log" 2>&1 &
docs_pid=$!
if [ -n "$apt_pid" ] && ! wait "$apt_pid"; then
  echo "scripts/test.sh: installing$apt_pkgs failed:" >&2
  tail -20 "$apt_log" >&2
  exit 1
fi
# One pytest worker per core (pytest-xdist; at most 4): most tests wait on subprocesses
# (mpiexec, torch ranks, a service) part of the time. Tests go out one at a time to the
# worker that is running low, except that the modules in tests/conftest.py's WHOLE_MODULES
# go whole to one worker (--dist loadgroup), so that their module-scoped scenario (a real
# Slurm cluster, a live service) is built once per run; those start first, then the long
# tests (tests/conftest.py).
.venv/bin/python -m pytest -q -n auto --maxprocesses 4 --dist loadgroup \
  --durations=15 "$@"     # the slowest tests: where the CI budget goes
rc=$?
wait "$mypy_pid"
mypy_rc=$?
cat "$mypy_log"
if [ "$mypy_rc" -ne 0 ]; then
  echo "scripts/test.sh: mypy failed (above)" >&2
  exit 1
fi
wait "$docs_pid"
docs_rc=$?
if [ "$docs_rc" -ne 0 ]; then
  cat "$docs_dir/log" >&2
  echo "scripts/test.sh: mkdocs build --strict failed (above): a broken link or anchor, or a page not in mkdocs.yml's nav" >&2
  rm -rf "$docs_dir"
  exit 1
fi
rm -rf "$docs_dir"
if [ "$rc" -eq 5 ]; then
  echo "scripts/test.sh: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
