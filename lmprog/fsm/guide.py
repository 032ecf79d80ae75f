"""A mutable cursor over a TokenIndex: one per sequence (and per fork).

    guide = index.new_guide()
    guide.advance(token)   guide.rollback(n)   guide.copy()   guide.can_stop()

It owns an llguidance matcher at its position and the tokens it went through, so it rolls
back (jump-forward's retokenization) and forks; after EOS it is finished and allows nothing
more. The loop an engine decodes with under a constraint: docs/design/constraints.md.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import numpy as np

from lmprog.core.errors import ConstraintError
from lmprog.fsm.vocab import TokenVocab

if TYPE_CHECKING:
    from llguidance import LLExecutor, LLMatcher

    from lmprog.fsm.checks import JsonChecks, State

_T = TypeVar("_T")

ROOT = 0  # the path node of a guide's start


class GuideIndex(Protocol):
    """What a guide reads of its index: a ``lmprog.fsm.index.TokenIndex``, which makes guides
    (``new_guide``)."""

    check: JsonChecks | None
    vocab: TokenVocab

    @property
    def eos_token_id(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def num_words(self) -> int: ...
    def new_matcher(self) -> tuple[LLMatcher, int]: ...
    def own_matcher(self, steps: int) -> LLMatcher: ...
    def lexer_failed(self, lexer: int) -> None: ...
    def path_node(self, node: int, token_id: int) -> int: ...
    def state_cache(self, name: Hashable, capacity: int = ...) -> Any: ...
    def reason(self, error: str) -> str: ...


_I32 = np.dtype(np.int32)
WORDS_CACHE_SIZE = 4096  # bitmask words per index (6 kB each on a 49k vocabulary)


class Guide:
    """Position of one sequence in a constraint. Not thread-safe; `copy()` per fork."""

    __slots__ = (
        "index",
        "_matcher",
        "_lexer",
        "_tokens",
        "_states",
        "_ended",
        "_checks",
        "_by_node",
    )

    def __init__(
        self,
        index: GuideIndex,
        matcher: tuple[LLMatcher, int | None] | None = None,
        tokens: Iterable[int] = (),
        states: Iterable[int] | None = None,
        ended: bool = False,
        checks: Iterable[State] | None = None,
    ) -> None:
        """matcher: (an llguidance matcher at this position, the generation of the index's
        lexer it shares, or None for a lexer of its own); default: the index's start."""
        self.index = index
        self._by_node = _words(index)  # the index's bitmask words by position
        self._matcher, self._lexer = matcher if matcher is not None else index.new_matcher()
        # the tokens advanced through (EOS aside) and the path node after each: _states[i + 1]
        # is the node after _tokens[i]
        self._tokens: list[int] = list(tokens)
        self._states: list[int] = list(states) if states is not None else [ROOT]
        self._ended = ended
        # the index's check (lmprog.fsm.checks): its state after each token, like _states
        check = index.check
        self._checks: list[State] | None = (
            None if check is None else list(checks) if checks is not None else [check.start()]
        )

    @property
    def state(self) -> int:
        """The current path node: a key for data derived from this position (-1: uncached)."""
        return self._states[-1]

    @property
    def eos_consumed(self) -> bool:
        return self._ended

    @property
    def num_tokens(self) -> int:
        """Tokens advanced through since the start of the constraint (EOS included)."""
        return len(self._states) - 1 + int(self._ended)

    # ---- what is allowed --------------------------------------------------------------------
    def bitmask_words(self) -> np.ndarray:
        """int32 [ceil(vocab / 32)]: the tokens allowed next, bit t % 32 of word t // 32
        (read-only, a view of the position's cached bytes). EOS is set iff `can_stop()`;
        after EOS, only EOS."""
        if self._ended:
            return np.frombuffer(_eos_only(self.index), _I32)
        node = self._states[-1]
        data: bytes | None = self._by_node.get(node) if node >= 0 else None
        if data is None:  # a first visit: computed in the thread's scratch row
            data = self.write_bitmask_words(*_mask_scratch(self.index.num_words))
        return np.frombuffer(data, _I32)

    def write_bitmask_words(self, row: np.ndarray, address: int) -> bytes:
        """Write `bitmask_words()` into `row`; returns their bytes, as cached. `row`: a
        writable C-contiguous int32 numpy array of index.num_words words ([n] or [1, n]);
        `address`: its data's address, not checked (`allowed_bitmask(..., out=)` is the
        checked way in). On a first visit llguidance computes the mask there and the cache
        keeps a copy of it (no scratch row in between)."""
        node = self._states[-1]
        data = self._by_node.get(node) if node >= 0 and not self._ended else None
        if data is None:
            if self._ended:
                data = _eos_only(self.index)
            else:  # a first visit (each step of a new schema: kept short)
                index, matcher = self.index, self._matcher
                matcher.unsafe_compute_mask_ptr(address, 4 * index.num_words)
                if matcher.is_error() or index.check is not None:
                    return self._first_visit(node, row)
                # the one copy, a bytes object: numpy's, for after the computation, caches
                # cold, a ctypes call costs µs
                data = row.tobytes()
                if node >= 0:
                    self._by_node.put(node, data)
                return data
        ctypes.memmove(address, data, len(data))
        return data

    def _first_visit(self, node: int, row: np.ndarray) -> bytes:
        """`write_bitmask_words` where llguidance, having computed the mask into `row`,
        met an error (recovered from: computed again), or the index has a check to filter
        it with: the words cached and written into `row`."""
        matcher = self._matcher
        if matcher.is_error():  # as `_run`: recover, then once more (or raise)
            self._recover(matcher.get_error())
            words = self._run(lambda m: _computed(m, self.index.num_words))
        else:
            words = np.frombuffer(row.tobytes(), _I32)
        data = self._checked(words).tobytes()
        if node >= 0:
            self._by_node.put(node, data)
        row[...] = np.frombuffer(data, _I32)
        return data

    def _checked(self, words: np.ndarray) -> np.ndarray:
        """The mask without the tokens the index's check refuses from here."""
        check, checks = self.index.check, self._checks
        if check is None or checks is None or not check.active(checks[-1]):
            return words
        from lmprog.fsm.check_masks import filter_words

        words = filter_words(check, checks[-1], words, self.index.vocab)
        if not words.any():
            reason = check.stuck(checks[-1])
            raise ConstraintError(f"the constraint cannot continue here: {reason}")
        return words

    def allowed_token_ids(self) -> np.ndarray:
        """Sorted int32 ids allowed next; EOS among them iff `can_stop()` (none after EOS)."""
        if self._ended:
            return np.zeros(0, dtype=np.int32)
        bits = np.unpackbits(self.bitmask_words().view(np.uint8), bitorder="little")
        return np.flatnonzero(bits[: self.index.vocab_size]).astype(np.int32)

    def is_allowed(self, token_id: int) -> bool:
        """Whether the token keeps the text a prefix of a match (EOS: a complete match). The
        mask may be narrower where the constraint forces text (its own tokenization only)."""
        token_id = int(token_id)
        if self._ended:
            return False
        if token_id == self.index.eos_token_id:
            return self.can_stop()
        if not 0 <= token_id < self.index.vocab_size:
            return False
        # (a special token: where the grammar names it, `<|call|>`; never under a check)
        return self._valid(token_id) and self._next_check(token_id) != 0

    def _next_check(self, token_id: int) -> State | Literal[0] | None:
        """The check's state after the token (None: no check; 0: the check refuses it)."""
        check, checks = self.index.check, self._checks
        if check is None or checks is None:
            return None
        data = self.index.vocab.token_bytes[token_id]
        if data is None:  # a special token: no JSON text
            return 0
        state = check.step(checks[-1], data)
        return 0 if state is None else state

    def can_stop(self) -> bool:
        """The text so far is a complete match (EOS allowed now)."""
        return self._ended or self._matcher.is_accepting()

    def is_finished(self) -> bool:
        """No token but EOS can follow (or EOS was consumed): the engine may stop here."""
        if self._ended:
            return True
        return self._matcher.is_accepting() and self._matcher.is_stopped()

    def forced_bytes(self) -> bytes:
        """The bytes every continuation from here starts with (b"" where the text may end or
        the next byte is a choice); cached per position."""
        if self._ended or self._matcher.is_accepting():
            return b""
        check, checks = self.index.check, self._checks
        if check is not None and checks is not None and check.active(checks[-1]):
            return b""  # the text forced may repeat an item: let the masks decide
        node = self.state
        cache = self.index.state_cache("forced")
        forced = cache.get(node) if node >= 0 else None
        if forced is None:
            forced = self._run(lambda m: m.compute_ff_bytes())
            if node >= 0:
                cache.put(node, forced)
        return forced

    # ---- moving -----------------------------------------------------------------------------
    def advance(self, token_id: int) -> None:
        """Consume one token; ValueError (state unchanged) if it is not allowed here."""
        token_id = int(token_id)
        if self._ended:
            raise ValueError(
                f"token {token_id} after EOS: the constrained output is already finished"
            )
        if token_id == self.index.eos_token_id:
            if not self.can_stop():
                raise ValueError("EOS is not allowed here: the output is not yet a complete match")
            self._ended = True
            return
        in_mask = self._in_mask(token_id)
        if not in_mask and not self.is_allowed(token_id):
            raise ValueError(
                f"token {token_id} ({self._describe(token_id)}) is not allowed by the constraint here"
            )
        check = self._next_check(token_id)
        if in_mask and check is not None and not check:  # (a mask the check filtered: never)
            raise ValueError(f"token {token_id} is refused by the constraint's check here")
        if not self._run(lambda m: m.consume_token(token_id)):
            raise AssertionError(f"llguidance refused token {token_id} that it allowed")
        self._tokens.append(token_id)
        self._states.append(self.index.path_node(self.state, token_id))
        if self._checks is not None and check:  # a State: is_allowed refused 0, None is no check
            self._checks.append(check)

    def _in_mask(self, token_id: int) -> bool:
        """Whether the position's mask, where it is computed already, has the token's bit: a
        token the engine drew from the mask is allowed without asking the matcher again (a
        mask never allows more than the matcher takes; a clear bit may still be allowed)."""
        node = self._states[-1]
        data = self._by_node.get(node) if node >= 0 else None
        if data is None or not 0 <= token_id >> 3 < len(data):
            return False
        return bool(data[token_id >> 3] >> (token_id & 7) & 1)  # (little-endian words)

    def advance_all(self, token_ids: Iterable[int]) -> None:
        """Advance through several tokens; on a disallowed one, raise with the guide unchanged."""
        before = self.num_tokens
        try:
            for t in token_ids:
                self.advance(t)
        except ValueError:
            self.rollback(self.num_tokens - before)
            raise

    def rollback(self, n: int) -> None:
        """Undo the last n tokens (EOS counts as one)."""
        if not 0 <= n <= self.num_tokens:
            raise ValueError(
                f"cannot roll back {n} tokens: the guide has advanced through {self.num_tokens}"
            )
        if n and self._ended:
            self._ended = False
            n -= 1
        if n:
            self._run(lambda m: m.rollback(n))
            del self._tokens[-n:]
            del self._states[-n:]
            if self._checks is not None:
                del self._checks[-n:]

    def copy(self) -> Guide:
        matcher = (self._matcher.deep_copy(), self._lexer)
        return Guide(self.index, matcher, self._tokens, self._states, self._ended, self._checks)

    def length_message(self) -> str:
        """What an engine says when max_tokens stops it inside this constraint."""
        if self.can_stop():
            return "max_tokens reached; the output is a complete match of the constraint"
        return (
            "max_tokens reached inside the constraint: the output is an incomplete match "
            "(raise max_tokens to let it finish)"
        )

    # ---- internals --------------------------------------------------------------------------
    def _run(self, op: Callable[[LLMatcher], _T]) -> _T:
        """`op(matcher)`; if the matcher meets an error there, once more on a matcher of its
        own at the same position (`_recover`). ConstraintError if it fails there too: this
        guide's own text is past the limits (its request fails, no other does)."""
        result = op(self._matcher)
        if self._matcher.is_error():
            self._recover(self._matcher.get_error())
            result = op(self._matcher)
            if self._matcher.is_error():
                raise ConstraintError(
                    f"the constraint cannot continue here: {self.index.reason(self._matcher.get_error())}"
                )
        return result

    def _recover(self, error: str) -> None:
        """The matcher met `error`. If it shared the index's lexer, that lexer may be spent for
        every guide: report it (the index renews it) and go on from a matcher of its own,
        advanced through this guide's tokens. ConstraintError if it had a lexer of its own
        already, or if its tokens are past the limits even there."""
        if self._lexer is None:
            raise ConstraintError(
                f"the constraint cannot continue here: {self.index.reason(error)}"
            )
        self.index.lexer_failed(self._lexer)
        matcher = self.index.own_matcher(len(self._tokens))
        if not matcher.consume_tokens(self._tokens) or matcher.is_error():
            raise ConstraintError(
                f"the constraint cannot continue here: {self.index.reason(matcher.get_error())}"
            )
        self._matcher, self._lexer = matcher, None

    def _valid(self, token_id: int) -> bool:
        """Whether the matcher takes the token; a refusal by a spent lexer is recovered from
        (`refused_by_spent_lexer`) and the question asked again."""
        if self._matcher.validate_tokens([token_id]) == 1:
            return True
        error = refused_by_spent_lexer(self._matcher, token_id)
        if error is None:
            return False
        self._recover(error)
        return self._matcher.validate_tokens([token_id]) == 1

    def _describe(self, token_id: int) -> str:
        vocab = self.index.vocab
        if not 0 <= token_id < vocab.size:
            return "outside the vocabulary"
        b = vocab.token_bytes[token_id]
        if b is None:
            name = dict(vocab.special_names).get(token_id)
            return "a special token" if name is None else f"the special token {name}"
        return repr(b.decode("utf-8", "replace"))

    def __repr__(self) -> str:
        return f"Guide(state={self.state}, tokens={self.num_tokens}, can_stop={self.can_stop()})"


