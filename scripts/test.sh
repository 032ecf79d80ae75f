#!/usr/bin/env bash
# Set up with the test tools and triton (setup.sh --test) and run the whole CPU test suite:
# unit tests, end-to-end tests on the bundled model, and the Triton kernel tests through
# Triton's CPU interpreter. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
exec "${LMPROG_VENV:-.venv}/bin/python" -m pytest -q -p no:cacheprovider "$@"
