"""`ProgramState`: the state of a running program (`s` inside it, what `run()` returns).

Appends are validated by the front half (`lmprog.lang.frontend.FrontendState`) and handed to
this state's worker; reads wait on its record. Readers never hang: a failed program
raises its error from `s["x"]`, `sync()` and the text iterators.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast, overload

from lmprog.core.errors import ConstraintError, ProgramCancelled
from lmprog.core.protocol import Backend, StreamPiece
from lmprog.core.sampling import SamplingParams
from lmprog.interpreter.executor import NodeExecutor, TemplateSource
from lmprog.interpreter.partial import PartialJSON
from lmprog.interpreter.record import Parsed, StateRecord
from lmprog.interpreter.typed import checked_type
from lmprog.interpreter.worker import ForkPoint, Worker
from lmprog.lang.frontend import FrontendState, Inherited, Step
from lmprog.lang.ir import ArgRef, Fork, Join

T = TypeVar("T")


@dataclass(frozen=True)
class RunContext:
    """What every state of one run shares."""

    backend: Backend
    template: TemplateSource
    defaults: SamplingParams
    stream: bool = False
    num_api_spec_tokens: int | None = None  # the program's API speculation (endpoint backends)
    allow_special_tokens: bool = False  # the program's text may hold control tokens


class ProgramState(FrontendState):
    """The state of one program run.

    Inside the program, `s += ...` appends and `s["x"]` reads. After `run()`:

        state["answer"]             the variable's value (waits until it is ready)
        state.text()                the whole text, chat markup included
        state.messages()            [{"role": "user", "content": ...}, ...]
        state.parsed("answer")      a typed/json_schema gen's parsed value (pydantic, dict, int)
        state.get_var / set_var     SGLang's names for state["x"] / state["x"] = value
        state.ret_value             what the program body returned
        state.get_meta_info("answer")
                                    prompt/completion/cached token counts, finish reason,
                                    logprobs (gen) or per-choice scores (select)
        state.sync()                wait for every pending append; raise the program's error
        state.error()               the program's error or None
        state.text_iter("answer")   the text (or one variable) in pieces as generated
        state.partial_iter("answer")
                                    a JSON gen's value so far, as it streams
        state.cancel()              stop the program (see `cancel`)
    """

    def __init__(
        self,
        context: RunContext,
        *,
        origin: ForkPoint | None = None,
        inherited: Inherited | None = None,
        body_thread: int | None = None,
    ) -> None:
        super().__init__(context.defaults, inherited)
        self._context = context
        self._record = StateRecord()
        self._body_thread = body_thread  # the thread running the program body, once known
        executor = NodeExecutor(
            self._record,
            context.backend,
            context.template,
            context.stream,
            context.num_api_spec_tokens,
            context.allow_special_tokens,
        )
        self._worker = Worker(self._record, executor, origin)
        self._children: list[ProgramState] = []  # fork copies, cancelled with this state
        if context.stream:  # a streamed state nobody holds any more: stop its generation
            weakref.finalize(self, _abandoned, self._record, self._children)
        self.ret_value: Any = None  # what the program body returned (SGLang's state.ret_value)

    # ---- front-half hooks --------------------------------------------------------

    def _submit(self, steps: tuple[Step, ...], defines: tuple[str, ...]) -> None:
        self._raise_if_cancelled()
        self._worker.submit(steps, defines)

    def _raise_if_cancelled(self) -> None:
        if self._record.cancelled:
            raise self._record.error or ProgramCancelled("the program was cancelled")

    def _spawn(self, fork: Fork, inherited: Inherited) -> list[ProgramState]:
        self._raise_if_cancelled()
        point = ForkPoint()
        children = [
            ProgramState(
                self._context, origin=point, inherited=inherited, body_thread=self._body_thread
            )
            for _ in range(fork.n)
        ]
        self._children.extend(children)
        self._worker.submit(((fork, point),), ())
        if self._record.cancelled:  # cancelled while the copies were made
            for child in children:
                child.cancel()
        return children

    def _submit_join(
        self, join: Join, children: Sequence[ProgramState], defines: tuple[str, ...]
    ) -> None:
        self._raise_if_cancelled()
        self._worker.submit(((join, [c._record for c in children]),), defines)

    def _on_close(self) -> None:
        self._worker.end()

    def _accept_arg(self, node: ArgRef) -> None:
        raise TypeError(
            f"argument {node.name!r} is an lp.Arg placeholder, which only trace() accepts; pass a value"
        )

    # ---- cancellation ------------------------------------------------------------

    def cancel(self) -> None:
        """Stop the program. Safe from any thread, any number of times; a no-op once the
        program has finished or failed.

        The running gen's backend request is aborted at its next token (the Runtime frees
        its KV and counts it as an abort; llama.cpp stops decoding), queued appends are
        dropped, fork copies are cancelled too, and readers (`s["x"]`, `sync()`, the text
        iterators) and the program body at its next append or read raise
        `lp.ProgramCancelled`, which `error()` then reports. A `select` or `cache_prefix`
        call in flight runs to its end first.

        Also cancelled: a streamed run (`run(stream=True)`) whose `text_iter` /
        `text_async_iter` is left before it ended (break, close, garbage collection), and
        `run_async` when its awaiting task is cancelled (`asyncio.wait_for` timing out).
        """
        for child in list(self._children):  # also copies still running after the body ended
            child.cancel()
        if self._closed is not None and self._record.is_idle():
            return  # the program is complete: nothing to stop
        self._record.cancel(ProgramCancelled("the program was cancelled (state.cancel())"))

    def _leaving_cancels(self, pieces: Iterator[str]) -> Iterator[str]:
        """`pieces`, cancelling a streamed run when the caller leaves before the end."""
        complete = False
        try:
            yield from pieces
            complete = True
        finally:
            if not complete and self._context.stream:
                self.cancel()

    # ---- readers -----------------------------------------------------------------

    def __getitem__(self, name: str) -> Any:
        """The value of variable `name`, waiting until it is ready.

        Raises the program's error if it failed first, and KeyError (listing the variables
        there are) when no such variable can appear.
        """
        if not isinstance(name, str):
            raise TypeError(f"variable names are str, got {type(name).__name__}")
        undeclared = name not in self._declared
        # The program's own thread cannot wait for a variable it has not asked for yet.
        fail_fast = undeclared and (
            self._closed is not None or threading.get_ident() == self._body_thread
        )
        return self._record.wait_var(name, fail_fast)

    def __contains__(self, name: object) -> bool:
        """Whether variable `name` has a value now (set by a gen or select that ran, a join,
        a var_scope or `set_var`); never waits."""
        with self._record.cond:
            return name in self._record.variables

    def _store_var(self, name: str, value: Any) -> None:
        self._record.put_var(name, value)

    def text(self) -> str:
        """The text so far, after every pending append has run (or the program failed)."""
        self._record.wait_idle()
        return self._record.text

    def messages(self) -> list[dict[str, str]]:
        """The role messages so far, as [{"role": ..., "content": ...}, ...].

        A role still open (`lp.user_begin()` without its `user_end()`, also a fork copy
        inside its parent's role) is the last message, with its content so far: nothing
        the program appended is left out."""
        self._record.wait_idle()
        record = self._record
        with record.cond:
            out = [dict(m) for m in record.messages]
            if record.open_message is not None:
                role, start = record.open_message
                out.append({"role": role, "content": record._text_locked()[start:]})
            return out

    def get_meta_info(self, name: str) -> Any:
        """Meta info of variable `name` (waits like `s[name]`).

        gen: prompt_tokens, completion_tokens, cached_tokens, finish_reason (SGLang's:
        {"type": "stop", "matched": ...}, {"type": "length", "length": N}), matched_stop,
        and output_token_logprobs when asked; select: SGLang's normalized_prompt_logprobs,
        input_token_logprobs, output_token_logprobs (and its method's keys), and lmprog's
        choices, choices_method, normalized_scores, token_logprobs, prompt_tokens,
        cached_tokens; a gen with n > 1 or a gathered fork variable: a list with one entry
        per sample or copy; a var_scope: {}.
        """
        self[name]
        with self._record.cond:
            return self._record.meta.get(name, {})

    @overload
    def parsed(self, name: str) -> Any: ...

    @overload
    def parsed(self, name: str, as_type: type[T]) -> T: ...

    def parsed(self, name: str, as_type: Any = None) -> Any:
        """The parsed value of variable `name` (waits like `s[name]`).

        For `gen(name, json_schema=Model)` with a pydantic model class: a `Model` instance;
        with a dict or JSON-string schema: the dict/list/...; for `dtype=int|float|bool|str`:
        the int/float/bool/str; for a regex gen, a plain gen or a select: the text, as
        `s[name]`; a gathered fork variable: a list with one entry per copy. `s[name]`
        itself is always the text, as in SGLang.

        `as_type` (a class, or a type such as `list[Model]`): the type the value has, for
        type checkers (`state.parsed("person", Person)` is a `Person` to them) and checked
        here: a value of another type raises TypeError (a class by isinstance, another
        type by pydantic's strict validation, the value returned as it is).

        Raises `lp.ConstraintError` (naming the variable and the finish reason) when the
        text does not parse, e.g. a gen cut short at max_tokens inside its constraint: its
        `s[name]` is then the partial text and its meta info says finish_reason "length".
        """
        value = self[name]
        with self._record.cond:
            entry = self._record.parsed.get(name)
        if isinstance(entry, list):
            values = value if isinstance(value, list) else [None] * len(entry)
            value = [_resolve(e, v) for e, v in zip(entry, values)]
        else:
            value = _resolve(entry, value)
        return value if as_type is None else checked_type(value, as_type, f"parsed({name!r})")

    def sync(self) -> None:
        """Wait until every append so far has run; raise the program's error if it failed."""
        error = self._record.wait_idle()
        if error is not None:
            raise error

    def error(self) -> BaseException | None:
        """The program's error (after the appends so far have run), or None."""
        return self._record.wait_idle()

    @overload
    def text_iter(
        self, var: str | None = None, return_meta_data: Literal[False] = False
    ) -> Iterator[str]: ...
    @overload
    def text_iter(
        self, var: str | None, return_meta_data: Literal[True]
    ) -> Iterator[tuple[str, dict[str, Any]]]: ...
    @overload
    def text_iter(
        self, var: str | None = None, *, return_meta_data: Literal[True]
    ) -> Iterator[tuple[str, dict[str, Any]]]: ...

    def text_iter(
        self, var: str | None = None, return_meta_data: bool = False
    ) -> Iterator[str] | Iterator[tuple[str, dict[str, Any]]]:
        """The text in pieces as it is produced (with `var`: only that variable's pieces).

        The pieces concatenate to `text()` (or to the variable's text). The iterator ends
        when the program (or the variable) is complete, and raises the program's error if
        it failed first. With `run(stream=True)` gens arrive token by token, and leaving the
        iterator before its end (break, close, garbage collection) cancels the run (see
        `cancel`); on other states it only stops reading.

        With `return_meta_data=True` it yields `(piece, meta_info)` pairs, as SGLang's
        streams do: for a piece the model generated, `completion_tokens` so far and, when
        the gen asked for logprobs (`return_logprob=True`), the piece's own
        `output_token_logprobs` and `output_token_logprobs_length` (the count so far); for
        other text (the program's own, a backend that does not report progress) `{}`.
        """
        _check_var(var)
        pieces = self._leaving_cancels(self._record.iter_pieces(var))
        return _with_meta(pieces) if _flag(return_meta_data) else pieces

    def partial_iter(self, var: str, *, partial_strings: bool = False) -> Iterator[Any]:
        """The JSON value of variable `var` as its gen streams (a `json_schema` gen's).

        Each item is the value parsed from the text so far, yielded when it changed: an
        object with the members complete so far (an object or array still open holds what
        is complete of it), a number only once it is complete, a string only once closed
        unless `partial_strings=True` (then the open string so far). Items are plain JSON
        values (dict, list, str, ...) even for `json_schema=Model`: a model instance needs
        every required field and its validators, which a value still being written has not
        met; `state.parsed(var)` gives the typed value once the gen is complete. The last
        item is the whole value (or, for a gen cut short at max_tokens, what is complete of
        it). Ends, raises and cancels a streamed run when left early as `text_iter(var)`;
        raises ValueError if the text is not JSON.
        """
        if not isinstance(var, str):
            raise TypeError(f"partial_iter() takes a variable name (str), got {type(var).__name__}")
        reader = PartialJSON(_flag(partial_strings, "partial_strings"))
        return _partials(self.text_iter(var), reader)

    async def partial_async_iter(
        self, var: str, *, partial_strings: bool = False
    ) -> AsyncIterator[Any]:
        """`partial_iter` for asyncio: awaits new pieces without blocking the event loop."""
        if not isinstance(var, str):
            raise TypeError(
                f"partial_async_iter() takes a variable name (str), got {type(var).__name__}"
            )
        reader = PartialJSON(_flag(partial_strings, "partial_strings"))
        pieces = cast(AsyncGenerator[str, None], self.text_async_iter(var))
        try:
            async for piece in pieces:
                for value in reader.feed(piece):
                    yield value
            for value in reader.finish():
                yield value
        finally:
            await pieces.aclose()

    @overload
    def text_async_iter(
        self, var: str | None = None, return_meta_data: Literal[False] = False
    ) -> AsyncIterator[str]: ...
    @overload
    def text_async_iter(
        self, var: str | None, return_meta_data: Literal[True]
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]: ...
    @overload
    def text_async_iter(
        self, var: str | None = None, *, return_meta_data: Literal[True]
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]: ...

    async def text_async_iter(
        self, var: str | None = None, return_meta_data: bool = False
    ) -> AsyncIterator[str | tuple[str, dict[str, Any]]]:
        """`text_iter` for asyncio: awaits new pieces without blocking the event loop."""
        _check_var(var)
        with_meta = _flag(return_meta_data)
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def notify() -> None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop closed while the program ran on
                pass

        record = self._record
        record.add_listener(notify)
        complete = False
        try:
            i = 0
            while True:
                wake.clear()
                chunk, i, done, error = record.take_pieces(var, i)
                for piece in chunk:
                    yield (piece, _piece_meta(piece)) if with_meta else piece
                if error is not None:
                    complete = True
                    raise error
                if done:
                    complete = True
                    return
                if not chunk:
                    await wake.wait()
        finally:
            record.remove_listener(notify)
            if not complete and self._context.stream:  # left early (or the task cancelled)
                self.cancel()

    async def _wait_finished_async(self) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not done.done():
                done.set_result(None)

        def on_finish() -> None:
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:
                pass

        self._record.when_finished(on_finish)
        try:
            await done
        except asyncio.CancelledError:  # run_async cancelled (e.g. wait_for timed out)
            self.cancel()
            raise

    def __repr__(self) -> str:
        record = self._record
        status = "failed" if record.error else "finished" if record.finished else "running"
        return (
            f"<ProgramState {status}, {record.length} chars, variables {sorted(record.variables)}>"
        )


def _abandoned(record: StateRecord, children: list[ProgramState]) -> None:
    """A streamed state was garbage-collected before its end: nobody can read what it would
    generate, so its running gen is aborted like `cancel()` does (fork copies too)."""
    for child in list(children):
        child.cancel()
    if not record.finished:
        record.cancel(ProgramCancelled("the streamed program's state was garbage-collected"))


def _flag(value: Any, name: str = "return_meta_data") -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _partials(pieces: Iterator[str], reader: PartialJSON) -> Iterator[Any]:
    """Each changed value of `reader` as `pieces` (a variable's text) arrive, the whole
    text's last. Closing this closes `pieces` (a streamed run is cancelled)."""
    try:
        for piece in pieces:
            yield from reader.feed(piece)
        yield from reader.finish()
    finally:
        close = getattr(pieces, "close", None)
        if close is not None:
            close()


def _piece_meta(piece: str) -> dict[str, Any]:
    return piece.meta_info() if isinstance(piece, StreamPiece) else {}


def _with_meta(pieces: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    for piece in pieces:
        yield piece, _piece_meta(piece)


def _resolve(entry: Parsed | None, value: Any) -> Any:
    if entry is None:
        return value
    if entry.error is not None:
        raise ConstraintError(entry.error)
    return entry.value


def _check_var(var: object) -> None:
    if var is not None and not isinstance(var, str):
        raise TypeError(f"var must be a variable name (str) or None, got {type(var).__name__}")
