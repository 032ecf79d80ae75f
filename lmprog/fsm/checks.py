"""Decode-time checks: what a JSON grammar cannot say, checked on the text as it is decoded.

Distinct items over an open set (``uniqueItems``), two equal items (``not`` over it), distinct
keys, maxLengths counted beside a pattern (``json_schema.terms.lengths``) and patterns with
backreferences (``json_schema.terms.matched``). The compiler
hands the guide a ``JsonChecks``; the guide removes what it refuses from the mask
(``check_masks``) and refuses it in ``advance``. States are immutable (``State``, its stack of
``Top``/``Obj``/``Arr`` frames), one per token, so a guide rolls back by dropping the last ones.
Design: docs/design/constraints.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from decimal import Decimal
from enum import Enum
from typing import Any, Literal, NamedTuple, TypeAlias, TypeVar

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.terms.algebra import conj, key_node
from lmprog.fsm.json_schema.terms.complement import neg
from lmprog.fsm.json_schema.terms.lengths import LengthCount
from lmprog.fsm.json_schema.terms.matched import PatternMatch
from lmprog.fsm.json_schema.terms.nodes import (
    TOP,
    ArrT,
    Node,
    NumT,
    ObjT,
    RefT,
    StrT,
    Term,
    counts_additional_keys,
    full_node,
    is_full,
    make_node,
)
from lmprog.fsm.json_schema.terms.values import in_node, in_object


class Mode(Enum):
    """What the next byte of the text is."""

    VALUE = "value"  # a value starts
    KEY_OR_CLOSE = "key?"  # a key or the "}" of an empty object
    KEY = "key"  # inside a key
    KEY_ESCAPED = "key\\"  # inside a key, right after a backslash
    STRING = "string"  # inside a string value
    STRING_ESCAPED = "string\\"  # inside a string value, right after a backslash
    COLON = "colon"
    SCALAR = "scalar"  # inside a number or literal
    AFTER = "after"  # ",", "]" or "}"


# The modes as module names for the per-byte loop of ``step``: a global is read several times
# faster than an Enum member through its class.
_VALUE, _KEY_OR_CLOSE, _COLON, _SCALAR, _AFTER = (
    Mode.VALUE,
    Mode.KEY_OR_CLOSE,
    Mode.COLON,
    Mode.SCALAR,
    Mode.AFTER,
)
_KEY, _KEY_ESCAPED, _STRING, _STRING_ESCAPED = (
    Mode.KEY,
    Mode.KEY_ESCAPED,
    Mode.STRING,
    Mode.STRING_ESCAPED,
)
_IN_STRING = (Mode.STRING, Mode.STRING_ESCAPED, Mode.KEY, Mode.KEY_ESCAPED)


# The frames of the stack, innermost last; nodes: the schema nodes the container follows
# (None: unconstrained, nothing checked below).
class Top(NamedTuple):
    nodes: tuple[Node, ...] | None


class Obj(NamedTuple):
    nodes: tuple[Node, ...] | None
    key: str  # the last key read
    keys: frozenset[str] | None  # the keys read so far where they must be distinct (else None)
    # where the object's text starts in buf, where a term asks it to be in exactly one of
    # some objects (``one_of``: checked when it closes); else None
    start: int | None = None


class Arr(NamedTuple):
    nodes: tuple[Node, ...] | None
    need: int  # _UNIQUE | _REPEATS bits
    seen: frozenset[Hashable]  # the items' keys (item_key) so far
    item: int  # the item being read
    start: int | None  # where that item starts in buf (None: between items, or counted)
    repeated: bool  # an item equalled an earlier one


Nodes: TypeAlias = "tuple[Node, ...]"
Frame: TypeAlias = "Top | Obj | Arr"
# Frames, innermost last. Which kind is on top follows from the mode (a key is read in an Obj,
# an item in an Arr), which the type cannot say: a frame read from the stack is Any rather
# than narrowed at run time on the per-byte path.
Stack: TypeAlias = "tuple[Any, ...]"
# a string being read by a count: its LengthCount (the pattern automaton's state) or
# PatternMatch (the text so far), characters completed, bytes of one begun
Count: TypeAlias = "tuple[LengthCount | PatternMatch, Any, int, bytes]"


class State(NamedTuple):
    stack: Stack  # Top/Obj/Arr frames
    mode: Mode
    text: bytes  # the bytes of a key being read
    buf: bytes  # the text since the outermost item of a checked array still being read began
    # inside a string whose maxLength is counted apart (json_schema.terms.lengths) or whose
    # patterns with backreferences are matched (json_schema.terms.matched): (its count, the
    # count's state, characters completed, bytes of one begun); else None
    counted: Count | None


_tuple_new = tuple.__new__
_WS = frozenset(b" \t\n\r")
_LITERALS = (b"true", b"false", b"null")
_LETTERS = {"t": True, "f": False, "n": None}  # a literal's first letter decides it
_UNIQUE, _REPEATS = 1, 2
_T = TypeVar("_T")
_Term = TypeVar("_Term", ArrT, ObjT)


class JsonChecks:
    def __init__(
        self,
        root: Node,
        bodies: dict[tuple[Any, ...], Node],
        lengths: dict[StrT, LengthCount | PatternMatch] | None = None,
    ) -> None:
        """root: the schema's node; bodies: RefT key -> node. Arrays are checked where a term
        asks for distinct items (``unique``) or a repeated one (``repeats``), objects where
        one asks for a member breaking a rule (``some_values``: distinct keys); lengths: the
        string terms whose maxLength is counted here -> their ``lengths.LengthCount``, and
        those whose patterns with backreferences are matched -> their
        ``matched.PatternMatch``."""
        self.root, self.bodies, self.lengths = root, bodies, lengths or {}
        # (a, b) -> whether some value of node a is not in node b (``_outside``)
        self._outside_cache: dict[tuple[Node, Node], bool] = {}
        # (nodes, a counted object's text, a value's first byte) -> ``_may_start``
        self._starts: dict[tuple[Any, bytes, str], bool] = {}

    def start(self) -> State:
        return State((Top((self.root,)),), Mode.VALUE, b"", b"", None)

    def active(self, state: State) -> bool:
        """Whether a token could complete something checked here, pass a string's
        maxLength or leave it unable to match a pattern (the mask needs filtering)."""
        return state.counted is not None or self.checks_items(state)

    def checks_items(self, state: State) -> bool:
        """Whether a token could complete an item or a key checked here."""
        return any(
            type(f) is Arr and f.need or type(f) is Obj and f.keys is not None for f in state.stack
        )

    def in_string(self, state: State) -> bool:
        return state.mode in _IN_STRING

    def step(self, state: State, data: bytes) -> State | None:
        """The state after `data`; None if it breaks a condition (an item equal to an earlier
        one, an array closed without a repeat, a key written again, a string past a maxLength
        counted here or left unable to end within it, a string not matching a pattern matched
        here or left unable to)."""
        stack: Stack | None
        count: Count | Literal[False] | None
        stack, mode, text, old, count = state
        buf = bytearray(old)
        keep = _keeps(stack)
        content = bytearray()  # the bytes of a counted string read by this call
        for byte in data:
            if keep:
                buf.append(byte)
            if mode is _STRING or mode is _KEY:
                if byte == 0x22:  # the closing quote
                    if mode is _KEY:
                        stack, mode, text = self._key(stack, text, buf), _COLON, b""
                    else:
                        if count is not None:
                            length, q, n, pending = count
                            if length.close(*length.read(q, n, pending, bytes(content))) is None:
                                return None
                            count, content = None, bytearray()
                        stack, mode = self._done(stack, buf), _AFTER
                    if stack is None:
                        return None
                    continue
                if count is not None:
                    content.append(byte)
                if mode is _KEY and stack[-1].nodes is not None:
                    text += bytes((byte,))
                if byte == 0x5C:  # a backslash: the next byte is escaped
                    mode = _KEY_ESCAPED if mode is _KEY else _STRING_ESCAPED
                    if mode is _STRING_ESCAPED and keep and self._repeat_lost(stack, buf):
                        return None
                elif mode is _STRING and (
                    self._only_repeats(stack, buf) or self._repeat_lost(stack, buf)
                ):
                    return None
                continue
            if mode is _STRING_ESCAPED or mode is _KEY_ESCAPED:
                if mode is _KEY_ESCAPED and stack[-1].nodes is not None:
                    text += bytes((byte,))
                if count is not None:
                    content.append(byte)
                mode = _KEY if mode is _KEY_ESCAPED else _STRING
                if mode is _STRING and keep and self._repeat_lost(stack, buf):
                    return None
                continue
            if mode is _SCALAR:
                if byte not in _WS and byte not in b",]}":
                    top = stack[-1]
                    if type(top) is Obj and top.start is not None and not self._may_grow(top, buf):
                        return None
                    if type(top) is Arr and top.start is not None:
                        item = bytes(buf[top.start :])
                        if item in _LITERALS:  # a literal is complete at its last letter
                            stack = self._done(stack, buf)
                        elif item == b"-0" and self._zero_repeats(stack):
                            return None
                        if stack is None:
                            return None
                    continue
                stack, mode = self._done(stack, buf[:-1] if keep else buf), _AFTER
                if stack is None:
                    return None
            if byte in _WS:
                continue
            c = chr(byte)
            if mode is _COLON:
                mode = _VALUE  # the ":" (the grammar allows nothing else)
            elif mode is _KEY_OR_CLOSE:
                if c == '"':
                    mode, text = _KEY, b""
                else:  # "}" of an empty object
                    stack, mode = self._close(stack, buf), _AFTER
            elif mode is _VALUE:
                stack, mode = self._open(stack, c, buf)
                if stack is None:
                    return None
                if mode is _STRING and self.lengths:
                    count, content = self._count(stack), bytearray()
                    if count is False:
                        return None
                if mode is _VALUE and not keep and _keeps(stack):
                    keep = True
                    buf = bytearray()
                elif mode is _KEY_OR_CLOSE and not keep and _keeps(stack):
                    keep = True  # an object checked when it closes: its text from its "{"
                    buf = bytearray(b"{")
            elif c == ",":
                top = stack[-1]
                if type(top) is Obj:
                    mode = _KEY_OR_CLOSE
                else:
                    frame = Arr(top.nodes, top.need, top.seen, top.item + 1, None, top.repeated)
                    stack, mode = stack[:-1] + (frame,), _VALUE
            else:  # "]" or "}"
                stack, mode = self._close(stack, buf), _AFTER
            if stack is None:
                return None
        if count is not None and content:
            length, q, n, pending = count
            count = (length, *length.read(q, n, pending, bytes(content)))
            if not length.fits(*count[1:]):
                return None
        out = (stack, mode, text, bytes(buf) if _keeps(stack) else b"", count)
        return _tuple_new(State, out)  # State(*out) without its Python-level __new__

    def _count(self, stack: Stack) -> Count | Literal[False] | None:
        """A string value starts: its count if its maxLength is counted here or its patterns
        matched (None if not; False if it may also be another string term, which the grammar
        does not tell apart: refused -- json_schema.terms.lengths writes counted terms only
        where none is)."""
        terms = set(self._terms(self._value_nodes(stack), StrT) or ())
        counted = [self.lengths[t] for t in terms if t in self.lengths]
        if not counted:
            return None
        return False if len(terms) > 1 else (counted[0], counted[0].initial, 0, b"")

    def _key(self, stack: Stack, text: bytes, buf: bytearray) -> Stack | None:
        """A key ends (its bytes are `text`): the innermost object's last key; None if its
        keys must be distinct and this one was read before, or if in an object counted for
        ``one_of`` no value at this key leaves a completion in exactly one object
        (``_one_left``)."""
        top = stack[-1]
        key = json.loads(b'"' + text + b'"') if top.nodes is not None else ""
        keys = top.keys
        if keys is not None:
            if key in keys:
                return None
            keys = keys | {key}
        if top.start is not None:
            members = _members(buf[top.start :], b":null}")
            if members is not None:
                members.pop(key, None)
                if not self._one_left(top, members, (key, TOP)):
                    return None
        return stack[:-1] + (Obj(top.nodes, key, keys, top.start),)

    def _done(self, stack: Stack, buf: bytearray) -> Stack | None:
        """An item of the innermost array ends here (buf holds it from its start): record it,
        or None if an equal one came before and the items must be distinct."""
        top = stack[-1]
        if type(top) is Obj and top.start is not None:  # a member of a oneOf-counted object
            members = _members(buf[top.start :], b"}")
            return stack if members is not None and self._one_left(top, members) else None
        if type(top) is not Arr or not top.need or top.start is None:
            return stack
        item = item_key(bytes(buf[top.start :]))
        repeated = item in top.seen
        if repeated and top.need & _UNIQUE:
            return None
        if not repeated and self._last_chance(stack):
            return None  # the last item an array that must repeat one may hold, not a repeat
        frame = Arr(
            top.nodes, top.need, top.seen | {item}, top.item, None, top.repeated or repeated
        )
        return stack[:-1] + (frame,)

    def _close(self, stack: Stack, buf: bytearray) -> Stack | None:
        """The innermost container closes (None if it must hold a repeated item and does
        not); if it was an item of a checked array, that item ends."""
        top = stack[-1]
        if type(top) is Arr and top.need & _REPEATS and not top.repeated:
            return None
        if type(top) is Obj and top.start is not None and not self._in_one(top, buf):
            return None
        return self._done(stack[:-1], buf)

    def _in_one(self, top: Obj, buf: bytearray) -> bool:
        """Whether the object just closed (its text in buf from top.start) is in exactly one
        object of each ``one_of`` set of its terms (all of them: which term the grammar took
        is not known here, so a set of another term may refuse it too, never accept it)."""
        try:
            value = json.loads(bytes(buf[top.start :]), parse_float=_decimal, parse_int=_decimal)
        except ValueError:
            return False
        groups = {g for t in self._terms(top.nodes, ObjT) or () for g in t.one_of}
        named = {k for g in groups for b in g for k, _ in b.props}
        if any(type(value[k]) is _Huge for k in named if k in value):
            return False  # (a number Decimal cannot hold, where a branch reads it: refused)
        return all(sum(in_object(b, value) for b in g) == 1 for g in groups)

    def _groups(self, top: Obj) -> set[tuple[ObjT, ...]]:
        return {g for t in self._terms(top.nodes, ObjT) or () for g in t.one_of}

    def _one_left(
        self, top: Obj, members: dict[str, Any], pending: tuple[str, Node] | None = None
    ) -> bool:
        """Whether the members read so far of an object counted for ``one_of`` (and a member
        `pending` whose value is only known to be in a node: its first byte) still let some
        completion end in exactly one object of each of its sets: else the member is refused
        as it is written, not at the "}" (a dead end). A completion must keep one branch g and
        leave out each other branch c that no member broke yet: c misses a required key that g
        does not require, or g can write, at a key not read yet, a value c refuses. Where
        the algebra cannot tell, a value is taken to exist: never a valid object refused, and
        a dead end may remain (strict generation, which writes only g's listed keys)."""
        groups = self._groups(top)
        named = {k for g in groups for b in g for k, _ in b.props}
        if any(type(members[k]) is _Huge for k in named if k in members):
            return False  # (refused at "}", as in _in_one)
        return all(self._one_of_group(g, members, pending) for g in groups)

    def _one_of_group(
        self, group: tuple[ObjT, ...], members: dict[str, Any], pending: tuple[str, Node] | None
    ) -> bool:
        key, kind = pending if pending is not None else (None, TOP)
        alive = []
        for b in group:
            for k, node in b.props:
                if k == key:
                    if conj(node, kind).never:
                        break
                elif k in members and not in_node(node, members[k]):
                    break
            else:
                alive.append(b)
        present = members.keys() | ({key} if key is not None else set())
        for g in alive:
            if all(self._left_out(g, c, present, key, kind) for c in alive if c is not g):
                return True
        return False

    def _left_out(self, g: ObjT, c: ObjT, present: set[str], key: str | None, kind: Node) -> bool:
        """Whether an object ending in g can be out of c (neither broken by what was read)."""
        if any(r not in present and r not in g.required for r in c.required):
            return True
        for k, node in c.props:
            if node.top or k in present and k != key:
                continue
            mine = g.prop(k) or TOP
            if self._outside(conj(mine, kind) if k == key else mine, node):
                return True
        return False

    def _outside(self, a: Node, b: Node) -> bool:
        """Whether some value of `a` is not in `b` (True where the algebra cannot tell)."""
        found = self._outside_cache.get((a, b))
        if found is None:
            try:
                found = not conj(a, neg(b, a)).never
            except ConstraintError:
                found = True
            self._outside_cache[(a, b)] = found
        return found

    def _may_start(self, top: Obj, c: str, buf: bytearray) -> bool:
        """Whether a member's value starting with `c` leaves a completion in exactly one
        object of each ``one_of`` set (``_one_left``): a literal is known at its first
        letter, other values by their type."""
        text = bytes(buf[top.start : -1])
        c = c if c in _LETTERS or c in _KINDS else "0"
        found = self._starts.get((top.nodes, text, c))
        if found is not None:  # (a mask asks it of every token starting a value here)
            return found
        members = _members(text, b"null}")
        if members is None:
            return True
        key = top.key
        members.pop(key, None)
        if c in _LETTERS:
            found = self._one_left(top, {**members, key: _LETTERS[c]})
        else:
            found = self._one_left(top, members, (key, _KINDS[c]))
        if len(self._starts) >= 4096:
            self._starts.clear()
        self._starts[(top.nodes, text, c)] = found
        return found

    def _may_grow(self, top: Obj, buf: bytearray) -> bool:
        """Whether the number being read as a ``one_of`` object's member (its last byte in
        buf) may go on: not once its exponent is past what Decimal holds where a branch names
        the key (refused at "}"), nor once it can only be an integer (a positive exponent
        read: more digits only make it larger) where no integer there leaves a completion in
        exactly one object (``_one_left``), refused at the byte that makes it so."""
        colon = buf.rfind(b":")
        e = max(buf.rfind(b"e"), buf.rfind(b"E"))
        if e < colon:
            return True  # (no exponent yet: it may still take a fraction)
        exponent = bytes(buf[e + 1 :])
        if not exponent or exponent.startswith(b"-"):
            return True  # (a "-" may still follow the "e")
        digits = exponent.lstrip(b"+").lstrip(b"0")
        if len(digits) > _EXPONENT_DIGITS:
            return not any(top.key in dict(b.props) for g in self._groups(top) for b in g)
        try:
            least = Decimal(
                bytes(buf[colon + 1 : e]).strip().decode() + "e" + (digits or b"0").decode()
            )
        except ArithmeticError:
            return True
        if least != least.to_integral_value():
            return True
        members = _members(buf[top.start : colon + 1], b"null}")
        if members is None:
            return True
        members.pop(top.key, None)
        return self._one_left(top, members, (top.key, _INTEGERS))

    def counted_key(self, state: State) -> Callable[[bytes], bool] | None:
        """Inside a key of an object counted for ``one_of``: a function of the bytes before
        the closing quote saying whether the key is refused (``_key``: written before, or no
        value there leaves a completion), a key no branch names judged once; None where the
        text so far does not read (a split character, an escape)."""
        stack, _, text, buf, _ = state
        top = stack[-1]
        members = _members(buf[top.start :] + b'"', b":null}")
        if members is None:
            return None
        try:
            members.pop(json.loads(b'"' + text + b'"'), None)
        except ValueError:
            return None
        named = {k for g in self._groups(top) for b in g for k, _ in b.props}
        verdicts: dict[str | None, bool] = {}

        def refused(rest: bytes) -> bool:
            try:
                key = json.loads(b'"' + text + rest + b'"')
            except ValueError:
                return False
            if top.keys is not None and key in top.keys:
                return True
            known = key if key in named else None
            found = verdicts.get(known)
            if found is None:
                found = verdicts[known] = not self._one_left(top, members, (key, TOP))
            return found

        return refused

    def in_counted_object(self, state: State) -> bool:
        """Whether the innermost container is an object counted for ``one_of``."""
        top = state.stack[-1]
        return type(top) is Obj and top.start is not None

    def in_counted_value(self, state: State) -> bool:
        """Whether a value of a member of an object counted for ``one_of`` may start or grow
        here (the mask then tries its tokens: ``check_masks``)."""
        top = state.stack[-1]
        return (
            type(top) is Obj
            and top.start is not None
            and state.mode in (Mode.VALUE, Mode.COLON, Mode.SCALAR)
        )

    def _open(self, stack: Stack, c: str, buf: bytearray) -> tuple[Stack | None, Mode]:
        """A value starting with `c` in the innermost container (or "]" closing an empty one)."""
        if c == "]":
            return self._close(stack, buf), Mode.AFTER
        top = stack[-1]
        if type(top) is Obj and top.start is not None and not self._may_start(top, c, buf):
            return None, Mode.SCALAR
        if type(top) is Arr and top.need:  # an item of a checked array starts (its first byte)
            if top.need & _UNIQUE:
                if c in _LETTERS and ("c", _LETTERS[c]) in top.seen:
                    return None, Mode.SCALAR  # this literal can only repeat one seen: refuse it
                if c == "0" and self._zero_repeats(stack):
                    return None, Mode.SCALAR
            if self._last_chance(stack) and not _may_repeat(c, top.seen):
                return None, Mode.SCALAR  # no item seen is of this kind
            if not any(_open_item(f) for f in stack):
                del buf[:-1]  # no item is open around this one: keep only its bytes
            frame = Arr(top.nodes, top.need, top.seen, top.item, len(buf) - 1, top.repeated)
            stack = stack[:-1] + (frame,)
        nodes = self._value_nodes(stack)
        if c == "{":
            obj_terms = self._terms(nodes, ObjT)
            obj_asked = self._asked(nodes, obj_terms, ObjT)
            start = None
            if obj_asked is not None and any(t.one_of for t in obj_asked):
                if any(_open_item(f) for f in stack):
                    start = len(buf) - 1  # (text around is kept: its "{" was appended)
                else:  # nothing around is kept: its text from its "{"
                    buf[:] = b"{"
                    start = 0
            keys = None if obj_asked is None else frozenset[str]()
            return stack + (Obj(nodes, "", keys, start),), Mode.KEY_OR_CLOSE
        if c == "[":
            terms = self._terms(nodes, ArrT)
            asked = self._asked(nodes, terms, ArrT)
            need = 0
            if asked:
                need = _UNIQUE * any(t.unique for t in asked) | _REPEATS * any(
                    t.repeats for t in asked
                )
            frame = Arr(None if terms is None else nodes, need, frozenset(), 0, None, False)
            return stack + (frame,), Mode.VALUE
        return stack, Mode.STRING if c == '"' else Mode.SCALAR

    def _asked(
        self, nodes: Nodes | None, terms: list[_Term] | None, kind: type[_Term]
    ) -> list[_Term] | None:
        """The terms among a container's terms that ask for a condition (distinct or
        repeated items, distinct keys); None if none does, or if each of the nodes it follows
        takes any container of its kind. Where only some do (the nodes of an enclosing union's
        branches), it holds: which branch the text is in may show only later (another key of
        an enclosing object), and the asking branch's grammar left the condition out.
        (Read from the terms themselves, not from those whose grammar left the condition to
        the check: a grammar may narrow a term by another, an item matching ``contains``, and
        what the narrowed term asks for, one of the two asks for:
        json_schema.emit.emitter.Emitter.derived.)"""
        if (
            terms is None
            or nodes is None
            or all(n.top or any(_full(t, kind) for t in n.terms) for n in nodes)
        ):
            return None
        asked = [t for t in terms if _asks(t)]
        return asked or None

    def strings(self, stack: Stack) -> frozenset[str] | None:
        """The strings an item of the innermost (distinct-items) array may be, when they are a
        finite set (every string term an enum); else None."""
        top = stack[-1]
        if type(top) is not Arr or not top.need & _UNIQUE:
            return None
        terms = self._terms(self._value_nodes(stack), StrT)
        if not terms or any(t.values is None for t in terms):
            return None
        return frozenset(v for t in terms for v in t.values or ())

    def _only_repeats(self, stack: Stack, buf: bytearray) -> bool:
        """Whether the string item read so far can only become one seen: from a finite set,
        every value it can still become was seen; or it is as long as any string item may be
        (maxLength) and was seen."""
        top = stack[-1]
        if type(top) is not Arr or not top.need & _UNIQUE or top.start is None:
            return False
        values, longest = self.strings(stack), self.longest(stack)
        if values is None and longest is None:
            return False
        try:
            prefix = json.loads(bytes(buf[top.start :]) + b'"')
        except ValueError:  # inside an escape, or a split character
            return False
        seen = top.seen
        if values is not None:
            return all(("s", v) in seen for v in values if v.startswith(prefix))
        return longest is not None and len(prefix) >= longest and ("s", prefix) in seen

    def _last_chance(self, stack: Stack) -> bool:
        """Whether the innermost array must still repeat an item (``not`` over uniqueItems)
        and the item being read is the last that every term of it allows (maxItems): that
        item must then equal one seen, and one that cannot is refused as it is written (its
        first byte by its kind, a string's characters by the seen strings it may still
        become, any item as it ends), not at the "]"."""
        top = stack[-1]
        if type(top) is not Arr or not top.need & _REPEATS or top.repeated:
            return False
        terms = self._terms(top.nodes, ArrT)
        if not terms or any(t.max_items is None for t in terms):
            return False
        return top.item >= max(t.max_items or 0 for t in terms) - 1

    def repeat_due(self, state: State) -> bool:
        """Whether an item that must repeat a seen one starts or is a string here (the mask
        then tries every allowed token: ``check_masks``)."""
        modes = (Mode.VALUE, Mode.STRING, Mode.STRING_ESCAPED)
        return state.mode in modes and self._last_chance(state.stack)

    def _repeat_lost(self, stack: Stack, buf: bytearray) -> bool:
        """Whether the string item read so far, the last chance to repeat an item, can no
        longer become a seen string (compared as UTF-16 code units, so that an escaped
        surrogate pair is read unit by unit; an escape or a character begun: by the seen
        strings' next unit or character)."""
        top = stack[-1]
        if not self._last_chance(stack) or top.start is None:
            return False
        read = _string_prefix(bytes(buf[top.start :]))
        if read is None:
            return False
        head, kind, begun = read
        units = head.encode("utf-16-le", "surrogatepass")
        for k, v in top.seen:
            if k != "s":
                continue
            seen = v.encode("utf-16-le", "surrogatepass")
            if not seen.startswith(units):
                continue
            rest = seen[len(units) :]
            if kind == "":
                return False
            if not rest:
                continue
            if kind == "esc":
                if f"{int.from_bytes(rest[:2], 'little'):04x}".startswith(begun.lower()):
                    return False
            if kind == "utf8":
                char = rest.decode("utf-16-le", "surrogatepass")[:1]
                if char.encode("utf-8", "surrogatepass").startswith(begun.encode("latin-1")):
                    return False
        return True

    def longest(self, stack: Stack) -> int | None:
        """The greatest maxLength of the string items of the innermost (distinct-items) array,
        if every string they may be has one; else None."""
        top = stack[-1]
        if type(top) is not Arr or not top.need & _UNIQUE:
            return None
        terms = self._terms(self._value_nodes(stack), StrT)
        if not terms or any(t.max_len is None for t in terms):
            return None
        return max(t.max_len or 0 for t in terms)

    def _zero_repeats(self, stack: Stack) -> bool:
        """Whether an item starting "0" (or "-0") of a distinct-items array can only be 0 and
        0 was seen: the item's numbers are integers (no fraction may follow) -- refused at
        once, not a dead end."""
        top = stack[-1]
        if not top.need & _UNIQUE or ("n", _ZERO) not in top.seen:
            return False
        numbers = self._terms(self._value_nodes(stack), NumT)
        if not numbers:
            return False
        return all(t.integer for t in numbers)

    def _value_nodes(self, stack: Stack) -> Nodes | None:
        """The nodes the value starting now follows."""
        top = stack[-1]
        if type(top) is Top or top.nodes is None:
            nodes: Nodes | None = top.nodes
            return nodes
        if type(top) is Obj:
            obj_terms = self._terms(top.nodes, ObjT)
            return None if obj_terms is None else tuple(key_node(t, top.key) for t in obj_terms)
        terms, i = self._terms(top.nodes, ArrT), top.item
        return None if terms is None else tuple(_item(t, i) for t in terms)

    def _terms(self, nodes: Nodes | None, kind: type[_T]) -> list[_T] | None:
        """The terms of `kind` in the nodes, references followed; None if every node is TOP
        (a branch that takes any value is left out: its values ask for nothing)."""
        if nodes is None or all(n.top for n in nodes):
            return None
        out: list[_T] = []
        stack, seen = list(nodes), set()
        while stack:
            node = stack.pop()
            if node.top:
                continue
            for t in node.terms:
                if isinstance(t, RefT):
                    if t.key not in seen:
                        seen.add(t.key)
                        stack.append(self.bodies[t.key])
                elif isinstance(t, kind):
                    out.append(t)
        return out

    def stuck(self, state: State) -> str:
        """Why no token may follow (for the guide's error)."""
        if state.counted is not None and isinstance(state.counted[0], PatternMatch):
            return (
                "no text the grammar allows lets the string match its pattern with a "
                "backreference (a match may not fit within its maxLength)"
            )
        if any(type(f) is Obj and f.start is not None for f in state.stack[-1:]):
            return (
                "the object is in none or several of the objects of a 'oneOf' (checked as "
                "decoded) and no member the grammar allows next can change that"
            )
        arrays = [f for f in state.stack if type(f) is Arr and f.need]
        if arrays and arrays[-1].need & _REPEATS and not arrays[-1].repeated:
            return "the array must hold two equal items (not uniqueItems) and none can follow"
        if state.mode in (Mode.KEY_OR_CLOSE, Mode.KEY, Mode.KEY_ESCAPED):
            return "every key the schema allows next was written before"
        return "every item the schema allows next would repeat an earlier one (uniqueItems)"


def item_key(text: bytes) -> Hashable:
    """A hashable key of a JSON text's value under JSON Schema equality (as
    ``json_schema.terms.values.value_key``: 1 == 1.0 == 1e0, true != 1, key order ignored), numbers of any size
    and exponent compared exactly."""
    return _key(json.loads(text, parse_int=_number, parse_float=_number))


def _key(v: Any) -> Hashable:
    if v is None or isinstance(v, bool):
        return ("c", v)
    if isinstance(v, tuple):  # a number (_number)
        return ("n", v)
    if isinstance(v, str):
        return ("s", v)
    if isinstance(v, list):
        return ("a", tuple(_key(x) for x in v))
    return ("o", frozenset((k, _key(x)) for k, x in v.items()))


def _number(text: str) -> tuple[bool, str, int]:
    """A JSON number's text as (sign, significant digits, exponent): equal numbers, equal
    tuples (zero, of either sign, is ``_ZERO``)."""
    mantissa, _, exponent = text.lower().partition("e")
    sign = mantissa.startswith("-")
    whole, _, fraction = mantissa.lstrip("-").partition(".")
    digits = (whole + fraction).lstrip("0")
    if not digits:
        return _ZERO
    power = int(exponent or 0) - len(fraction)
    stripped = digits.rstrip("0")
    return (sign, stripped, power + len(digits) - len(stripped))


_ZERO = (False, "", 0)


class _Huge(str):
    """A JSON number whose exponent Decimal cannot hold (``0E-9539602813336428226``)."""


def _decimal(text: str) -> Decimal | _Huge:
    try:
        return Decimal(text)
    except ArithmeticError:
        return _Huge(text)


# a value's node by its first byte (numbers: a digit or "-")
_KINDS = {
    '"': full_node(StrT),
    "{": full_node(ObjT),
    "[": full_node(ArrT),
    "0": full_node(NumT),
}
_INTEGERS = make_node((NumT(integer=True),))
_EXPONENT_DIGITS = 15  # (Decimal holds exponents below 10**18)


def _members(text: bytes | bytearray, end: bytes) -> dict[str, Any] | None:
    """An object's members read so far (its text from "{", closed by `end`), numbers as
    Decimal; None if that does not parse."""
    try:
        value = json.loads(bytes(text) + end, parse_float=_decimal, parse_int=_decimal)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _string_prefix(text: bytes) -> tuple[str, str, str] | None:
    """A JSON string's text begun (its quote first) as (the characters read, "" | "esc" |
    "utf8", what is begun: an escape's hex digits, a character's bytes as latin-1); None
    where it does not read."""
    i, n = 1, len(text)
    while i < n:
        if text[i] != 0x5C:
            i += 1
        elif i + 1 >= n or text[i + 1] == 0x75 and n - i - 2 < 4:  # "\" or "\u" + < 4 hex
            try:
                head = json.loads(text[:i] + b'"')
            except ValueError:
                return None
            return head, "esc", text[i + 2 :].decode("latin-1")
        else:
            i += 6 if text[i + 1] == 0x75 else 2
    for cut in range(4):
        try:
            head = json.loads(text[: n - cut] + b'"')
        except ValueError:
            continue
        return head, "utf8" if cut else "", text[n - cut :].decode("latin-1")
    return None


def _may_repeat(c: str, seen: frozenset[Hashable]) -> bool:
    """Whether a value starting with `c` may equal an item seen (``item_key``'s kinds)."""
    if c in _LETTERS:
        return ("c", _LETTERS[c]) in seen
    kind = {'"': "s", "[": "a", "{": "o"}.get(c, "n")
    return any(k[0] == kind for k in seen)  # type: ignore[index]


def _asks(t: ArrT | ObjT) -> bool:
    if isinstance(t, ArrT):
        return t.unique or t.repeats
    return bool(t.some_values or t.one_of) or counts_additional_keys(t)


def _open_item(f: Frame) -> bool:
    """Whether the frame's text is being kept (an item of a checked array, an object
    checked when it closes)."""
    return (
        type(f) is Arr
        and f.need
        and f.start is not None
        or type(f) is Obj
        and (f.start is not None)
    )


def _full(t: Term, kind: type) -> bool:
    return isinstance(t, kind) and is_full(t)


def _keeps(stack: Stack) -> bool:
    """Whether the text of an item being read is needed (an array's items are checked)."""
    for f in stack:  # a loop, not any(): per token, a generator costs more than the test
        if type(f) is Arr and f.need or type(f) is Obj and f.start is not None:
            return True
    return False


def _item(t: ArrT, i: int) -> Node:
    return t.prefix[i] if i < len(t.prefix) else t.rest
