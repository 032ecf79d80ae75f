"""The token-level automaton of a constraint over a model's vocabulary, built lazily.

    TokenIndex.get(constraint_or_pattern, tokenizer)      -> TokenIndex   (milliseconds)
    TokenIndex.prefetch(constraint_or_pattern, tokenizer) -> Future[TokenIndex] (never blocks)
    index.new_guide()                                     -> Guide (per-sequence cursor)

llguidance finds a position's allowed tokens when decoding first reaches it; bitmask rows and
forced bytes are cached on the shared index by path (`path_node`). Past llguidance's lexer
limits a constraint is refused (at build) or its request fails with ConstraintError, and a
spent lexer is renewed (`lexer_failed`). Design: docs/design/constraints.md.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import threading
import weakref
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from lmprog.core.errors import ConstraintError
from lmprog.fsm import index_cache
from lmprog.fsm.grammar_depth import check_compile_stack, on_deep_stack
from lmprog.fsm.guide import Guide, refused_by_spent_lexer
from lmprog.fsm.vocab import TokenVocab

if TYPE_CHECKING:
    from llguidance import LLMatcher, LLParserLimits, LLTokenizer

    from lmprog.fsm.checks import JsonChecks

STATE_CACHE_SIZE = 4096  # per index and per cache name; beyond this the oldest entries go
MAX_PATH_NODES = 200_000  # cached positions per index (a dict entry each, ~100 bytes)
MAX_LEXER_STATES = 50_000  # llguidance lexer states per constraint (~1-2 kB each)
STEP_LEXER_FUEL = 200_000  # llguidance's lexer fuel for one mask step (its default)
# Earley items in one parser row (llguidance's default is 2,000): a position where n keys of an
# object may come next holds about 2n (an object of 1,000 optional properties had 2,002); the
# work of one step stays bounded by llguidance's step_max_items (50,000)
MAX_ITEMS_IN_ROW = 10_000
BUILD_LEXER_FUEL = 1_000_000  # ... and for building a matcher (its default)
log = logging.getLogger(__name__)


class ConstraintLike(Protocol):
    """What an index reads of a ``lmprog.fsm.constraint.Constraint``: its regex or grammar, and
    what guides check beside it."""

    @property
    def pattern(self) -> str: ...
    @property
    def lark(self) -> str | None: ...
    @property
    def check(self) -> JsonChecks | None: ...


class TokenIndex:
    """One pattern compiled for one vocabulary; share it between threads. What it matches never
    changes; its start's lexer is replaced after a matcher error (`lexer_failed`)."""

    def __init__(
        self,
        pattern: str,
        vocab: TokenVocab,
        ll_tokenizer: LLTokenizer,
        check: JsonChecks | None = None,
    ) -> None:
        """ll_tokenizer: the vocabulary's `llguidance.LLTokenizer` (`ll_tokenizer_for`); check:
        what guides check beside the pattern (`lmprog.fsm.checks`, the constraint's `check`).
        ConstraintError if llguidance refuses the pattern. Use `TokenIndex.get`, which also
        checks that a token can start a match."""
        self.pattern = pattern
        self.vocab = vocab
        self.check = check
        # (plain attributes, read at every mask step)
        self.vocab_size = vocab.size
        # int32 words of a bitmask row over the vocabulary (the matchers' own size: their
        # `LLTokenizer` has exactly `vocab_size` ids)
        self.num_words = (vocab.size + 31) // 32
        self._ll_tokenizer = ll_tokenizer
        # before llguidance: a deep grammar overflows its stack (or compiles on a deep one)
        self._deep = pattern.startswith("lark:") and check_compile_stack(pattern[5:])
        if pattern.startswith("lark:"):
            _check_no_eos(pattern[5:], vocab)
        # the matcher at the start, which every guide copies (a copy shares its lexer), and
        # that lexer's generation (lexer_failed replaces both)
        self._start = _matcher(pattern, ll_tokenizer, deep=self._deep)
        self._lexer = 0
        self._caches: dict[Hashable, _BoundedCache] = {}
        self._paths: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def get(cls, constraint: ConstraintLike | str, tokenizer: Any) -> TokenIndex:
        """The index of a Constraint (or regex string) for a tokenizer; builds it if needed.

        Raises ConstraintError if the pattern cannot be compiled or no token of this
        vocabulary can start a match.
        """
        return _lookup(constraint, tokenizer, inline=True).result()

    @classmethod
    def prefetch(cls, constraint: ConstraintLike | str, tokenizer: Any) -> Future[TokenIndex]:
        """Start building off the calling thread; returns a Future (already done if cached).
        `future.result()` returns the index or raises the ConstraintError."""
        return _lookup(constraint, tokenizer, inline=False)

    @classmethod
    def cached(cls, constraint: ConstraintLike | str, tokenizer: Any) -> TokenIndex | None:
        """The index if it is already in memory, else None (never builds, never blocks)."""
        return _CACHE.peek(_key(_pattern_of(constraint), TokenVocab.from_tokenizer(tokenizer)))

    def new_guide(self) -> Guide:
        return Guide(self)

    @staticmethod
    def reason(error: str) -> str:
        """llguidance's `error` as the reason a ConstraintError gives (the limit it names)."""
        return _reason(error)

    def new_matcher(self) -> tuple[LLMatcher, int]:
        """A fresh `llguidance.LLMatcher` at the start of the pattern (a copy: microseconds)
        and the generation of the lexer it shares (for `lexer_failed`)."""
        with self._lock:
            return self._start.deep_copy(), self._lexer

    def lexer_failed(self, lexer: int) -> None:
        """A matcher of generation `lexer` hit an error (a lexer or parser limit). Its lexer,
        shared with every copy of that generation, may be spent for good, so the start gets a
        new one (once per generation: a later report about an old one changes nothing) and
        `lexer_renewals()` counts it. Matchers of the old generation stay as they are: a guide
        holding one recovers when it meets the error (on an `own_matcher`)."""
        with self._lock:
            if lexer != self._lexer:
                return
            self._start = _matcher(self.pattern, self._ll_tokenizer, deep=self._deep)
            self._lexer += 1
        _RENEWALS.append(None)
        log.info("constraint lexer renewed after a matcher error: %s", _short(self.pattern))

    def own_matcher(self, steps: int) -> LLMatcher:
        """A matcher at the start on a lexer of its own, shared with nobody (a limit it meets
        harms no one else), with the lexer fuel of `steps` mask steps for what it consumes
        before its first mask: a cursor's tokens read again, or a text `matches_bytes` reads."""
        return _matcher(
            self.pattern,
            self._ll_tokenizer,
            BUILD_LEXER_FUEL + STEP_LEXER_FUEL * steps,
            deep=self._deep,
        )

    # ---- shared per-position data -----------------------------------------------------------
    @property
    def eos_token_id(self) -> int:
        return self.vocab.eos_token_id

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
    """A dict with a size cap (first-in first-out eviction); lock-free reads, and stores
    while it is well under the cap (evicting takes the lock)."""

    def __init__(self, capacity: int) -> None:
        self._data: dict[Any, Any] = {}
        self._capacity = capacity
        self._lock = threading.Lock()
        # get(key) -> the value or None: the dict's own method (no Python frame per read)
        self.get: Callable[[Any], Any] = self._data.get

    def put(self, key: Any, value: Any) -> None:
        data = self._data
        if len(data) < self._capacity - 64:  # room: a dict's store needs no lock (the
            data[key] = value  # margin: other threads' stores meanwhile stay under the cap)
            return
        with self._lock:
            if len(self._data) >= self._capacity:
                del self._data[next(iter(self._data))]
            self._data[key] = value

    def __len__(self) -> int:
        return len(self._data)


