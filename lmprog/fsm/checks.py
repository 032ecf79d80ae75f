"""Checks the grammar cannot make: distinct string items (``uniqueItems`` over open sets of
strings), enforced on the text as it is decoded.

A grammar cannot say "no item equals an earlier one" over an infinite set of strings. The
compiler writes such arrays without the condition and hands the guide a ``UniqueStrings``
check: it reads the output as JSON (containers, keys, string values; the grammar guarantees a
JSON prefix), follows the schema's nodes down the keys and indexes (the compiler's own terms,
``algebra.key_node``; a union follows every branch), and in an array whose schema asks for
unique strings keeps the decoded items seen. A token that would close a string item equal to
an earlier one is not allowed: the guide removes it from the mask (only tokens holding a
quote can close a string, a few hundred in a vocabulary), and refuses it in ``advance``.
Where several branches apply, the condition holds if any of them asks for it (a narrowing,
never a wrong acceptance), unless one of them takes any array; under an unconstrained schema
nothing is checked. A string that can only be completed into a repeated item is not foreseen:
the guide allows its characters, and where no token can follow, the request fails with
ConstraintError (as under a finite set of strings with more items required than it has).

States are immutable tuples, one per token, so a guide rolls back by dropping the last ones.
"""

from __future__ import annotations

import json
from typing import Any

from lmprog.fsm.json_schema.algebra import key_node
from lmprog.fsm.json_schema.terms import ArrT, Node, ObjT, RefT, is_full

# A state: (stack, mode, text). stack: frames, innermost last: ("top", nodes), ("obj", nodes,
# key) or ("arr", nodes, checked, seen, index) -- nodes: the schema nodes the container follows
# (None: unconstrained, nothing checked below), key: the last key read, checked: its string
# items must be distinct, seen: the items so far, index: the item being read. mode: what comes next -- "value", "key?" (a key or "}"),
# "key"/"string" (inside one; "key\\"/"string\\" right after a backslash), "colon", "scalar"
# (a number or literal), "after" (",", "]" or "}"). text: the bytes of a key or checked item
# being read (b"" otherwise).
State = tuple
_WS = frozenset(b" \t\n\r")


class UniqueStrings:
    def __init__(self, root: Node, bodies: dict, checked: frozenset) -> None:
        """root: the schema's node; bodies: RefT key -> node; checked: the ArrT terms whose
        string items must be distinct."""
        self.root, self.bodies, self.checked = root, bodies, checked

    def start(self) -> State:
        return ((("top", (self.root,)),), "value", b"")

    def active(self, state: State) -> bool:
        """Whether a token could close a checked item here (the mask needs filtering)."""
        return any(f[0] == "arr" and f[2] for f in state[0])

    def step(self, state: State, data: bytes) -> State | None:
        """The state after `data`; None if it closes a string item equal to an earlier one."""
        stack, mode, text = state
        for byte in data:
            if mode in ("string", "key"):
                if byte == 0x22:  # the closing quote
                    if mode == "key":
                        key = json.loads(b'"' + text + b'"') if stack[-1][1] is not None else ""
                        stack, mode, text = stack[:-1] + (("obj", stack[-1][1], key),), "colon", b""
                        continue
                    top = stack[-1]
                    if top[0] == "arr" and top[2]:
                        value = json.loads(b'"' + text + b'"')
                        if value in top[3]:
                            return None
                        stack = stack[:-1] + (("arr", top[1], True, top[3] | {value}, top[4]),)
                    mode, text = "after", b""
                    continue
                if self._keeps(stack, mode):
                    text += bytes((byte,))
                if byte == 0x5C:  # a backslash: the next byte is escaped
                    mode += "\\"
                continue
            if mode in ("string\\", "key\\"):
                if self._keeps(stack, mode[:-1]):
                    text += bytes((byte,))
                mode = mode[:-1]
                continue
            if byte in _WS:
                if mode == "scalar":
                    mode = "after"
                continue
            c = chr(byte)
            if mode == "scalar":
                if c not in ",]}":
                    continue
                mode = "after"
            if mode == "colon":
                mode = "value"  # the ":" (the grammar allows nothing else)
            elif mode == "key?":
                if c == '"':
                    mode, text = "key", b""
                else:  # "}" of an empty object
                    stack, mode = stack[:-1], "after"
            elif mode == "value":
                stack, mode = self._open(stack, c)
            elif c == ",":
                top = stack[-1]
                if top[0] == "obj":
                    mode = "key?"
                else:
                    stack, mode = stack[:-1] + (top[:4] + (top[4] + 1,),), "value"
            else:  # "]" or "}"
                stack, mode = stack[:-1], "after"
        return stack, mode, text

    def _keeps(self, stack: tuple, mode: str) -> bool:
        """Whether the string being read matters: a key (to follow the schema) or a checked
        item."""
        top = stack[-1]
        if mode == "key":
            return top[1] is not None
        return top[0] == "arr" and top[2]

    def _open(self, stack: tuple, c: str) -> tuple[tuple, str]:
        """A value starting with `c` in the innermost container (or "]" closing an empty one)."""
        if c == "]":
            return stack[:-1], "after"
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
            frame = ("arr", None if terms is None else nodes, checked, frozenset(), 0)
            return stack + (frame,), "value"
        return stack, "string" if c == '"' else "scalar"

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


def filter_words(check: UniqueStrings, state: State, words: Any, vocab: Any) -> Any:
    """`words` (an int32 bitmask over `vocab`) without the tokens that would close a duplicate
    string item from `state`."""
    import numpy as np

    out = None
    for token in quote_tokens(vocab):
        if not (int(words[token >> 5]) >> (token & 31)) & 1:
            continue
        if check.step(state, vocab.token_bytes[token]) is None:
            if out is None:
                out = np.array(words, dtype=np.int32)
            out[token >> 5] &= np.int32(~np.uint32(1 << (token & 31)).view(np.int32))
    return words if out is None else out


_QUOTES: dict[int, list[int]] = {}


def quote_tokens(vocab: Any) -> list[int]:
    """The ids of the vocabulary's tokens holding a double quote (cached per vocabulary)."""
    ids = _QUOTES.get(id(vocab))
    if ids is None:
        ids = _QUOTES[id(vocab)] = [i for i, b in enumerate(vocab.token_bytes) if b and b'"' in b]
    return ids