def _computed(matcher: LLMatcher, n: int) -> np.ndarray:
    """The matcher's mask as `n` bitmask words, written in place by llguidance into the
    thread's scratch row, then copied out (read-only)."""
    scratch, address = _mask_scratch(n)
    matcher.unsafe_compute_mask_ptr(address, 4 * n)
    return np.frombuffer(scratch.tobytes(), _I32)


_S = TypeVar("_S")


def thread_scratch(store: threading.local, n: int, make: Callable[[int], _S]) -> _S:
    """This thread's scratch of size `n` in `store` (`make(n)` on first use), reused by every
    call; a thread that met several vocabularies keeps the last few sizes."""
    rows: dict[int, _S] | None = getattr(store, "rows", None)
    if rows is None:
        rows = store.rows = {}
    row = rows.get(n)
    if row is None:
        if len(rows) >= 4:
            rows.pop(next(iter(rows)))
        row = rows[n] = make(n)
    return row


_SCRATCH = threading.local()  # .rows: {words: (an int32 [words] row, its address)}


def _new_mask_row(n: int) -> tuple[np.ndarray, int]:
    words = np.empty(n, dtype=np.int32)
    return words, words.ctypes.data


def _mask_scratch(n: int) -> tuple[np.ndarray, int]:
    return thread_scratch(_SCRATCH, n, _new_mask_row)


