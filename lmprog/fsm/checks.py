"""What the grammar cannot say, checked on the text as it is decoded: ``uniqueItems`` over
items from an open set (strings, numbers, objects...).

A grammar cannot say "no item equals an earlier one" when the items are not drawn from a small
finite set. The compiler writes such arrays without the condition and hands the guide a
``UniqueItems`` check: it reads the output as JSON (the grammar guarantees a JSON prefix),
follows the schema's nodes down keys and indexes (the compiler's own terms,
``algebra.key_node``; a union follows every branch), and in an array whose schema asks for
distinct items keeps the items seen, under JSON Schema equality (``1`` and ``1.0`` are equal,
key order does not count). A token that would complete an item equal to an earlier one --
the closing quote of a string, the character after a number, the last letter of ``true``, the
bracket closing an object -- is not allowed: the guide removes it from the mask (only tokens
that can complete something are tried: those with a quote inside strings, the few the grammar
allows elsewhere) and refuses it in ``advance``.

Where several branches apply, the condition holds if any of them asks for it (a narrowing,
never a wrong acceptance), unless one of them takes any array; under an unconstrained schema
nothing is checked. A value that can only become a seen one is refused as soon as that is so:
a literal at its first letter, an integer item "0" once 0 was seen, a string of a finite set
(an enum too large for the grammar to track) at the character after which only seen strings
remain, a string that a token would fill to its maxLength as a seen one; other values that can only be completed into a repeated item are not foreseen: the guide allows their
characters, and where no token can follow, the request fails with ConstraintError (as in an
array of `^[ab]$` strings asked for three distinct items).

States are immutable tuples, one per token, so a guide rolls back by dropping the last ones.
"""

from __future__ import annotations

import json
import weakref
from decimal import Decimal
from typing import Any

import numpy as np

from lmprog.fsm.json_schema.algebra import key_node
from lmprog.fsm.json_schema.emit import value_key
from lmprog.fsm.json_schema.terms import ArrT, Node, NumT, ObjT, RefT, StrT, is_full

# A state: (stack, mode, text, buf).
# stack: frames, innermost last: ("top", nodes), ("obj", nodes, key) or
#   ("arr", nodes, checked, seen, index, start) -- nodes: the schema nodes the container
#   follows (None: unconstrained, nothing checked below); key: the last key read; checked: its
#   items must be distinct; seen: their keys (value_key) so far; index: the item being read;
#   start: where that item starts in buf (None: between items, or already counted).
# mode: what comes next -- "value", "key?" (a key or "}"), "key"/"string" (inside one;
#   "key\\"/"string\\" right after a backslash), "colon", "scalar" (a number or literal),
#   "after" (",", "]" or "}").
# text: the bytes of a key being read; buf: the text since the outermost item of a checked
#   array still being read started.
State = tuple
_WS = frozenset(b" \t\n\r")
_LITERALS = (b"true", b"false", b"null")
_LETTERS = {"t": True, "f": False, "n": None}  # a literal's first letter decides it


