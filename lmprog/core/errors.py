"""Exceptions raised by lmprog. Imports nothing from the package."""


class LmprogError(Exception):
    """Base class of every lmprog error."""


class ConstraintError(LmprogError, ValueError):
    """A regex, JSON schema, choice list or dtype that cannot be compiled exactly.

    Raised before any token is spent, naming the keyword or position to fix.
    """


class ContextLengthError(LmprogError, ValueError):
    """A prompt (plus the tokens asked for) does not fit the model's context or KV pool.

    Where the raiser knows them: `prompt_tokens`, the prompt's length; `limit`, the tokens
    that fit; `setting`, the backend keyword that sets `limit` ("n_ctx", "max_total_tokens"),
    None when it is the model's own context length. The server words its message from them
    (naming its flag, not a Python constructor).
    """

    def __init__(
        self,
        message: str,
        *,
        prompt_tokens: int | None = None,
        limit: int | None = None,
        setting: str | None = None,
    ) -> None:
        super().__init__(message)
        self.prompt_tokens, self.limit, self.setting = prompt_tokens, limit, setting


class LoraError(LmprogError, ValueError):
    """A LoRA adapter that cannot be loaded or used: a malformed or mismatched adapter folder,
    an unknown adapter name, an adapter beyond the runtime's limits, or a backend or mode
    without adapter support. The message names the adapter and what to fix; the adapters
    already loaded keep serving. `unknown`: the name is not a loaded adapter (the server
    answers 404, as for an unknown model)."""

    def __init__(self, message: str, *, adapter: str | None = None, unknown: bool = False):
        super().__init__(message)
        self.adapter, self.unknown = adapter, unknown


class BackendError(LmprogError, RuntimeError):
    """A backend cannot do what was asked (unsupported parameter, engine failure, ...)."""


class ProgramCancelled(LmprogError):
    """The program's state was cancelled (`state.cancel()`, leaving a streamed run's text
    iterator early, or cancelling `run_async`): its running gen was aborted, its queued
    appends dropped; the program body gets this at its next append or read."""