def _words(index: GuideIndex) -> Any:
    """The index's cache of bitmask words by position: their bytes (immutable, shared; one
    copy out of the row llguidance wrote, with no array around it)."""
    return index.state_cache("words", WORDS_CACHE_SIZE)


def _eos_only(index: GuideIndex) -> bytes:
    """The words' bytes after EOS: EOS's bit alone."""
    cache = _words(index)
    data: bytes | None = cache.get("eos")
    if data is None:
        words = np.zeros(index.num_words, dtype=np.int32)
        eos = index.eos_token_id
        words[eos >> 5] = np.int32(np.uint32(1 << (eos & 31)).view(np.int32))
        data = words.tobytes()
        cache.put("eos", data)
    return data


_EXECUTOR: list[LLExecutor] = []


def prefetch_bitmask_words(guides: Sequence[Guide | None]) -> None:
    """Compute, in parallel on llguidance's thread pool (the GIL released), the bitmask words
    of every guide whose position is not cached yet, so that a batch step with many
    constrained rows costs about one mask computation instead of one per row. Each result
    is cached as `bitmask_words()` would cache it; a guide whose matcher fails is left for
    `bitmask_words()` to report."""
    if len(guides) < 2:  # one row: nothing to compute beside it
        return
    todo: dict[tuple[int, int], Guide] = {}
    for g in guides:
        if g is None or g._ended or g.state < 0 or g._checks is not None:
            continue  # (a guide with a check computes its own mask, then filters it)
        if g._by_node.get(g.state) is None:
            todo.setdefault((id(g.index), g.state), g)
    if len(todo) < 2:
        return
    import os

    import llguidance
    import llguidance.numpy

    if not _EXECUTOR:
        _EXECUTOR.append(llguidance.LLExecutor(num_threads=min(8, os.cpu_count() or 1)))
    batch = list(todo.values())
    out = np.zeros((len(batch), max(g.index.num_words for g in batch)), dtype=np.int32)
    llguidance.numpy.fill_next_token_bitmask_par(
        _EXECUTOR[0], [(g._matcher, i) for i, g in enumerate(batch)], out
    )
    for i, g in enumerate(batch):
        if g._matcher.is_error():
            continue
        g._by_node.put(g.state, out[i, : g.index.num_words].tobytes())


def refused_by_spent_lexer(matcher: LLMatcher, token_id: int) -> str | None:
    """The lexer's error if a matcher refused `token_id` (validating it, or trying to consume
    it) because its lexer is spent, else None. On a spent lexer every transition is dead,
    with no error until a token is consumed, which a copy then does (llguidance reports the
    lexer's error before any other)."""
    probe = matcher.deep_copy()
    probe.consume_token(token_id)
    error = probe.get_error() if probe.is_error() else ""
    return error if error.startswith("lexer error") else None