def _pattern_of(constraint: object) -> str:
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


def _lookup(constraint: ConstraintLike | str, tokenizer: Any, inline: bool) -> Future[TokenIndex]:
    pattern, vocab = _pattern_of(constraint), TokenVocab.from_tokenizer(tokenizer)
    ll_tokenizer = ll_tokenizer_for(vocab, tokenizer)
    key = _key(pattern, vocab)

    check: JsonChecks | None = getattr(
        constraint, "check", None
    )  # named in the pattern: part of the key

    if getattr(constraint, "accepts_nothing", False):
        raise ConstraintError(
            "the JSON schema accepts no value, so nothing can be generated from it (it was "
            "read with strict=False, where it matches no text)"
        )

    def build() -> tuple[TokenIndex, int]:
        index = TokenIndex(pattern, vocab, ll_tokenizer, check)
        _check_start(index)
        return index, 2 * len(pattern)

    return _CACHE.lookup(key, build, inline)


def _key(pattern: str, vocab: TokenVocab) -> str:
    h = hashlib.sha256(pattern.encode("utf-8", "surrogatepass"))
    h.update(f"|{vocab.fingerprint}".encode())
    return h.hexdigest()[:32]


_RENEWALS: list[None] = []  # one entry per lexer renewal (list.append is atomic)