class UniqueItems:
    def __init__(self, root: Node, bodies: dict, checked: frozenset) -> None:
        """root: the schema's node; bodies: RefT key -> node; checked: the ArrT terms whose
        items must be distinct."""
        self.root, self.bodies, self.checked = root, bodies, checked

    def start(self) -> State:
        return ((("top", (self.root,)),), "value", b"", b"")

    def active(self, state: State) -> bool:
        """Whether a token could complete a checked item here (the mask needs filtering)."""
        return any(f[0] == "arr" and f[2] for f in state[0])

    def in_string(self, state: State) -> bool:
        return state[1] in ("string", "string\\", "key", "key\\")

    def step(self, state: State, data: bytes) -> State | None:
        """The state after `data`; None if it completes an item equal to an earlier one."""
        stack, mode, text, old = state
        buf = bytearray(old)
        keep = self.active(state)
        for byte in data:
            if keep:
                buf.append(byte)
            if mode in ("string", "key"):
                if byte == 0x22:  # the closing quote
                    if mode == "key":
                        key = json.loads(b'"' + text + b'"') if stack[-1][1] is not None else ""
                        stack, mode, text = stack[:-1] + (("obj", stack[-1][1], key),), "colon", b""
                        continue
                    mode = "after"
                    stack = self._done(stack, buf)
                    if stack is None:
                        return None
                    continue
                if mode == "key" and stack[-1][1] is not None:
                    text += bytes((byte,))
                if byte == 0x5C:  # a backslash: the next byte is escaped
                    mode += "\\"
                elif mode == "string" and self._only_repeats(stack, buf):
                    return None
                continue
            if mode in ("string\\", "key\\"):
                if mode == "key\\" and stack[-1][1] is not None:
                    text += bytes((byte,))
                mode = mode[:-1]
                continue
            if mode == "scalar":
                if byte not in _WS and byte not in b",]}":
                    top = stack[-1]
                    if top[0] == "arr" and top[5] is not None:
                        item = bytes(buf[top[5] :])
                        if item in _LITERALS:  # a literal is complete at its last letter
                            stack = self._done(stack, buf)
                        elif item == b"-0" and self._zero_repeats(stack):
                            return None
                        if stack is None:
                            return None
                    continue
                stack, mode = self._done(stack, buf[:-1] if keep else buf), "after"
                if stack is None:
                    return None
            if byte in _WS:
                continue
            c = chr(byte)
            if mode == "colon":
                mode = "value"  # the ":" (the grammar allows nothing else)
            elif mode == "key?":
                if c == '"':
                    mode, text = "key", b""
                else:  # "}" of an empty object
                    stack, mode = self._close(stack, buf), "after"
            elif mode == "value":
                stack, mode = self._open(stack, c, buf)
                if mode == "value" and not keep and self.active((stack,)):
                    keep = True
                    buf = bytearray()
            elif c == ",":
                top = stack[-1]
                if top[0] == "obj":
                    mode = "key?"
                else:
                    stack, mode = stack[:-1] + (top[:4] + (top[4] + 1, None),), "value"
            else:  # "]" or "}"
                stack, mode = self._close(stack, buf), "after"
            if stack is None:
                return None
        return stack, mode, text, bytes(buf) if self.active((stack,)) else b""

    def _done(self, stack: tuple, buf: bytearray) -> tuple | None:
        """An item of the innermost array ends here (buf holds it from its start): record it,
        or None if an equal one came before."""
        top = stack[-1]
        if top[0] != "arr" or not top[2] or top[5] is None:
            return stack
        item = value_key(json.loads(bytes(buf[top[5] :]), parse_float=Decimal))
        if item in top[3]:
            return None
        return stack[:-1] + (("arr", top[1], True, top[3] | {item}, top[4], None),)

    def _close(self, stack: tuple, buf: bytearray) -> tuple | None:
        """The innermost container closes; if it was an item of a checked array, it ends."""
        return self._done(stack[:-1], buf)

    def _open(self, stack: tuple, c: str, buf: bytearray) -> tuple[tuple | None, str]:
        """A value starting with `c` in the innermost container (or "]" closing an empty one)."""
        if c == "]":
            return self._close(stack, buf), "after"
        top = stack[-1]
        if top[0] == "arr" and top[2]:  # an item of a checked array starts (its first byte)
            if c in _LETTERS and value_key(_LETTERS[c]) in top[3]:
                return None, "scalar"  # this literal can only repeat one seen: refuse it now
            if c == "0" and self._zero_repeats(stack):
                return None, "scalar"
            if not any(f[0] == "arr" and f[2] and f[5] is not None for f in stack):
                del buf[:-1]  # no item is open around this one: keep only its bytes
            stack = stack[:-1] + (top[:5] + (len(buf) - 1,),)
        nodes = self._value_nodes(stack)
        if c == "{":
            return stack + (("obj", nodes, ""),), "key?"
        if c == "[":
            terms = self._terms(nodes, ArrT)
            checked = (  # not where a branch takes any array
                terms is not None
                and any(t in self.checked for t in terms)
                and not any(is_full(t) for t in terms)
            )
            frame = ("arr", None if terms is None else nodes, checked, frozenset(), 0, None)
            return stack + (frame,), "value"
        return stack, "string" if c == '"' else "scalar"

    def closing(self, state: State):
        """Inside a string item of a checked array (not right after a backslash): a function
        of the bytes before a closing quote saying whether the item they end repeats one;
        None elsewhere (or if the item so far does not decode: a split character)."""
        stack, mode, _, buf = state
        top = stack[-1]
        if mode != "string" or top[0] != "arr" or not top[2] or top[5] is None:
            return None
        item, seen = bytes(buf[top[5] :]), top[3]
        try:
            json.loads(item + b'"')
        except ValueError:
            return None

        def repeats(head: bytes) -> bool:
            try:
                return ("s", json.loads(item + head + b'"')) in seen
            except ValueError:  # an escape the head leaves open: no string ends there
                return False

        return repeats

    def finite_item(self, state: State) -> bool:
        """Whether the string being read, or the item about to start, is from a finite set
        of strings (then any character may be the one after which only repeats remain)."""
        return state[1] in ("string", "value") and self._strings(state[0]) is not None

    def _strings(self, stack: tuple) -> frozenset | None:
        """The strings an item of the innermost (checked) array may be, when they are a
        finite set (every string term an enum); else None."""
        top = stack[-1]
        if top[0] != "arr" or not top[2]:
            return None
        terms = self._terms(self._value_nodes(stack), StrT)
        if not terms or any(t.values is None for t in terms):
            return None
        return frozenset(v for t in terms for v in t.values)

    def _only_repeats(self, stack: tuple, buf: bytearray) -> bool:
        """Whether the string item read so far can only become one seen: from a finite set,
        every value it can still become was seen; or it is as long as any string item may be
        (maxLength) and was seen."""
        top = stack[-1]
        if top[0] != "arr" or not top[2] or top[5] is None:
            return False
        values, longest = self._strings(stack), self.longest(stack)
        if values is None and longest is None:
            return False
        try:
            prefix = json.loads(bytes(buf[top[5] :]) + b'"')
        except ValueError:  # inside an escape, or a split character
            return False
        seen = top[3]
        if values is not None:
            return all(("s", v) in seen for v in values if v.startswith(prefix))
        return len(prefix) >= longest and ("s", prefix) in seen

    def longest(self, stack: tuple) -> int | None:
        """The greatest maxLength of the string items of the innermost (checked) array, if
        every string they may be has one; else None."""
        top = stack[-1]
        if top[0] != "arr" or not top[2]:
            return None
        terms = self._terms(self._value_nodes(stack), StrT)
        if not terms or any(t.max_len is None for t in terms):
            return None
        return max(t.max_len for t in terms)

    def full_lengths(self, state: State) -> list[bytes]:
        """Inside a string item with a maxLength: the texts that would bring it to a seen
        string of that length (whose only continuation is then its closing quote)."""
        stack, mode, _, buf = state
        top = stack[-1]
        longest = self.longest(stack) if mode == "string" and top[0] == "arr" else None
        if longest is None or top[5] is None:
            return []
        try:
            prefix = json.loads(bytes(buf[top[5] :]) + b'"')
        except ValueError:
            return []
        return [
            json.dumps(v[len(prefix) :], ensure_ascii=False)[1:-1].encode()
            for kind, v in top[3]
            if kind == "s" and len(v) == longest and v.startswith(prefix) and len(v) > len(prefix)
        ]

    def _zero_repeats(self, stack: tuple) -> bool:
        """Whether an item starting "0" (or "-0") can only be 0 and 0 was seen: the item's
        numbers are integers (no fraction may follow) -- refused at once, not a dead end."""
        if ("n", 0) not in stack[-1][3]:
            return False
        numbers = self._terms(self._value_nodes(stack), NumT)
        return bool(numbers) and all(t.integer for t in numbers)

    def _value_nodes(self, stack: tuple) -> tuple | None:
        """The nodes the value starting now follows."""
        top = stack[-1]
        if top[0] == "top" or top[1] is None:
            return top[1]
        if top[0] == "obj":
            terms = self._terms(top[1], ObjT)
            return None if terms is None else tuple(key_node(t, top[2]) for t in terms)
        terms, i = self._terms(top[1], ArrT), top[4]
        return None if terms is None else tuple(_item(t, i) for t in terms)

    def _terms(self, nodes: tuple | None, kind: type) -> list | None:
        """The terms of `kind` in the nodes, references followed; None if one is TOP."""
        if nodes is None:
            return None
        out: list = []
        stack, seen = list(nodes), set()
        while stack:
            node = stack.pop()
            if node.top:
                return None
            for t in node.terms:
                if isinstance(t, RefT):
                    if t.key not in seen:
                        seen.add(t.key)
                        stack.append(self.bodies[t.key])
                elif isinstance(t, kind):
                    out.append(t)
        return out


