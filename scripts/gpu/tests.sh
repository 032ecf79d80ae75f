#!/usr/bin/env bash
# On the GPU machine after `source scripts/gpu/stage.sh c`: the real-weight tests (the DSL
# programs of tests/e2e through lp.Runtime on CUDA, with overlap scheduling and decode and
# piecewise CUDA graphs on, in one process), the runtime's e2e tests, the kernel tests and every
# test file with a CUDA path.
# Logs go to $OUT when it is set (the device tool brings them back).
set -uo pipefail
out=${OUT:-/tmp}
export PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
python3 -m pytest -q -p no:cacheprovider -x -k "not llamacpp" tests/e2e \
  tests/backends/test_runtime_e2e.py "$@" 2>&1 | tee "$out/gpu-e2e.log"
e2e=${PIPESTATUS[0]}
# the Triton kernels against their PyTorch references (on the card, bf16 and larger shapes) and
# every test file with a CUDA path (grep -l cuda.is_available tests)
python3 -m pytest -q -p no:cacheprovider tests/kernels \
  $(grep -rl "cuda.is_available" tests --include="test_*.py") \
  2>&1 | tee "$out/gpu-marked.log"
marked=${PIPESTATUS[0]}
echo "gpu tests: e2e rc=$e2e, gpu-marked rc=$marked"
[ "$e2e" = 0 ] && [ "$marked" = 0 ]
