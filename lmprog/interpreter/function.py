"""`lp.function`: a program you can run, stream, batch and await."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, overload

from lmprog.core.chat import check_template_variables
from lmprog.core.protocol import Backend
from lmprog.core.sampling import canonical_sampling_names
from lmprog.interpreter import run as _run
from lmprog.interpreter.defaults import resolve_backend
from lmprog.interpreter.executor import TemplateCache
from lmprog.interpreter.state import ProgramState
from lmprog.lang.program import Program, ProgramCall


class Function(Program):
    """A program made with `@lp.function`.

    `f.run(...)` runs it once, `f.run_batch([...])` many times concurrently,
    `await f.run_async(...)` from asyncio, `f.trace(...)` records its IR graph without a
    model, `f.bind(...)` fixes some arguments, and `f(s, ...)` appends it to another
    program's state. Called without a state, as SGLang allows, `f(...)` is `f.run(...)`:
    `qa(question="...", stream=True)` runs `qa` and returns its state.
    """

    def _call_without_state(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ProgramState:
        return self.run(*args, **kwargs)

    def run(
        self,
        *args: Any,
        backend: Backend | None = None,
        stream: bool = False,
        use_thread: bool = True,
        **kwargs: Any,
    ) -> ProgramState:
        """Run the program once and return its state.

        Positional and keyword arguments go to the program; keyword arguments that are
        sampling fields (`temperature=0`, `max_tokens=64`, `n`, `stop_regex`, ...; SGLang's
        `max_new_tokens` too) and not program parameters become defaults for every gen.
        Without `stream`, returns when the program is done and re-raises its exception.
        With `stream=True`, returns at once (the program runs in a background thread): read
        it with `state.text_iter(...)`. `use_thread` (SGLang's) is accepted: lmprog always
        executes a state's appends on its own worker thread, with the same results.
        `chat_template_kwargs={...}` gives the chat template variables for this run (see
        `lp.function`; `{"enable_thinking": False}` for Qwen3), over the program's own.
        """
        if not isinstance(stream, bool):
            raise TypeError(f"stream must be a bool, got {stream!r}")
        if not isinstance(use_thread, bool):
            raise TypeError(f"use_thread must be a bool, got {use_thread!r}")
        call = self.prepare_call(args, kwargs)
        return _run.start_program(
            self, call, resolve_backend(backend), stream=stream, background=stream
        )

    @overload
    def run_batch(
        self,
        batch_kwargs: Sequence[Mapping[str, Any] | Sequence[Any]],
        *,
        progress_bar: bool = False,
        num_threads: int | str = "auto",
        backend: Backend | None = None,
        generator_style: Literal[False] = False,
        **sampling_defaults: Any,
    ) -> list[ProgramState]: ...
    @overload
    def run_batch(
        self,
        batch_kwargs: Sequence[Mapping[str, Any] | Sequence[Any]],
        *,
        progress_bar: bool = False,
        num_threads: int | str = "auto",
        backend: Backend | None = None,
        generator_style: Literal[True],
        **sampling_defaults: Any,
    ) -> Iterator[ProgramState]: ...
    @overload
    def run_batch(
        self,
        batch_kwargs: Sequence[Mapping[str, Any] | Sequence[Any]],
        *,
        progress_bar: bool = False,
        num_threads: int | str = "auto",
        backend: Backend | None = None,
        generator_style: bool,
        **sampling_defaults: Any,
    ) -> list[ProgramState] | Iterator[ProgramState]: ...

    def run_batch(
        self,
        batch_kwargs: Sequence[Mapping[str, Any] | Sequence[Any]],
        *,
        progress_bar: bool = False,
        num_threads: int | str = "auto",
        backend: Backend | None = None,
        generator_style: bool = False,
        **sampling_defaults: Any,
    ) -> list[ProgramState] | Iterator[ProgramState]:
        """Run the program once per item of arguments; states in input order.

        An item is a dict of keyword arguments, or (as in SGLang) a list of the arguments
        in the program's order. Items run concurrently on `num_threads` threads ("auto":
        enough to keep a batching backend busy). An item whose program fails does not stop
        the others: its state carries the error (`state.error()`, and `state["x"]` raises
        it). With more than one item, the text every item starts with (found by tracing) is
        cached once first (unless `lp.global_config.enable_precache_with_tracing` is False).
        `sampling_defaults` apply to every item (an item's own sampling keys win). With
        `generator_style=True` (SGLang's) it returns a generator yielding the states in input
        order as they finish.
        """
        calls = self._batch_calls(batch_kwargs, sampling_defaults)
        if not isinstance(progress_bar, bool):
            raise TypeError(f"progress_bar must be a bool, got {progress_bar!r}")
        if not isinstance(generator_style, bool):
            raise TypeError(f"generator_style must be a bool, got {generator_style!r}")
        threads = _num_threads(num_threads, len(calls))
        run = _run.iter_batch if generator_style else _run.run_batch
        if not calls:
            return iter(()) if generator_style else []
        return run(
            self, calls, resolve_backend(backend), num_threads=threads, progress_bar=progress_bar
        )

    def cache(self, backend: Backend | None = None) -> None:
        """Cache the program's constant prefix on the backend (SGLang's `function.cache()`):
        the text every run starts with, found by tracing with every argument unknown, is
        prefilled once so later runs start from its KV. Nothing happens when the program
        starts with an argument or a gen."""
        backend = resolve_backend(backend)
        prefix = _run.program_prefix(self, TemplateCache(backend))
        if prefix:
            backend.cache_prefix(prefix)

    async def run_async(
        self, *args: Any, backend: Backend | None = None, **kwargs: Any
    ) -> ProgramState:
        """`run` for asyncio: awaits the program without blocking the event loop.

        Arguments are validated when awaited; the program's exception is re-raised here.
        """
        call = self.prepare_call(args, kwargs)
        state = _run.start_program(
            self, call, resolve_backend(backend), stream=False, background=True
        )
        await state._wait_finished_async()
        state.sync()
        return state

    def _batch_calls(self, batch_kwargs: object, sampling: dict[str, Any]) -> list[ProgramCall]:
        if isinstance(batch_kwargs, (str, bytes, Mapping)) or not isinstance(
            batch_kwargs, Sequence
        ):
            raise TypeError(
                f"run_batch() takes a list of dicts of arguments, got {type(batch_kwargs).__name__}"
            )
        calls = []
        for i, item in enumerate(batch_kwargs):
            if isinstance(item, (list, tuple)):
                item = self._named(item, i)
            if not isinstance(item, Mapping):
                raise TypeError(
                    f"run_batch() item {i} must be a dict of arguments or a list of them in "
                    f"the program's order, got {type(item).__name__}"
                )
            try:
                # SGLang's names first, so that an item's own max_tokens wins over max_new_tokens
                names = self._names
                merged = {
                    **canonical_sampling_names(sampling, names),
                    **canonical_sampling_names(dict(item), names),
                }
                calls.append(self.prepare_call((), merged))
            except (TypeError, ValueError) as e:
                raise type(e)(f"run_batch() item {i}: {e}") from None
        return calls

    def _named(self, values: Sequence[Any], i: int) -> dict[str, Any]:
        """A run_batch item given as a list: the program's arguments in order (SGLang's)."""
        names = self.positional_parameters
        required = self.required_parameters
        if not len(required) <= len(values) <= len(names):
            raise TypeError(
                f"run_batch() item {i} lists {len(values)} arguments; {self.name} takes "
                f"{len(required)} to {len(names)} ({list(names)})"
            )
        return dict(zip(names, values))


def _num_threads(num_threads: object, n: int) -> int:
    if num_threads == "auto":
        return _run.auto_threads(n)
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be 'auto' or a positive int, got {num_threads!r}")
    return num_threads


@overload
def function(
    func: Callable[..., Any],
    *,
    num_api_spec_tokens: int | None = None,
    allow_special_tokens: bool = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> Function: ...
@overload
def function(
    func: None = None,
    *,
    num_api_spec_tokens: int | None = None,
    allow_special_tokens: bool = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> Callable[[Callable[..., Any]], Function]: ...


def function(
    func: Callable[..., Any] | None = None,
    *,
    num_api_spec_tokens: int | None = None,
    allow_special_tokens: bool = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> Function | Callable[[Callable[..., Any]], Function]:
    """Make `func(s, ...)` an lmprog program: `@lp.function` or `@lp.function(num_api_spec_tokens=N)`.

    The first parameter receives the state; a function that cannot take it positionally
    raises TypeError here.

    `num_api_spec_tokens=N` turns on API speculative execution on endpoint backends
    (`lp.OpenAI`): a gen asks for N tokens more than its max_tokens, ignoring its stop;
    the program's following text must match that surplus, and following gens are cut
    from it up to their own stops, so one API call can fill several gens. A mismatch falls
    back to a real call. Other backends ignore it (their prefix cache makes calls cheap).

    Special tokens: only the chat template's role markers (and the model's own output)
    become control tokens. A special-token string in the program's text (`s += "..."`,
    arguments, tool results, select choices) is tokenized as plain text, so text from a
    user cannot close a turn or open a system one with `<|im_end|>\n<|im_start|>system`.
    `allow_special_tokens=True` reads them as control tokens, for programs that write the
    model's markup by hand (as SGLang programs may).

    `chat_template_kwargs={...}`: variables for the model's chat template in every run, as
    the server's `chat_template_kwargs` (`{"enable_thinking": False}` turns Qwen3's
    thinking off, `{"reasoning_effort": "low"}` for gpt-oss); the role markers and the
    generation prompt are rendered under them. A run's own `chat_template_kwargs=` adds to
    them. TypeError/ValueError here for a non-dict or a variable the renderer sets itself.
    """
    if chat_template_kwargs is not None:
        check_template_variables(chat_template_kwargs)
    options: dict[str, Any] = dict(
        num_api_spec_tokens=num_api_spec_tokens,
        allow_special_tokens=allow_special_tokens,
        chat_template_kwargs=chat_template_kwargs,
    )
    if func is None:
        return lambda f: Function(f, **options)
    return Function(func, **options)