def _item(t: ArrT, i: int) -> Node:
    return t.prefix[i] if i < len(t.prefix) else t.rest


def filter_words(check: UniqueItems, state: State, words: np.ndarray, vocab: Any) -> np.ndarray:
    """`words` (an int32 bitmask over `vocab`) without the tokens that would complete a
    repeated item from `state`, or start a value that can only be one. Tried: inside a string,
    the tokens with a quote (nothing else can end it) and those that would fill it to its
    maxLength as a seen string, or every allowed token if the item is one of a finite set of
    strings (any character may leave only repeats); elsewhere the
    allowed tokens that hold punctuation, whitespace, two quotes or a literal's last letter,
    or start a literal, a zero, or (before such a string) a string."""
    table = _tables(vocab)
    finite = check.finite_item(state)
    if check.in_string(state) and not finite:
        extra = [vocab.token_id(t) for t in check.full_lengths(state)]
        extra = [i for i in extra if i is not None]
        candidates = np.concatenate((table.quotes, np.array(extra, dtype=np.int64)))
        closes = check.closing(state)
    else:
        closes = None
        allowed = np.unpackbits(words.view(np.uint8), bitorder="little")[: len(table.ends)]
        allowed = allowed.astype(bool)
        if not check.in_string(state):
            allowed &= table.ends | table.opens if finite else table.ends
        candidates = np.flatnonzero(allowed)
    out = None
    for token in candidates.tolist():
        if not (int(words[token >> 5]) >> (token & 31)) & 1:
            continue
        data = vocab.token_bytes[token]
        if closes is not None and token in table.simple:
            repeated = closes(table.simple[token])  # only the string item ends in it
        else:
            repeated = check.step(state, data) is None
        if repeated:
            if out is None:
                out = np.array(words, dtype=np.int32)
            out[token >> 5] &= np.int32(~np.uint32(1 << (token & 31)).view(np.int32))
    return words if out is None else out


class _Tables:
    """Per vocabulary, which tokens can matter: `quotes` (ids holding a quote), `ends`
    (those that may complete a value or start one that can only be one), `opens` (those
    starting a string), `simple` (those ending a string and nothing else)."""

    def __init__(self, vocab: Any) -> None:
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
        # tokens whose first quote ends a string and nothing after it can end another value:
        # id -> the bytes before that quote
        self.simple: dict[int, bytes] = {}
        for i in self.quotes.tolist():
            head, _, rest = tokens[i].partition(b'"')
            if not head.endswith(b"\\") and not any(c in rest for c in b'"]}'):
                self.simple[i] = head


_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # vocabulary -> _Tables


def _tables(vocab: Any) -> _Tables:
    table = _TABLES.get(vocab)
    if table is None:  # (two threads may both build it: the same table)
        table = _TABLES[vocab] = _Tables(vocab)
    return table
