"""The masks of a guide whose constraint has decode-time checks: the grammar's mask less the
tokens the check refuses.

Only the tokens that can complete something or, inside a string whose maxLength is counted
apart, that can bring it near that bound are tried (per-vocabulary tables of which those are).
Design: docs/design/constraints.md.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Hashable

import numpy as np

from lmprog.fsm.checks import _UNIQUE, _WS, Arr, JsonChecks, Mode, State
from lmprog.fsm.json_schema.terms.lengths import LengthCount
from lmprog.fsm.json_schema.terms.matched import PatternMatch
from lmprog.fsm.vocab import TokenVocab

_AFTER_STRING = frozenset(_WS | frozenset(b":,"))


def filter_words(
    check: JsonChecks, state: State, words: np.ndarray, vocab: TokenVocab
) -> np.ndarray:
    """`words` (an int32 bitmask over `vocab`) without the tokens the check refuses from
    `state`: those that would complete a repeated item or a key read before, close an array
    that must repeat an item and has not, or start a value that can only repeat one. Tried:
    inside a string or key, the tokens with a quote (nothing else can end it; those that end it
    and hold nothing after but whitespace, ":" or "," by the string's own test) and those that
    would fill it to its maxLength as a seen string, or every allowed token if the item is one
    of a finite set of strings (any character may leave only repeats); elsewhere the allowed
    tokens that hold punctuation, whitespace, two quotes or a literal's last letter, or start
    a literal, a zero, or (before such a string) a string. Inside a string whose maxLength is
    counted (``json_schema.terms.lengths``), first the tokens that would leave it unable to end
    within it (`_within_length`); inside one whose patterns with backreferences are matched
    (``json_schema.terms.matched``), those after which it cannot match them (`_matching`)."""
    if state.counted is not None:
        count = state.counted[0]
        if isinstance(count, PatternMatch):
            words = _matching(check, state, count, words, vocab)
        else:
            words = _within_length(check, state, count, words, vocab)
        if not check.checks_items(state):
            return words
    table = _tables(vocab)
    refused: list[int] = []  # refused untried
    finite = state.mode in (Mode.STRING, Mode.VALUE) and check.strings(state.stack) is not None
    due = check.repeat_due(state)  # an item that must repeat one: any token may be refused
    if check.in_string(state) and not finite and not due:
        extra = [vocab.token_id(t) for t in _full_lengths(check, state)]
        extra = [i for i in extra if i is not None]
        candidates = np.concatenate((table.quotes, np.array(extra, dtype=np.int64)))
        closes = _closing(state)
        if state.mode is Mode.KEY and check.in_counted_object(state):
            closes = check.counted_key(state)  # (its check reads the members too)
    else:
        closes = None
        allowed = np.unpackbits(words.view(np.uint8), bitorder="little")[: len(table.ends)]
        allowed = allowed.astype(bool)
        if due or state.mode is Mode.SCALAR and check.in_counted_value(state):
            pass  # an item that must repeat one, a number in a counted object: all tried
        elif check.in_counted_value(state):  # a member's value starts: by its first byte
            allowed, refused = _by_lead(check, state, allowed, table, vocab)
        elif not check.in_string(state):
            allowed &= table.ends | table.opens if finite else table.ends
        candidates = np.flatnonzero(allowed)
    out = None
    for token in refused:
        if out is None:
            out = np.array(words, dtype=np.int32)
        out[token >> 5] &= np.int32(~np.uint32(1 << (token & 31)).view(np.int32))
    for token in candidates.tolist():
        if not (int(words[token >> 5]) >> (token & 31)) & 1:
            continue
        data = vocab.token_bytes[token]
        if closes is not None and token in table.simple:
            repeated = closes(table.simple[token])  # only the string or key ends in it
        else:
            repeated = check.step(state, data) is None
        if repeated:
            if out is None:
                out = np.array(words, dtype=np.int32)
            out[token >> 5] &= np.int32(~np.uint32(1 << (token & 31)).view(np.int32))
    return words if out is None else out


def _by_lead(
    check: JsonChecks, state: State, allowed: np.ndarray, table: _Tables, vocab: TokenVocab
) -> tuple[np.ndarray, list[int]]:
    """Where a member's value of a counted ``oneOf`` object starts: (the tokens left to try,
    those whose bytes after their lead may complete something or reach a number's exponent
    (``_Tables.tail_ends``); the others refused by their lead: their bytes up to the value's
    first, whitespace and ":" skipped, one step per distinct lead)."""
    leads: dict[bytes, bool] = {}
    rest = allowed & ~table.tail_ends
    refused = []
    for token in np.flatnonzero(rest).tolist():
        n = int(table.lead[token])
        if not n:
            continue
        lead = (vocab.token_bytes[token] or b"")[:n]
        verdict = leads.get(lead)
        if verdict is None:
            verdict = leads[lead] = check.step(state, lead) is None
        if verdict:
            refused.append(token)
    return allowed & table.tail_ends, refused


def _within_length(
    check: JsonChecks, state: State, length: LengthCount, words: np.ndarray, vocab: TokenVocab
) -> np.ndarray:
    """`words` without the tokens after which the counted string cannot end within its
    maxLength. A token of L characters (its bytes but UTF-8 continuations; escapes make them
    fewer) is kept untried where L leaves room for the pattern's longest shortest completion
    (`slack`), refused untried where it holds no quote or backslash and L passes the room
    left; the others are tried (`JsonChecks.step`)."""
    assert state.counted is not None
    _, _, n, pending = state.counted
    room = length.max_len - n - bool(pending)  # characters free after the one begun
    table = _length_table(vocab)
    if room - length.slack >= table.most:
        return words
    bits = np.unpackbits(words.view(np.uint8), bitorder="little").astype(bool)
    allowed = bits[: len(table.chars)]
    refused = allowed & table.plain & (table.chars > room)
    tried = allowed & ~refused & (~table.plain | (table.chars > room - length.slack))
    for token in np.flatnonzero(tried).tolist():
        refused[token] = check.step(state, vocab.token_bytes[token]) is None
    if not refused.any():
        return words
    allowed &= ~refused
    return np.packbits(bits, bitorder="little").view(np.int32)


def _matching(
    check: JsonChecks, state: State, match: PatternMatch, words: np.ndarray, vocab: TokenVocab
) -> np.ndarray:
    """`words` without the tokens after which the string cannot match its patterns with
    backreferences, or that close it unmatched. Where any text can still be followed by a
    match (`PatternMatch.free`), only the tokens with a quote are tried. Else a token of plain
    text (no quote, no backslash, whole characters) is refused untried where its first
    character already leaves no match to follow (one partial match per distinct first
    character), and matched where it does (`PatternMatch.fits_each`: in text order, a
    token another allowed one extends taking its verdict where that one fits); the others
    are tried (`JsonChecks.step`)."""
    assert state.counted is not None
    _, q, _, pending = state.counted
    bits = np.unpackbits(words.view(np.uint8), bitorder="little").astype(bool)
    allowed = bits[: len(vocab.token_bytes)]
    texts = _text_table(vocab)
    if match.free:
        tried = np.zeros_like(allowed)
        tried[_tables(vocab).quotes] = True
        tried &= allowed
        plain = np.zeros_like(allowed)
    else:
        plain = allowed & texts.plain if not pending else np.zeros_like(allowed)
        tried = allowed & ~plain
    refused = np.zeros_like(allowed)
    ids = np.flatnonzero(plain)
    if len(ids):
        firsts = texts.first[ids]
        first_fits = np.zeros(len(texts.chars), dtype=bool)
        for c in np.unique(firsts).tolist():
            first_fits[c] = match.fits(q + texts.chars[c], 0, b"")
        refused[ids[~first_fits[firsts]]] = True
        longer = ids[first_fits[firsts] & texts.longer[ids]]
        longer = longer[np.argsort(texts.rank[longer])]  # (in the texts' order)
        verdicts = match.fits_each(q, [texts.text[t] for t in longer.tolist()])
        refused[longer] = ~np.array(verdicts, dtype=bool)
    for token in np.flatnonzero(tried).tolist():
        data = vocab.token_bytes[token]
        refused[token] = data is None or check.step(state, data) is None
    if not refused.any():
        return words
    allowed &= ~refused
    return np.packbits(bits, bitorder="little").view(np.int32)


def _closing(state: State) -> Callable[[bytes], bool] | None:
    """Inside a string or key (not right after a backslash): a function of the bytes before a
    closing quote saying whether the string or key they end is refused (a string item
    repeating one, a key read before; other strings never are); None elsewhere (or if the
    text so far does not decode: a split character)."""
    stack, mode, text, buf, _ = state
    top = stack[-1]
    if mode is Mode.KEY:
        keys = top.keys
        if keys is None:
            return _never
        head = b'"' + text
        try:
            json.loads(head + b'"')
        except ValueError:
            return None
        return lambda rest: _decodes_to(head + rest + b'"', keys)
    if mode is not Mode.STRING:
        return None
    if type(top) is not Arr or not top.need & _UNIQUE or top.start is None:
        return _never
    item, seen = bytes(buf[top.start :]), top.seen
    try:
        json.loads(item + b'"')
    except ValueError:
        return None
    return lambda rest: _decodes_to(item + rest + b'"', seen, ("s",))


def _never(rest: bytes) -> bool:
    return False


def _decodes_to(text: bytes, seen: frozenset[Hashable], kind: tuple[str, ...] = ()) -> bool:
    """Whether the JSON string `text` is in `seen` (as ``kind + (value,)`` if kind is given);
    False where it does not decode (an escape the bytes leave open: no string ends there)."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return (kind + (value,) if kind else value) in seen


