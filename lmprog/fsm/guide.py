"""A cheap mutable cursor over a TokenIndex: one per sequence (and per fork).

How an engine decodes under a constraint (runtime: batched; llama.cpp: one sequence):

    index = TokenIndex.get(constraint, tokenizer)   # or poll TokenIndex.prefetch(...).done()
    guide, out = index.new_guide(), []
    while True:
        r = jump_forward(guide, out, tokenizer, enabled=jump,   # lmprog.fsm.jump
                         max_new_tokens=max_tokens - len(out))
        out = r.apply(out)          # engine: drop r.drop_last_n_tokens KV slots, feed new ids
        if guide.is_finished(): finish "stop"                  # only EOS could follow
        if len(out) >= max_tokens: finish "length", message guide.length_message()
        apply_bitmask_(logits, allowed_bitmask([guide], width))   # lmprog.fsm.mask
        token = sample(logits)
        guide.advance(token)        # ValueError if not allowed (a sampler bug)
        if token == index.eos_token_id: finish "stop"
        out.append(token)

The guide keeps the list of states it went through (one int per token), so it can roll back
(`rollback(n)`, used by jump-forward's retokenization) and be copied for a fork. After EOS
(allowed only where `can_stop()`), the guide is finished and allows nothing more.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from lmprog.fsm.index import TokenIndex

_NOTHING = np.zeros(0, dtype=np.int32)
_NOTHING.flags.writeable = False


class Guide:
    """Position of one sequence in a constraint. Not thread-safe; `copy()` per fork."""

    __slots__ = ("index", "_states", "_ended")

    def __init__(
        self, index: TokenIndex, states: Iterable[int] | None = None, ended: bool = False
    ) -> None:
        self.index = index
        self._states: list[int] = list(states) if states is not None else [index.initial_state]
        self._ended = ended
        assert self._states, "a guide has at least its initial state"

    @property
    def state(self) -> int:
        """The current index state (an outlines-core state id)."""
        return self._states[-1]

    @property
    def eos_consumed(self) -> bool:
        return self._ended

    @property
    def num_tokens(self) -> int:
        """Tokens advanced through since the start of the constraint (EOS included)."""
        return len(self._states) - 1 + int(self._ended)

    def allowed_token_ids(self) -> np.ndarray:
        """Sorted int32 ids allowed next (read-only); EOS among them iff `can_stop()`."""
        return _NOTHING if self._ended else self.index.allowed_ids(self.state)

    def is_allowed(self, token_id: int) -> bool:
        return not self._ended and self.index.next_state(self.state, int(token_id)) is not None

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
        nxt = self.index.next_state(self.state, token_id)
        if nxt is None:
            raise ValueError(
                f"token {token_id} ({self._describe(token_id)}) is not allowed by the constraint here"
            )
        self._states.append(nxt)

    def advance_all(self, token_ids: Iterable[int]) -> None:
        """Advance through several tokens; on a disallowed one, raise with the guide unchanged."""
        mark = len(self._states), self._ended
        try:
            for t in token_ids:
                self.advance(t)
        except ValueError:
            del self._states[mark[0] :]
            self._ended = mark[1]
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
            del self._states[-n:]

    def can_stop(self) -> bool:
        """The text so far is a complete match (EOS allowed now)."""
        return self._ended or self.index.is_accepting(self.state)

    def is_finished(self) -> bool:
        """No token but EOS can follow (or EOS was consumed): the engine may stop here."""
        return self._ended or self.index.is_finished(self.state)

    def copy(self) -> Guide:
        return Guide(self.index, self._states, self._ended)

    def length_message(self) -> str:
        """What an engine says when max_tokens stops it inside this constraint."""
        if self.can_stop():
            return "max_tokens reached; the output is a complete match of the constraint"
        return (
            "max_tokens reached inside the constraint: the output is an incomplete match "
            "(raise max_tokens to let it finish)"
        )

    def _describe(self, token_id: int) -> str:
        vocab = self.index.vocab
        if not 0 <= token_id < vocab.size:
            return "outside the vocabulary"
        b = vocab.token_bytes[token_id]
        return "a special token" if b is None else repr(b.decode("utf-8", "replace"))

    def __repr__(self) -> str:
        return f"Guide(state={self.state}, tokens={self.num_tokens}, can_stop={self.can_stop()})"
