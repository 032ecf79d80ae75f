"""The token-level automaton of a constraint over a model's vocabulary, built lazily.

    TokenIndex.get(constraint_or_pattern, tokenizer)      -> TokenIndex   (milliseconds)
    TokenIndex.prefetch(constraint_or_pattern, tokenizer) -> Future[TokenIndex] (never blocks)
    index.new_guide()                                     -> Guide (per-sequence cursor)

The token engine is llguidance (`LLMatcher`): the regex is compiled to a lazy derivative-based
lexer, and a state's allowed tokens are found when decoding first reaches it, by walking the
vocabulary's token trie through that lexer (Rust, the GIL released). Nothing is computed for
states decoding never reaches, so a new schema gives its first mask in milliseconds instead
of the seconds an eager index over every state took (docs/benchmarks.md).

An index is immutable and shared; each Guide owns an `LLMatcher` (its position). What is
derived from a position -- the bitmask row, the forced bytes for jump-forward -- is cached on
the index by *path*: the token sequence from the constraint's start determines the matcher's
state exactly, so guides that went through the same tokens (forks, the items of a batch, the
first mask of every request with this constraint) share one computation. Paths are the
nodes of a bounded trie (`path_node`); past `MAX_PATH_NODES`, positions are not cached.

Masks are exact for every token: a token is allowed iff its bytes keep the text a prefix of a
match; EOS iff the text is a complete match. One refinement from llguidance: where the
constraint forces bytes, the mask allows the tokenizer's own tokenization of them (what
jump-forward would emit) instead of every spelling.

Bounds: llguidance's lexer limits (`LLParserLimits`: lexer fuel per step and at build, at most
`MAX_LEXER_STATES` lexer states) cap the time and memory of one constraint; past them the
constraint is refused (at build) or its request fails with ConstraintError (mid-decode),
never the process.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import weakref
from collections.abc import Hashable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from lmprog.core.errors import ConstraintError
from lmprog.fsm import index_cache
from lmprog.fsm.vocab import TokenVocab

if TYPE_CHECKING:
    from lmprog.fsm.guide import Guide

STATE_CACHE_SIZE = 4096  # per index and per cache name; beyond this the oldest entries go
MAX_PATH_NODES = 200_000  # cached positions per index (a dict entry each, ~100 bytes)
MAX_LEXER_STATES = 50_000  # llguidance lexer states per constraint (~1-2 kB each)
log = logging.getLogger(__name__)
ROOT = 0  # the path node of a guide's start


class TokenIndex:
    """One pattern compiled for one vocabulary. Immutable; share it between threads."""

    def __init__(self, pattern: str, vocab: TokenVocab, matcher: Any, check: Any = None) -> None:
        """matcher: an `llguidance.LLMatcher` of the pattern at its start, which every guide
        copies (a copy shares the compiled lexer); check: what guides check beside it
        (`lmprog.fsm.checks`, the constraint's `check`). Use `TokenIndex.get`, which checks it."""
        self.pattern = pattern
        self.vocab = vocab
        self.check = check
        self._start = matcher
        self._caches: dict[Hashable, _BoundedCache] = {}
        self._paths: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def get(cls, constraint: Any, tokenizer: Any) -> TokenIndex:
        """The index of a Constraint (or regex string) for a tokenizer; builds it if needed.

        Raises ConstraintError if the pattern cannot be compiled or no token of this
        vocabulary can start a match.
        """
        return _lookup(constraint, tokenizer, inline=True).result()

    @classmethod
    def prefetch(cls, constraint: Any, tokenizer: Any) -> Future[TokenIndex]:
        """Start building off the calling thread; returns a Future (already done if cached).
        `future.result()` returns the index or raises the ConstraintError."""
        return _lookup(constraint, tokenizer, inline=False)

    @classmethod
    def cached(cls, constraint: Any, tokenizer: Any) -> TokenIndex | None:
        """The index if it is already in memory, else None (never builds, never blocks)."""
        return _CACHE.peek(_key(_pattern_of(constraint), TokenVocab.from_tokenizer(tokenizer)))

    def forget(self) -> None:
        """Drop this index from the memory cache, so that the next request for its pattern
        builds a fresh one: its guides share one llguidance lexer, and once that lexer has hit
        one of its limits every guide of the index fails (the requests holding them fail;
        later ones get a new lexer)."""
        if _CACHE.evict(_key(self.pattern, self.vocab), self):
            log.info("constraint index dropped after a matcher error: %s", _short(self.pattern))

    def new_guide(self) -> Guide:
        from lmprog.fsm.guide import Guide

        return Guide(self)

    def new_matcher(self) -> Any:
        """A fresh `llguidance.LLMatcher` at the start of the pattern (a copy: microseconds)."""
        return self._start.deep_copy()

    # ---- shared per-position data -----------------------------------------------------------
    @property
    def eos_token_id(self) -> int:
        return self.vocab.eos_token_id

    @property
    def vocab_size(self) -> int:
        return self.vocab.size

    @property
    def num_words(self) -> int:
        """int32 words of a bitmask row over the vocabulary (the matchers' own size: their
        `LLTokenizer` has exactly `vocab_size` ids)."""
        return (self.vocab.size + 31) // 32

    def path_node(self, node: int, token_id: int) -> int:
        """The path node after `token_id` from `node` (-1: not cached, past MAX_PATH_NODES)."""
        if node < 0:
            return -1
        key = (node, token_id)
        child = self._paths.get(key)
        if child is None:
            with self._lock:
                child = self._paths.get(key)
                if child is None:
                    if len(self._paths) >= MAX_PATH_NODES:
                        return -1
                    child = self._paths[key] = len(self._paths) + 1
        return child

    def state_cache(self, name: Hashable, capacity: int = STATE_CACHE_SIZE) -> _BoundedCache:
        """A per-index cache of data derived from a position, by name (guide/jump/mask)."""
        cache = self._caches.get(name)
        if cache is None:
            with self._lock:
                cache = self._caches.setdefault(name, _BoundedCache(capacity))
        return cache

    def __repr__(self) -> str:
        shown = self.pattern if len(self.pattern) <= 60 else self.pattern[:57] + "..."
        return f"TokenIndex({shown!r}, vocab={self.vocab.size})"


class _BoundedCache:
    """A dict with a size cap (first-in first-out eviction); lock-free reads."""

    def __init__(self, capacity: int) -> None:
        self._data: dict[Any, Any] = {}
        self._capacity = capacity
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        return self._data.get(key)

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            if len(self._data) >= self._capacity:
                del self._data[next(iter(self._data))]
            self._data[key] = value

    def __len__(self) -> int:
        return len(self._data)


def _pattern_of(constraint: Any) -> str:
    """The text the index compiles: a regex, or "lark:" + a Lark grammar (an ebnf Constraint)."""
    lark = getattr(constraint, "lark", None)
    if isinstance(lark, str):
        return "lark:" + lark
    pattern = constraint if isinstance(constraint, str) else getattr(constraint, "pattern", None)
    if not isinstance(pattern, str):
        raise TypeError(f"expected a Constraint or a regex string, got {type(constraint).__name__}")
    return pattern


_CACHE = index_cache.IndexCache()


def clear_memory_cache() -> None:
    """Forget the compiled indexes (tests and benchmarks)."""
    _CACHE.clear()


def _lookup(constraint: Any, tokenizer: Any, inline: bool) -> Future[TokenIndex]:
    pattern, vocab = _pattern_of(constraint), TokenVocab.from_tokenizer(tokenizer)
    ll_tokenizer = ll_tokenizer_for(vocab, tokenizer)
    key = _key(pattern, vocab)

    check = getattr(constraint, "check", None)  # named in the pattern: part of the key

    def build() -> tuple[TokenIndex, int]:
        index = TokenIndex(pattern, vocab, _matcher(pattern, ll_tokenizer), check)
        _check_start(index)
        return index, 2 * len(pattern)

    return _CACHE.lookup(key, build, inline)


def _key(pattern: str, vocab: TokenVocab) -> str:
    h = hashlib.sha256(pattern.encode("utf-8", "surrogatepass"))
    h.update(f"|{vocab.fingerprint}".encode())
    return h.hexdigest()[:32]


def _limits() -> Any:
    import llguidance

    return llguidance.LLParserLimits(max_lexer_states=MAX_LEXER_STATES)


def _matcher(pattern: str, ll_tokenizer: Any) -> Any:
    """The pattern's llguidance matcher at its start; ConstraintError if llguidance refuses it
    (a syntax it does not read, a lexer past the limits). The GIL is released meanwhile."""
    import llguidance

    if pattern.startswith("lark:"):
        grammar = llguidance.LLMatcher.grammar_from_lark(pattern[5:])
    else:
        grammar = llguidance.LLMatcher.grammar_from_regex(pattern)
    matcher = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0, limits=_limits())
    if matcher.is_error():
        raise ConstraintError(f"cannot compile {_short(pattern)}: {_reason(matcher.get_error())}")
    return matcher