def _full_lengths(check: JsonChecks, state: State) -> list[bytes]:
    """Inside a string item with a maxLength: the texts that would bring it to a seen string
    of that length (whose only continuation is then its closing quote)."""
    stack, mode, _, buf, _ = state
    top = stack[-1]
    longest = check.longest(stack) if mode is Mode.STRING and type(top) is Arr else None
    if longest is None or top.start is None:
        return []
    try:
        prefix = json.loads(bytes(buf[top.start :]) + b'"')
    except ValueError:
        return []
    return [
        json.dumps(v[len(prefix) :], ensure_ascii=False)[1:-1].encode()
        for kind, v in top.seen
        if kind == "s" and len(v) == longest and v.startswith(prefix) and len(v) > len(prefix)
    ]


class _Tables:
    """Per vocabulary, which tokens can matter: `quotes` (ids holding a quote), `ends`
    (those that may complete a value or start one that can only be one), `opens` (those
    starting a string), `simple` (those ending a string with nothing after its quote but
    whitespace, ":" or ",", which completes or starts nothing else)."""

    def __init__(self, vocab: TokenVocab) -> None:
        tokens = [b or b"" for b in vocab.token_bytes]
        # the vocabulary as one byte array: per-token counts by reduceat over its offsets
        lengths = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        data = np.frombuffer(b"".join(tokens) + b"\0", dtype=np.uint8)
        nonempty = lengths > 0

        def count(chars: bytes) -> np.ndarray:
            hits = np.isin(data, np.frombuffer(chars, dtype=np.uint8)).astype(np.int64)
            return np.where(nonempty, np.add.reduceat(hits, starts), 0)

        first = np.where(nonempty, data[starts], 0)
        quotes = count(b'"')
        self.quotes = np.flatnonzero(quotes)
        starts_one = np.isin(first, np.frombuffer(b"tfn0", dtype=np.uint8))
        second = np.where(lengths > 1, data[np.minimum(starts + 1, len(data) - 1)], 0)
        minus_zero = (first == ord("-")) & (second == ord("0"))
        inside = count(b",]}el" + bytes(_WS)) > 0
        opens = first == ord('"')
        self.ends = (quotes > 1) | (~opens & (inside | starts_one | minus_zero))
        self.opens = opens
        # the length of each token's lead: its bytes up to the first that is not whitespace
        # or ":" (0: none is)
        skip = frozenset(_WS | {ord(":")})
        self.lead = np.array(
            [next((i + 1 for i, c in enumerate(t) if c not in skip), 0) for t in tokens],
            dtype=np.int64,
        )
        # tokens whose bytes after their lead may complete something or reach an exponent
        after = frozenset(_WS | frozenset(b',]}"eEl'))
        self.tail_ends = np.array(
            [any(c in after for c in t[n:]) for t, n in zip(tokens, self.lead.tolist())]
        )
        # tokens whose first quote ends a string and nothing after it can complete or start
        # a value: id -> the bytes before that quote
        self.simple: dict[int, bytes] = {}
        for i in self.quotes.tolist():
            head, _, rest = tokens[i].partition(b'"')
            if not head.endswith(b"\\") and all(c in _AFTER_STRING for c in rest):
                self.simple[i] = head


