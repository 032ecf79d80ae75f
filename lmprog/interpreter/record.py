"""What the readers of one state see: text pieces, variables, messages, status.

Written by the state's worker thread only, read from any thread; one condition variable
guards everything, so a reader waits for exactly what it needs (`s["x"]`, `sync()`,
`text_iter()`), and none can hang: a failing worker records the error and still counts every
drained step. Design: docs/design/frontend.md.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmprog.core.images import ImageInput

Captures = tuple[str, ...]  # the variables a piece of text belongs to


@dataclass(frozen=True)
class Parsed:
    """A constrained gen's parsed value (`state.parsed(name)`), or why it has none.

    `error` is None when the text parsed; otherwise it says why not (e.g. the gen stopped
    at max_tokens inside the constraint) and `value` is unused.
    """

    value: Any = None
    error: str | None = None


ASIDE = "\x00aside"  # a capture marking a piece that is not in the text (no variable's name)


class StateRecord:
    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self._pieces: list[tuple[str, Captures]] = []
        self._text = ""
        self._joined = 0  # pieces already folded into _text
        self.length = 0  # len(text), kept without joining
        self.variables: dict[str, Any] = {}
        self.meta: dict[str, Any] = {}
        # constrained gens' parsed values (a list of them for a gathered fork variable)
        self.parsed: dict[str, Parsed | list[Parsed | None]] = {}
        self.messages: list[dict[str, str]] = []
        # (start, end) of text where special-token strings are control tokens: the chat
        # template's role markers and generated text (lmprog.core.prompt.Prompt)
        self.control: list[tuple[int, int]] = []
        # the images appended (lp.image), in order: (offset of its image token, the image)
        self.images: list[tuple[int, ImageInput]] = []
        # the role message begun and not yet ended: (role, offset of its content)
        self.open_message: tuple[str, int] | None = None
        self.new_names: dict[
            str, None
        ] = {}  # variables set since the state began (what join gathers)
        self.origin_text_len = 0  # where a fork's copy starts its own text
        self.origin_messages_len = 0
        self._var_end: dict[str, int] = {}  # piece count when a variable was set
        self._pending: dict[str, int] = {}  # submitted definitions of a variable not yet run
        self.error: BaseException | None = None
        self.cancelled = False  # set by cancel(): the running gen aborts at its next piece
        self._submitted = 0
        self._executed = 0
        self.finished = False
        self._listeners: list[Callable[[], None]] = []
        self._on_finish: list[Callable[[], None]] = []

    # ---- writers -----------------------------------------------------------------

    def append(self, piece: str, captures: Captures) -> None:
        with self.cond:
            self._pieces.append((piece, captures))
            self.length += len(piece)
            self._notify()

    def append_aside(self, piece: str, captures: Captures) -> None:
        """A streamed piece of `captures`' variables that is not the state's text (a
        reasoning model's thinking under separate_reasoning)."""
        with self.cond:
            self._pieces.append((piece, (*captures, ASIDE)))
            self._notify()

    def set_var(
        self, name: str, value: Any, meta: Any, parsed: Parsed | list[Any] | None = None
    ) -> None:
        with self.cond:
            self.variables[name] = value
            self.meta[name] = meta
            if parsed is None:
                self.parsed.pop(name, None)
            else:
                self.parsed[name] = parsed
            if self._pending.get(name):
                self._pending[name] -= 1
            self.new_names[name] = None
            self._var_end[name] = len(self._pieces)
            self._notify()

    def put_var(self, name: str, value: Any) -> None:
        """A value the program set itself (`s.set_var`): no step of the worker defines it."""
        with self.cond:
            self.variables[name] = value
            self.meta[name] = {}
            self.parsed.pop(name, None)
            self.new_names[name] = None
            self._var_end[name] = len(self._pieces)
            self._notify()

    def mark_control(self, start: int, end: int) -> None:
        """Text [start, end) came from the chat template or the model, not the user."""
        if end <= start:
            return
        with self.cond:
            if self.control and self.control[-1][1] == start:
                self.control[-1] = (self.control[-1][0], end)
            else:
                self.control.append((start, end))

    def add_image(self, image: ImageInput) -> None:
        """An image whose token text is appended next (at the current end of the text)."""
        with self.cond:
            self.images.append((self.length, image))

    def images_before(self, end: int) -> tuple[ImageInput, ...]:
        """The images whose token text starts before offset `end`, in order."""
        with self.cond:
            return tuple(image for at, image in self.images if at < end)

    def add_message(self, role: str, content: str) -> None:
        with self.cond:
            self.messages.append({"role": role, "content": content})

    def restore(
        self,
        text: str,
        variables: dict[str, Any],
        meta: dict[str, Any],
        messages: list[dict[str, str]],
        parsed: dict[str, Parsed | list[Parsed | None]] | None = None,
        control: tuple[tuple[int, int], ...] = (),
        images: tuple[tuple[int, ImageInput], ...] = (),
    ) -> None:
        """Start as a copy of a parent at a fork (before any step of this state ran)."""
        with self.cond:
            assert not self._pieces and not self.variables, "restore() only on a fresh record"
            if text:
                self._pieces.append((text, ()))
            self.length = self.origin_text_len = len(text)
            self.variables.update(variables)
            self.meta.update(meta)
            self.parsed.update(parsed or {})
            self.messages.extend(messages)
            self.control.extend(control)
            self.images.extend(images)
            self.origin_messages_len = len(messages)
            self._notify()

    def fail(self, error: BaseException) -> None:
        """Record the program's error; the first one wins."""
        with self.cond:
            if self.error is None:
                self.error = error
                self._notify()

    def cancel(self, error: BaseException) -> bool:
        """Fail the state with `error` (a ProgramCancelled) unless it already failed or
        finished; True if it did. Readers wake with the error; the worker drops queued steps."""
        with self.cond:
            if self.error is not None or self.finished:
                return False
            self.cancelled = True
            self.error = error
            self._notify()
            return True

    def count_submitted(self, defines: Sequence[str]) -> None:
        """Called by the front half before it enqueues a step that sets `defines`: readers
        of those variables now wait for the new value (a loop re-generating `s["x"]`)."""
        with self.cond:
            self._submitted += 1
            for name in defines:
                self._pending[name] = self._pending.get(name, 0) + 1

    def step_done(self) -> None:
        with self.cond:
            self._executed += 1
            if self._executed == self._submitted:
                self._notify()

    def finish(self) -> None:
        with self.cond:
            self.finished = True
            self._notify()
            callbacks, self._on_finish = self._on_finish, []
        for callback in callbacks:
            callback()

    def _notify(self) -> None:
        self.cond.notify_all()
        for listener in self._listeners:
            listener()

    # ---- readers -----------------------------------------------------------------

    @property
    def text(self) -> str:
        with self.cond:
            return self._text_locked()

    def _text_locked(self) -> str:
        if self._joined != len(self._pieces):
            self._text += "".join(p for p, c in self._pieces[self._joined :] if ASIDE not in c)
            self._joined = len(self._pieces)
        return self._text

    def wait_var(self, name: str, fail_fast: bool) -> Any:
        """The value of `name` once set; raises the program's error, or KeyError when
        `name` cannot appear any more (`fail_fast`: the caller knows it was never declared)."""
        with self.cond:
            while True:
                if name in self.variables and not self._pending.get(name):
                    return self.variables[name]
                if self.error is not None:
                    raise self.error
                if self.finished and name in self.variables:
                    return self.variables[name]
                if fail_fast or self.finished:
                    raise KeyError(
                        f"no variable {name!r} (yet); available: {sorted(self.variables)}"
                    )
                self.cond.wait()

    def wait_idle(self) -> BaseException | None:
        """Wait until every submitted step ran, or the program failed; return its error."""
        with self.cond:
            while self._executed < self._submitted and self.error is None:
                self.cond.wait()
            return self.error

    def is_idle(self) -> bool:
        """Whether every submitted step has run without error (does not wait)."""
        with self.cond:
            return self.error is None and self._executed == self._submitted

    def wait_finished(self) -> None:
        with self.cond:
            while not self.finished:
                self.cond.wait()

    def when_finished(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from the worker thread) once the state finishes; now if it has."""
        with self.cond:
            if not self.finished:
                self._on_finish.append(callback)
                return
        callback()

    def add_listener(self, listener: Callable[[], None]) -> None:
        """`listener()` is called, under the lock, after every change. Keep it tiny."""
        with self.cond:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        with self.cond:
            self._listeners.remove(listener)

    # ---- streaming ---------------------------------------------------------------

    def take_pieces(
        self, var: str | None, start: int
    ) -> tuple[list[str], int, bool, BaseException | None]:
        """Pieces from index `start` (only those of `var`, if given), the next index,
        whether nothing more can come, and the error to raise after these pieces (the
        program's error, unless `var` was completed before it failed)."""
        with self.cond:
            return self._take_locked(var, start)

    def _take_locked(
        self, var: str | None, start: int
    ) -> tuple[list[str], int, bool, BaseException | None]:
        if var is not None and var in self._var_end and not self._pending.get(var):
            end, done, error = self._var_end[var], True, None
        else:
            end, error = len(self._pieces), self.error
            done = self.finished or error is not None
        chunk = [
            p
            for p, caps in self._pieces[start:end]
            if (var in caps if var is not None else ASIDE not in caps)
        ]
        return chunk, end, done, error

    def iter_pieces(self, var: str | None) -> Iterator[str]:
        i = 0
        while True:
            with self.cond:
                chunk, i_next, done, error = self._take_locked(var, i)
                while not (chunk or done or i_next != i):
                    self.cond.wait()
                    chunk, i_next, done, error = self._take_locked(var, i)
            i = i_next
            yield from chunk
            if error is not None:
                raise error
            if done:
                return