def _check_start(index: TokenIndex) -> None:
    """Compute the start's mask (cached for every guide); refuse a pattern no token starts."""
    try:
        words = index.new_guide().bitmask_words()
    except ConstraintError as exc:
        if "NoExtension" not in str(exc):
            raise ConstraintError(f"cannot compile {_short(index.pattern)}: {exc}") from None
        words = None
    if words is None or not words.any():
        raise ConstraintError(
            f"no sequence of this tokenizer's tokens can spell a match of {_short(index.pattern)}"
        )


def _reason(error: str) -> str:
    """llguidance's message without its position prefix and the grammar dump."""
    text = error.split("<state>")[0].strip()
    if "too many states" in text:
        return (
            f"the constraint is too complex: its lexer needs more than {MAX_LEXER_STATES:,} "
            f"states (lmprog.fsm.index.MAX_LEXER_STATES; llguidance: {text})"
        )
    if text.startswith("at ") and ": " in text:
        text = text.split(": ", 1)[1]
    return " ".join(text.split())[:400]


def _short(pattern: str) -> str:
    what = "the grammar" if pattern.startswith("lark:") else "the regex"
    pattern = pattern.removeprefix("lark:")
    return f"{what} {pattern if len(pattern) <= 80 else pattern[:77] + '...'!r}"