class _TextTable:
    """Per vocabulary: `plain` (the tokens of whole UTF-8 characters, none a quote, a
    backslash or a control character: inside a string, exactly that text), `text` (each
    one's text, else ""), `first` (the index in `chars` of its first character, else -1)."""

    def __init__(self, vocab: TokenVocab) -> None:
        self.text: list[str] = []
        index: dict[str, int] = {}
        first = []
        for data in vocab.token_bytes:
            try:
                text = (data or b"").decode("utf-8")
            except UnicodeDecodeError:
                text = ""
            if any(c in text for c in '"\\') or any(ord(c) < 0x20 for c in text):
                text = ""
            self.text.append(text)
            first.append(index.setdefault(text[0], len(index)) if text else -1)
        self.first = np.array(first, dtype=np.int64)
        self.plain = self.first >= 0
        self.chars = list(index)
        self.longer = np.array([len(t) > 1 for t in self.text])  # more than one character
        self.rank = np.empty(len(self.text), dtype=np.int64)  # the position in text order
        self.rank[sorted(range(len(self.text)), key=self.text.__getitem__)] = np.arange(
            len(self.text)
        )


class _LengthTable:
    """Per vocabulary: `chars` (each token's bytes but UTF-8 continuation bytes: the
    characters it adds inside a string, or more where it holds escapes), `plain` (those
    holding no quote and no backslash: exactly that many) and `most` (the largest)."""

    def __init__(self, vocab: TokenVocab) -> None:
        tokens = [b or b"" for b in vocab.token_bytes]
        self.chars = np.array([sum(1 for c in t if c & 0xC0 != 0x80) for t in tokens])
        self.plain = np.array([b'"' not in t and b"\\" not in t for t in tokens])
        self.most = int(self.chars.max(initial=0))


_TABLES: weakref.WeakKeyDictionary[TokenVocab, _Tables] = weakref.WeakKeyDictionary()
_LENGTH_TABLES: weakref.WeakKeyDictionary[TokenVocab, _LengthTable] = weakref.WeakKeyDictionary()
_TEXT_TABLES: weakref.WeakKeyDictionary[TokenVocab, _TextTable] = weakref.WeakKeyDictionary()


def _tables(vocab: TokenVocab) -> _Tables:
    table = _TABLES.get(vocab)
    if table is None:  # (two threads may both build it: the same table)
        table = _TABLES[vocab] = _Tables(vocab)
    return table


def _length_table(vocab: TokenVocab) -> _LengthTable:
    table = _LENGTH_TABLES.get(vocab)
    if table is None:  # (two threads may both build it: the same table)
        table = _LENGTH_TABLES[vocab] = _LengthTable(vocab)
    return table


def _text_table(vocab: TokenVocab) -> _TextTable:
    table = _TEXT_TABLES.get(vocab)
    if table is None:  # (two threads may both build it: the same table)
        table = _TEXT_TABLES[vocab] = _TextTable(vocab)
    return table
