"""How long a request may grow: its prompt plus one token must fit the model's context
length and the whole KV pool, and it is cut there; with attention sinks any prompt fits
and nothing is cut (it is fed in chunks, evictions keep its KV within the window), but
prompt logprobs need the whole prompt in the window."""

from __future__ import annotations

import sys

from lmprog.core.errors import ContextLengthError

from ..cache.manager import CacheManager
from ..request import Req
from .sinks import SinkWindow


class LengthLimits:
    def __init__(self, max_context_len: int, cache: CacheManager, sinks: SinkWindow | None):
        self.max_context_len = max_context_len
        self.cache = cache
        self.sinks = sinks

    def check_fits(self, prompt_len: int) -> None:
        """Scheduler.check_fits: the contract is documented there."""
        if self.sinks is not None:
            return
        need = prompt_len + 1
        if need > self.max_context_len:
            raise ContextLengthError(
                f"prompt of {prompt_len} tokens plus 1 generated token exceeds the "
                f"model's context length of {self.max_context_len} tokens; shorten the prompt",
                prompt_tokens=prompt_len,
                limit=self.max_context_len,
            )
        if self.cache.round_up(need) > self.cache.capacity:
            raise ContextLengthError(
                f"prompt of {prompt_len} tokens plus 1 generated token does not fit the "
                f"KV pool of {self.cache.capacity} tokens; shorten the prompt or raise the KV "
                "memory budget (max_total_tokens)",
                prompt_tokens=prompt_len,
                limit=self.cache.capacity,
                setting="max_total_tokens",
            )

    def cap(self, req: Req) -> None:
        """Set req's length cap (max_seq_len, and stop_len within it); ContextLengthError,
        changing nothing, when its prompt logprobs cannot be had."""
        if self.sinks is None:
            req.max_seq_len = min(self.max_context_len, self.cache.capacity)
            req.stop_len = min(req.stop_len, req.max_seq_len)
        elif req.prompt_logprob_start is not None and req.prompt_len + 1 > self.sinks.limit:
            raise ContextLengthError(
                f"prompt logprobs need the whole prompt in the attention-sink window: a prompt "
                f"of {req.prompt_len} tokens plus 1 exceeds its {self.sinks.limit} tokens"
            )
        else:
            req.max_seq_len = sys.maxsize  # evictions keep the KV within the window
