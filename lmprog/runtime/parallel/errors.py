"""The one error of a broken tensor-parallel group (imports nothing but core)."""

from __future__ import annotations

from lmprog.core.errors import BackendError


class ParallelError(BackendError):
    """A rank of the tensor-parallel group died, hung past the collective timeout, or failed
    a step. Fatal for the engine: the ranks are out of step, so every pending request fails
    with this error, the group is torn down and no process of it is left running."""