def lexer_renewals() -> int:
    """How many times, in this process, an index's lexer was rebuilt after a matcher error
    (`TokenIndex.lexer_failed`): a request past the limits, or a lexer worn out by many."""
    return len(_RENEWALS)


def _limits(fuel: int = BUILD_LEXER_FUEL) -> LLParserLimits:
    import llguidance

    return llguidance.LLParserLimits(
        max_lexer_states=MAX_LEXER_STATES,
        initial_lexer_fuel=fuel,
        step_lexer_fuel=STEP_LEXER_FUEL,
        max_items_in_row=MAX_ITEMS_IN_ROW,
    )


def _matcher(
    pattern: str, ll_tokenizer: LLTokenizer, fuel: int = BUILD_LEXER_FUEL, deep: bool = False
) -> LLMatcher:
    """The pattern's llguidance matcher at its start (on a new lexer, with `fuel` for building
    it and for what it consumes before its first mask); ConstraintError if llguidance refuses
    it (a syntax it does not read, a lexer past the limits). The GIL is released meanwhile.
    deep: compiled on the deep-compile thread (`grammar_depth.check_compile_stack`)."""
    if deep:
        return on_deep_stack(_matcher, pattern, ll_tokenizer, fuel)
    import llguidance

    if pattern.startswith("lark:"):
        grammar = llguidance.LLMatcher.grammar_from_lark(pattern[5:])
    else:
        grammar = llguidance.LLMatcher.grammar_from_regex(pattern)
    matcher = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0, limits=_limits(fuel))
    if matcher.is_error():
        error = matcher.get_error()
        unknown = _UNKNOWN_SPECIAL.search(error)
        if unknown is not None:
            raise UnknownSpecialToken(unknown.group(1), _short(pattern))
        raise ConstraintError(f"cannot compile {_short(pattern)}: {_reason(error)}")
    return matcher


_UNKNOWN_SPECIAL = re.compile(r'unknown special token: "([^"]*)"')


class UnknownSpecialToken(ConstraintError):
    """A grammar names a special token (`<|call|>`) the tokenizer does not have."""

    def __init__(self, name: str, pattern: str) -> None:
        super().__init__(
            f"cannot compile {pattern}: it names the special token {name}, which this "
            "tokenizer does not have (a grammar's <|name|> is one special token of the "
            'model\'s tokenizer; write "<|name|>" in quotes for its text)'
        )
        self.name = name


# what a Lark grammar holds beside its rules' names: strings, regexes, comments
_LARK_LITERALS = re.compile(r'"(?:[^"\\\n]|\\.)*"i?|/(?:[^/\\\n]|\\.)+/[imsx]*|//[^\n]*')


def _check_no_eos(lark: str, vocab: TokenVocab) -> None:
    """ConstraintError if the grammar names the tokenizer's EOS as a special token (SmolLM2's
    `<|im_end|>`): EOS ends a constrained output where the grammar is complete, so a grammar
    cannot also take it as a token of its text."""
    eos = vocab.eos_token_id
    names = [f"<[{eos}]>", *(n for i, n in vocab.special_names if i == eos)]
    if not any(n in lark for n in names):
        return
    rules = _LARK_LITERALS.sub(" ", lark)
    for name in names:
        if name in rules:
            raise ConstraintError(
                f"the grammar names {name}, this tokenizer's EOS token: a constrained output "
                "ends with EOS where the grammar is complete, so leave it out of the grammar"
            )