# ---- the vocabulary as llguidance sees it ---------------------------------------------------


class _Tokens:
    """The tokenizer interface `llguidance.LLTokenizer` reads: every id's bytes (special ids
    as b"\\xff<[id]>", llguidance's spelling of a token with no text), the EOS id, and an
    encoder (bytes or str -> ids) it uses for forced text."""

    is_tokenizer_wrapper = True

    def __init__(self, vocab: TokenVocab, tokenizer: Any) -> None:
        self.eos_token_id = vocab.eos_token_id
        self.bos_token_id = None
        self.tokens = [
            b if b is not None else b"\xff<[%d]>" % i for i, b in enumerate(vocab.token_bytes)
        ]
        self.special_token_ids = [i for i, b in enumerate(vocab.token_bytes) if b is None]
        encode = getattr(tokenizer, "encode", None)
        self._encode = None if isinstance(tokenizer, TokenVocab) or encode is None else encode
        self._vocab = vocab

    def __call__(self, text: str | bytes) -> list[int]:
        # Never raises: llguidance calls this from Rust, where an exception is a panic.
        if self._encode is not None:
            if isinstance(text, bytes):
                text = text.decode("utf-8", "replace")
            try:
                return list(self._encode(text, add_special_tokens=False))
            except Exception:  # noqa: BLE001 - an encoder that cannot spell it: nothing forced
                return []
        return self._vocab.greedy_encode(
            text.encode() if isinstance(text, str) else text, partial=True
        )


_LL_TOKENIZERS: weakref.WeakKeyDictionary[TokenVocab, Any] = weakref.WeakKeyDictionary()
_LL_LOCK = threading.Lock()


def ll_tokenizer_for(vocab: TokenVocab, tokenizer: Any = None) -> Any:
    """The `llguidance.LLTokenizer` of a vocabulary (built once per vocabulary, ~0.2 s for 49k
    tokens). `tokenizer`: the Hugging Face tokenizer the vocabulary came from, whose encoder
    spells forced text; a bare TokenVocab gets a greedy longest-match encoder."""
    found = _LL_TOKENIZERS.get(vocab)
    if found is not None:
        return found
    try:
        import llguidance
    except ImportError as exc:
        raise ConstraintError(f"constrained decoding needs llguidance ({exc})") from None
    built = llguidance.LLTokenizer(_Tokens(vocab, tokenizer), n_vocab=vocab.size)
    with _LL_LOCK:
        return _LL_TOKENIZERS.setdefault(vocab, built)


BYTES = TokenVocab((*(bytes([b]) for b in range(256)), None), eos_token_id=256)  # id = byte


def check_grammar(constraint: Any) -> None:
    """Compile a constraint's grammar once, without a model's vocabulary, so that an error in
    it (llguidance's Lark checks) is raised where the constraint is built."""
    TokenIndex.get(constraint, BYTES)


def matches_bytes(constraint: Any, data: bytes) -> bool:
    """Whether `data` is a whole match of the constraint, through the token engine over a
    one-byte-per-token vocabulary (linear in len(data), bounded by the lexer limits)."""
    index = TokenIndex.get(constraint, BYTES)
    matcher = index.new_matcher()
    tokens = list(data)
    if not (matcher.try_consume_tokens(tokens) == len(tokens) and matcher.is_accepting()):
        return False
    return index.check is None or index.check.step(index.check.start(), data) is not None
