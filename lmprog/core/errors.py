"""Exceptions raised by lmprog. Imports nothing from the package."""


class LmprogError(Exception):
    """Base class of every lmprog error."""


class ConstraintError(LmprogError, ValueError):
    """A regex, JSON schema, choice list or dtype that cannot be compiled exactly.

    Raised before any token is spent, naming the keyword or position to fix.
    """


class ContextLengthError(LmprogError, ValueError):
    """A prompt (plus the tokens asked for) does not fit the model's context or KV pool."""


class BackendError(LmprogError, RuntimeError):
    """A backend cannot do what was asked (unsupported parameter, engine failure, ...)."""


class ProgramCancelled(LmprogError):
    """The program's state was cancelled (`state.cancel()`, leaving a streamed run's text
    iterator early, or cancelling `run_async`): its running gen was aborted, its queued
    appends dropped; the program body gets this at its next append or read."""