def _check_start(index: TokenIndex) -> None:
    """Compute the start's mask (cached for every guide); refuse a pattern no token starts,
    or one past llguidance's limits within its first tokens (`_probe`)."""
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
    _probe(index, words)


def _probe(index: TokenIndex, words: Any) -> None:
    """Consume the lowest allowed token from the start, on a matcher of its own: a parser
    limit the first token reaches (a row of 12,500 alternatives is only counted once a token
    is consumed) is the constraint's error here, where it is built, rather than the first
    request's, mid-decode. (A lexer limit is not: a consume without the mask before it takes
    more of the lexer than decoding does, and the renewal handles those.)"""
    import numpy as np

    bits = np.unpackbits(np.asarray(words).view(np.uint8), bitorder="little")
    allowed = np.flatnonzero(bits[: index.vocab.size])
    allowed = allowed[allowed != index.eos_token_id]
    if not len(allowed):
        return
    matcher = index.own_matcher(1)
    matcher.consume_token(int(allowed[0]))
    if matcher.is_error() and "Parser Error" in matcher.get_error():
        raise ConstraintError(
            f"cannot compile {_short(index.pattern)}: {_reason(matcher.get_error())}"
        )


def _reason(error: str) -> str:
    """llguidance's message without its position prefix and the grammar dump."""
    text = error.split("<state>")[0].strip()
    if "Current row has" in text:
        return (
            "the constraint allows too many alternatives at one position: "
            f"{text.split('Current row has ')[1].split(';')[0]} in a parser row, over "
            f"{MAX_ITEMS_IN_ROW:,} (lmprog.fsm.index.MAX_ITEMS_IN_ROW)"
        )
    if "too many expressions constructed" in text:
        return (
            "the constraint's regex grows too large to run (a repetition count, or repetitions "
            f"nested, too large; llguidance: {text.split(':', 1)[-1].strip()})"
        )
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
    """The tokenizer interface `llguidance.LLTokenizer` reads: every id's bytes (a special id
    as b"\\xff" + its name, llguidance's spelling of a token with no text, which a grammar
    names it by: `<|call|>`; b"\\xff<[id]>" where it has no name), the EOS id, and an encoder
    (bytes or str -> ids) it uses for forced text."""

    is_tokenizer_wrapper = True

    def __init__(self, vocab: TokenVocab, tokenizer: Any) -> None:
        self.eos_token_id = vocab.eos_token_id
        self.bos_token_id = None
        names = dict(vocab.special_names)
        self.tokens = [
            b if b is not None else special_spelling(i, names.get(i))
            for i, b in enumerate(vocab.token_bytes)
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


def special_spelling(token_id: int, name: str | None) -> bytes:
    """A special token's bytes as llguidance holds them: b"\\xff" + its name, or
    b"\\xff<[id]>" without one."""
    return b"\xff" + (name.encode() if name else b"<[%d]>" % token_id)


_LL_TOKENIZERS: weakref.WeakKeyDictionary[TokenVocab, LLTokenizer] = weakref.WeakKeyDictionary()
_LL_BUILDS: weakref.WeakKeyDictionary[TokenVocab, threading.Lock] = weakref.WeakKeyDictionary()
_LL_LOCK = threading.Lock()


def ll_tokenizer_for(vocab: TokenVocab, tokenizer: Any = None) -> LLTokenizer:
    """The `llguidance.LLTokenizer` of a vocabulary (built once per vocabulary: ~0.2 s for
    49k tokens through `_Tokens`, ~0.7 s as llguidance's own (`_native_tokenizer`), the GIL
    released; a caller arriving during the build waits for it, so a build a backend started
    when it was made (`fsm.warmup`) serves the first constraint). `tokenizer`: the Hugging
    Face tokenizer the vocabulary came from, whose encoder spells forced text (in Rust where
    llguidance reads its JSON); a bare TokenVocab gets a greedy longest-match encoder."""
    found = _LL_TOKENIZERS.get(vocab)
    if found is not None:
        return found
    with _LL_LOCK:
        build = _LL_BUILDS.setdefault(vocab, threading.Lock())
    with build:
        found = _LL_TOKENIZERS.get(vocab)
        if found is None:
            try:
                import llguidance
            except ImportError as exc:
                raise ConstraintError(f"constrained decoding needs llguidance ({exc})") from None
            found = _native_tokenizer(vocab, tokenizer)
            if found is None:
                # _Tokens has every attribute llguidance reads of a TokenizerWrapper (duck-typed)
                tokens = _Tokens(vocab, tokenizer)
                found = llguidance.LLTokenizer(tokens, n_vocab=vocab.size)  # type: ignore[arg-type]
            with _LL_LOCK:
                _LL_TOKENIZERS[vocab] = found
    return found


def _native_tokenizer(vocab: TokenVocab, tokenizer: Any) -> LLTokenizer | None:
    """llguidance's own tokenizer, built from a Hugging Face fast tokenizer's JSON, where
    `tokenizer` is one and spells every id as `vocab` does (else None: the `_Tokens` path).
    llguidance tokenizes the text a constraint forces while it computes a mask (a third of
    first-visit masks on JSON schemas); through `_Tokens` each is a call back into Python,
    ~30 us, here it stays in Rust. Builds in ~0.5 s more than `_Tokens` (once per vocabulary,
    off the first request where `fsm.warmup` runs)."""
    backend: Any = getattr(tokenizer, "_tokenizer", None)  # lmprog's FastTokenizer, transformers'
    if not callable(getattr(backend, "to_str", None)) or getattr(
        tokenizer, "split_special_tokens", False
    ):
        return None  # (split special tokens: `_Tokens` encodes as the tokenizer is set)
    special = {i for i, data in enumerate(vocab.token_bytes) if data is None}
    try:  # (before the build: the special ids are the tokenizer's added special tokens)
        added = backend.get_added_tokens_decoder()
        if {i for i, t in added.items() if t.special and i < vocab.size} != special:
            return None
    except Exception:  # noqa: BLE001 - not a `tokenizers.Tokenizer` after all
        return None
    import llguidance

    try:
        if backend.padding is not None or backend.truncation is not None:
            from tokenizers import Tokenizer

            backend = Tokenizer.from_str(backend.to_str())
            backend.no_padding()
            backend.no_truncation()
        found = llguidance.LLTokenizer(
            backend.to_str(), n_vocab=vocab.size, eos_token=vocab.eos_token_id
        )
    except Exception:  # noqa: BLE001 - a tokenizer llguidance cannot read: the Python path
        return None
    for i, data in enumerate(vocab.token_bytes):
        if found.is_special_token(i) != (data is None) or (
            data is not None and found.decode_bytes([i]) != data
        ):
            log.debug("llguidance spells token %d otherwise: its tokenizer not used", i)
            return None
    return found


BYTES = TokenVocab((*(bytes([b]) for b in range(256)), None), eos_token_id=256)  # id = byte


MAX_NAMED_SPECIAL_TOKENS = 64  # special tokens one grammar may name (`check_grammar`)


def check_grammar(constraint: ConstraintLike) -> None:
    """Compile a constraint's grammar once, without a model's vocabulary, so that an error in
    it (llguidance's Lark checks) is raised where the constraint is built. The special tokens
    it names (`<|call|>`) are given to the one-byte vocabulary as it names them: whether a
    model's tokenizer has them is checked where the constraint is compiled for it."""
    _bytes_index(constraint)


def _bytes_index(constraint: ConstraintLike) -> TokenIndex:
    """The constraint's index over BYTES, with the special tokens its grammar names after
    EOS (ids 257, ...), and unnamed ids up to the highest it names by id (`<[id]>`)."""
    names: tuple[str, ...] = ()
    size = BYTES.size
    while True:
        try:
            return TokenIndex.get(constraint, _bytes_with_special(names, size))
        except UnknownSpecialToken as exc:
            if exc.name in names or len(names) >= MAX_NAMED_SPECIAL_TOKENS:
                raise
            names = (*names, exc.name)
        except ConstraintError as exc:
            by_id = _ID_TOO_LARGE.search(str(exc))
            if by_id is None or not size <= int(by_id.group(1)) < MAX_TOKEN_ID:
                raise
            size = int(by_id.group(1)) + 1


MAX_TOKEN_ID = 1 << 20  # ids a grammar may name (`<[id]>`) where it is checked without a model
_ID_TOO_LARGE = re.compile(r"Token range end too large: (\d+)")


@functools.lru_cache(maxsize=64)
def _bytes_with_special(names: tuple[str, ...], size: int) -> TokenVocab:
    """BYTES, then the special tokens `names` after its EOS (ids 257, 258, ...), then unnamed
    ids up to `size`."""
    if not names and size <= BYTES.size:
        return BYTES
    extra = max(len(names), size - BYTES.size)
    return TokenVocab(
        (*BYTES.token_bytes, *(None for _ in range(extra))),
        BYTES.eos_token_id,
        tuple((257 + j, name) for j, name in enumerate(names)),
    )


def matches_bytes(constraint: ConstraintLike, data: bytes) -> bool:
    """Whether `data` is a whole match of the constraint, through the token engine over a
    one-byte-per-token vocabulary, where a special token the grammar names is read from its
    name's text where the grammar takes that token there (`_read`), else as the text (a
    JSON string holding `<|end|>`) (linear in len(data), bounded by the lexer limits; past
    them, ConstraintError). These matchers compute no masks, so they spend the lexer fuel
    left by the last one: where that runs out the lexer is renewed (`lexer_failed`) and the
    text read again on a matcher of its own."""
    index = _bytes_index(constraint)
    matcher, lexer = index.new_matcher()
    special = index.vocab.special_ids
    read, error = _read(matcher, data, special)
    if error is not None:
        index.lexer_failed(lexer)
        matcher = index.own_matcher(len(data))
        read, error = _read(matcher, data, special)
        if error is not None:
            raise ConstraintError(f"cannot tell whether the text matches: {_reason(error)}")
    if not (read and matcher.is_accepting()):
        return False
    return index.check is None or index.check.step(index.check.start(), data) is not None


def _read(matcher: LLMatcher, data: bytes, special: dict[str, int]) -> tuple[bool, str | None]:
    """Consume `data` as BYTES ids, a special token's name (the text a detokenizer writes
    for it: `<|call|>`) as that token where the matcher takes it there, else as its bytes
    (the same text inside a JSON string the grammar reads): (whether all of it was read,
    the error that stopped it other than the text's own mismatch)."""
    names = sorted(((n.encode(), i) for n, i in special.items()), key=lambda p: -len(p[0]))
    if not names:
        return _consume(matcher, list(data))
    start = pos = 0
    while pos < len(data):
        found = next(((n, t) for n, t in names if data.startswith(n, pos)), None)
        if found is None:
            pos += 1
            continue
        read, error = _consume(matcher, list(data[start:pos]))
        if not read:
            return read, error
        name, token = found
        if matcher.try_consume_tokens([token]) == 1:
            start = pos = pos + len(name)
            continue
        error = _failed(matcher, [token], 0)
        if error is not None:
            return False, error
        start, pos = pos, pos + len(name)  # its bytes: read with the text after it
    return _consume(matcher, list(data[start:]))


def _consume(matcher: LLMatcher, tokens: list[int]) -> tuple[bool, str | None]:
    consumed = matcher.try_consume_tokens(tokens) if tokens else 0
    return consumed == len(tokens), _failed(matcher, tokens, consumed)


def _failed(matcher: LLMatcher, tokens: list[int], consumed: int) -> str | None:
    """The error that stopped `try_consume_tokens(tokens)` at `consumed`, if it was not the
    text's own mismatch."""
    if matcher.is_error():
        return matcher.get_error()
    return None if consumed == len(tokens) else refused_by_spent_lexer(matcher, tokens[consumed])
