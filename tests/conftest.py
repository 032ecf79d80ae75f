"""Suite-wide settings: hypothesis runs derandomized in CI (CI=true) so a submission's
result does not depend on the draw; locally it explores new examples every run.

Without a CUDA GPU, Triton runs its kernels through its CPU interpreter: TRITON_INTERPRET=1
must be set before a kernel is defined (when lmprog.runtime.kernels' modules are first
imported), so it is set here, before pytest imports any test module, and every Triton test
(tests/kernels, the runtime's whole-model ones) runs in this process. An explicit
TRITON_INTERPRET=0 in the environment is kept (those tests then skip).

Every Python the tests start (servers, scripts, `python -c` probes) inherits
PYTHONFAULTHANDLER=1: a child that crashes in native code then leaves its threads' Python
stacks on stderr, which the failing assertion shows."""

import importlib.util
import os

from hypothesis import settings

if importlib.util.find_spec("triton") is not None:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")

os.environ.setdefault("PYTHONFAULTHANDLER", "1")

settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")
