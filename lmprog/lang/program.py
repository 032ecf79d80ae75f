"""A language-model program: a Python function whose first parameter is the state.

`Program` checks the function's shape at decoration, binds arguments (`bind`), splits a
call's keyword arguments into program arguments and sampling defaults, and traces. Running
belongs to the interpreter, which subclasses it (`lmprog.interpreter.function.Function`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from lmprog.core.chat import check_template_variables
from lmprog.core.limits import check_stop_limits
from lmprog.core.sampling import SAMPLING_FIELDS, SAMPLING_NAMES, SamplingParams
from lmprog.lang.frontend import FrontendState
from lmprog.lang.ir import Graph
from lmprog.lang.tracer import Arg, trace_program

P = TypeVar("P", bound="Program")

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclass(frozen=True)
class ProgramCall:
    """One validated call: the program's arguments, the run's sampling defaults and its chat
    template variables (`chat_template_kwargs`)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    defaults: SamplingParams
    template_kwargs: dict[str, Any] = field(default_factory=dict)


TEMPLATE_KWARGS = "chat_template_kwargs"  # the run keyword (the server's and SGLang's field)


class Program:
    """A function `f(s, ...)` made into an lmprog program.

    Calling it with a state, `f(s, ...)`, appends to that state `s`: programs compose.
    Called without one (as SGLang allows), `f(...)` is `f.run(...)` where the program can
    run (`lp.function`), and a TypeError otherwise.
    """

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        num_api_spec_tokens: int | None = None,
        bound: dict[str, Any] | None = None,
        allow_special_tokens: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self._signature = _program_signature(func)
        if chat_template_kwargs is not None:
            check_template_variables(chat_template_kwargs)
        if num_api_spec_tokens is not None and (
            isinstance(num_api_spec_tokens, bool)
            or not isinstance(num_api_spec_tokens, int)
            or num_api_spec_tokens < 1
        ):
            raise ValueError(
                f"num_api_spec_tokens must be a positive int or None, got {num_api_spec_tokens!r}"
            )
        if not isinstance(allow_special_tokens, bool):
            raise TypeError(f"allow_special_tokens must be a bool, got {allow_special_tokens!r}")
        self.func = func
        self.num_api_spec_tokens = num_api_spec_tokens
        self.allow_special_tokens = allow_special_tokens
        # variables for the chat template of every run (a run's own chat_template_kwargs win)
        self.chat_template_kwargs: dict[str, Any] = dict(chat_template_kwargs or {})
        self._bound: dict[str, Any] = dict(bound or {})
        params = self._signature.parameters.values()
        self._names = tuple(p.name for p in params if p.kind not in _VARIADIC)
        self._takes_any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        functools.update_wrapper(self, func, updated=())  # name and docstring, not attributes

    @property
    def name(self) -> str:
        return getattr(self.func, "__name__", type(self.func).__name__)

    @property
    def parameters(self) -> tuple[str, ...]:
        """The program's parameter names after the state."""
        return self._names

    @property
    def positional_parameters(self) -> tuple[str, ...]:
        """The parameters after the state that can be given by position, in order."""
        return tuple(p.name for p in self._signature.parameters.values() if p.kind in _POSITIONAL)

    @property
    def required_parameters(self) -> tuple[str, ...]:
        """The positional parameters without a default."""
        return tuple(
            p.name
            for p in self._signature.parameters.values()
            if p.kind in _POSITIONAL and p.default is inspect.Parameter.empty
        )

    def bind(self: P, **kwargs: Any) -> P:
        """A copy of this program with some arguments fixed (a call may still override them)."""
        unknown = [k for k in kwargs if k not in self._names and not self._takes_any_keyword]
        if unknown:
            raise TypeError(
                f"{self.name}.bind() got unknown argument(s) {unknown}; its parameters are {list(self._names)}"
            )
        return type(self)(
            self.func,
            num_api_spec_tokens=self.num_api_spec_tokens,
            bound={**self._bound, **kwargs},
            allow_special_tokens=self.allow_special_tokens,
            chat_template_kwargs=self.chat_template_kwargs,
        )

    def prepare_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ProgramCall:
        """Validate a call; keyword arguments that are sampling fields become defaults.

        A keyword that names a program parameter is an argument; otherwise a sampling
        field (`temperature=0`, `max_tokens=...`) is a default for every gen of the run;
        `chat_template_kwargs={...}` sets the chat template's variables for the run (over the
        program's own); anything else raises TypeError listing the program's parameters.
        """
        call: dict[str, Any] = {}
        sampling: dict[str, Any] = {}
        variables = dict(self.chat_template_kwargs)
        for key, value in {**self._bound, **kwargs}.items():
            if key in self._names:
                call[key] = value
            elif key in SAMPLING_NAMES:
                sampling[key] = value
            elif key == TEMPLATE_KWARGS:
                check_template_variables(value)
                variables.update(value)
            elif self._takes_any_keyword:
                call[key] = value
            else:
                raise TypeError(
                    f"{self.name}() got an unexpected keyword argument {key!r}; its parameters are "
                    f"{list(self._names)}, and sampling defaults may be any of {sorted(SAMPLING_FIELDS)}"
                )
        try:
            self._signature.bind(*args, **call)
        except TypeError as e:
            raise TypeError(f"{self.name}(): {e}; its parameters are {list(self._names)}") from None
        defaults = SamplingParams().merged(sampling)
        check_stop_limits(defaults.stop, "run")
        return ProgramCall(tuple(args), call, defaults, variables)

    def trace(self, **kwargs: Any) -> Graph:
        """The program's IR graph, recorded without running any model.

        Pass `lp.Arg` for arguments whose value is unknown; parameters left out are `lp.Arg`
        too, unless they have a default. Sampling keywords apply as in `run`. Tracing stops
        at the first operation that needs a run-time value (the graph's `stopped` says which).
        """
        for p in self._signature.parameters.values():
            if p.kind not in _VARIADIC and p.name not in kwargs and p.name not in self._bound:
                if p.default is inspect.Parameter.empty:
                    kwargs[p.name] = Arg
        call = self.prepare_call((), kwargs)
        return trace_program(self.func, self.name, call.args, call.kwargs, call.defaults)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], FrontendState):
            return self.func(*args, **{**self._bound, **kwargs})
        return self._call_without_state(args, kwargs)

    def _call_without_state(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise TypeError(
            f"{self.name}() needs a state as its first argument, `{self.name}(s, ...)`, to "
            f"append to; got {type(args[0]).__name__ if args else 'none'}"
        )

    def __repr__(self) -> str:
        return f"<lmprog program {self.name}({', '.join(self._names)})>"


_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _program_signature(func: Callable[..., Any]) -> inspect.Signature:
    """The signature after the state; raises TypeError unless `func(s, ...)` is a program."""
    if not callable(func):
        raise TypeError(f"lp.function decorates a function, got {type(func).__name__}")
    if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
        raise TypeError(
            f"{func.__name__} is async; a program is a plain function (use .run_async() to await it)"
        )
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError) as e:
        raise TypeError(f"cannot read the signature of {func!r}: {e}") from None
    params = list(sig.parameters.values())
    if not params or params[0].kind not in _POSITIONAL:
        name = getattr(func, "__name__", repr(func))
        raise TypeError(
            f"a program takes the state first, like `def {name}(s, ...)`; {name}{sig} does not"
        )
    return sig.replace(parameters=params[1:])
