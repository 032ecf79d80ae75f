"""lmprog: embedded language-model programming.

    import lmprog as lp

    @lp.function
    def qa(s, question):
        s += lp.user(question)
        s += lp.assistant(lp.gen("answer", max_tokens=64))

    state = qa.run(question="What is the capital of France? Answer in one sentence.", temperature=0)
    print(state["answer"])  # The capital of France is Paris.

`import lmprog` stays light: backends (`lp.LlamaCpp`, `lp.Runtime`, `lp.OpenAI`,
`lp.RuntimeEndpoint`) and `lp.Constraint` are imported on first use.
"""

from __future__ import annotations

from typing import Any

from lmprog.core.errors import (
    BackendError,
    ConstraintError,
    ContextLengthError,
    LmprogError,
    LoraError,
    ProgramCancelled,
)
from lmprog.core.limits import Limits, get_limits, set_limits
from lmprog.core.logs import configure_from_env
from lmprog.core.sampling import SamplingParams
from lmprog.interpreter import (
    ProgramState,
    flush_cache,
    get_server_info,
    global_config,
    set_backend_factory,
    set_default_backend,
)
from lmprog.interpreter.function import function
from lmprog.lang import (
    REGEX_BOOL,
    REGEX_FLOAT,
    REGEX_INT,
    REGEX_STR,
    Arg,
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    greedy_token_selection,
    image,
    select,
    separate_reasoning,
    system,
    system_begin,
    system_end,
    token_length_normalized,
    unconditional_likelihood_normalized,
    user,
    user_begin,
    user_end,
    video,
)

__version__ = "0.1.0"

# Names given lazily: module -> names it provides.
_LAZY = {
    "lmprog.backends": ("LlamaCpp", "Runtime", "OpenAI", "RuntimeEndpoint"),
    "lmprog.fsm": ("Constraint",),
}


def _default_backend() -> Any:
    from lmprog.backends import default_backend

    return default_backend()


set_backend_factory(_default_backend)
configure_from_env()  # $LMPROG_LOG_LEVEL: lmprog's log lines on stderr


def __getattr__(name: str) -> Any:
    for module_name, names in _LAZY.items():
        if name in names:
            import importlib

            try:
                value = getattr(importlib.import_module(module_name), name)
            except ImportError as e:  # re-raised as AttributeError so hasattr() keeps working
                raise AttributeError(str(e)) from None
            except AttributeError:
                raise AttributeError(
                    f"lmprog.{name} is not available: its module {module_name} does not define it"
                ) from None
            globals()[name] = value
            return value
    raise AttributeError(f"module 'lmprog' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {n for names in _LAZY.values() for n in names})


# The lazy names (Constraint, LlamaCpp, Runtime, OpenAI, RuntimeEndpoint) are left out so that `import *` stays light.
__all__ = [
    "REGEX_BOOL",
    "REGEX_FLOAT",
    "REGEX_INT",
    "REGEX_STR",
    "Arg",
    "BackendError",
    "ConstraintError",
    "ContextLengthError",
    "Limits",
    "LmprogError",
    "LoraError",
    "ProgramCancelled",
    "ProgramState",
    "SamplingParams",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_limits",
    "get_server_info",
    "global_config",
    "greedy_token_selection",
    "image",
    "select",
    "separate_reasoning",
    "set_default_backend",
    "set_limits",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
    "user",
    "user_begin",
    "user_end",
    "video",
]
