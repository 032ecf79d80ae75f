#!/usr/bin/env bash
# Set up with the test tools and triton (setup.sh --test) and run the whole CPU test suite:
# unit tests, end-to-end tests on the bundled model, and the Triton kernel tests through
# Triton's CPU interpreter. Arguments go to pytest.
#
# LMPROG_TEST_WORKERS: how many pytest-xdist worker processes run the suite (default 2 where
# this process may use 2 or more cores, else 1); 1 runs it in this one process, as before.
# Each test file runs whole on one worker (--dist loadfile), so a module's fixtures (its
# server, its fleet of workers) start once, and most tests use one thread: two workers fill
# two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
PY="${LMPROG_VENV:-.venv}/bin/python"
cores="$("$PY" -c 'import os; print(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)')"
workers="${LMPROG_TEST_WORKERS:-$([ "$cores" -ge 2 ] && echo 2 || echo 1)}"
case "$workers" in
  '' | *[!0-9]*) echo "test: LMPROG_TEST_WORKERS must be a number, got '$workers'" >&2; exit 2 ;;
esac
xdist=()
[ "$workers" -gt 1 ] && xdist=(-n "$workers" --dist loadfile)
exec "$PY" -m pytest -q -p no:cacheprovider ${xdist[@]+"${xdist[@]}"} "$@"
