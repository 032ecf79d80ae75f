"""A strict parser for Python-style and ECMA-262 regexes, to ``ParsedRegex`` or an error that
names the unsupported construct and its position."""

from __future__ import annotations

import re

from lmprog.core.errors import ConstraintError
from lmprog.fsm.regex.anchors import (
    ANCHOR_ESCAPES,
    Anchor,
    Anchored,
    Side,
    Unsure,
    concat_nodes,
    join_anchored,
    line_edges,
)
from lmprog.fsm.regex.assertions import Assert, without_assertions
from lmprog.fsm.regex.casefold import fold
from lmprog.fsm.regex.charset import (
    ANY_CHAR,
    CATEGORY_NAMES,
    MAX_CP,
    POSIX_CLASSES,
    CharSet,
    cs,
    unicode_category,
)
from lmprog.fsm.regex.syntax import (
    EMPTY,
    Alternation,
    Branch,
    Chars,
    Concat,
    Node,
    ParsedRegex,
    Repeat,
)

MAX_ANCHORED_BRANCHES = 64  # alternatives an anchored pattern may expand to (split_anchors)
MAX_ANCHORED_REPEAT = 16  # the count of a repeated group holding an anchor, where bounded
MAX_GROUP_DEPTH = 100  # groups nested in one pattern (its passes recurse on the nesting)
# Counts llguidance expands while decoding, measured on the bundled tokenizer: a{200000} and
# (a{0,30}){0,30} decode, a{300000} and (a{0,100}){0,100} stop at the first tokens
MAX_REPEAT = 100_000
MAX_NESTED_REPEAT = 2_000

_DIGIT = cs("0-9")
_WORD = cs("a-zA-Z0-9_")
_PY_SPACE = CharSet.of(" \t\n\r\f\v")
_ECMA_SPACE = CharSet.of(" \t\n\r\f\v\u00a0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff") | cs(
    "\u2000-\u200a"
)
_CLASS_ESCAPES = {"d": _DIGIT, "w": _WORD}
_BRACES = re.compile(r"\{(\d*)(,(\d*))?\}")
_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}
_FLAGS = re.compile(r"([a-zA-Z]*)(?:-([a-zA-Z]*))?([:)])")
_FLAG_NAMES = {"i": "ignorecase", "m": "multiline", "s": "dotall", "u": "unicode (a no-op)"}


class Look:
    """A lookahead ``(?=node)`` (``negative``: ``(?!node)``), read only by ``lookahead.py``'s
    parser (``_Parser(..., lookahead=True)``); never part of a ParsedRegex."""

    __slots__ = ("node", "negative", "at")

    def __init__(self, node: Node, negative: bool, at: int) -> None:
        self.node, self.negative, self.at = node, negative, at


def _has_anchor(node: Node | Look | Anchor) -> bool:
    if isinstance(node, Anchor):
        return True
    if not isinstance(node, (Concat, Alternation, Repeat, Look)):
        return False
    if isinstance(node, Look):
        return _has_anchor(node.node)
    if isinstance(node, Repeat):
        return _has_anchor(node.node)
    return any(_has_anchor(n) for n in (node.parts if isinstance(node, Concat) else node.options))


def _java_intersection(src: str, i: int) -> bool:
    """Whether the class opening before ``src[i]`` is written in Java's syntax: its nested
    ``[``/``]`` balance (escapes skipped) and it holds ``&&``."""
    depth, found = 1, False
    while i < len(src):
        c = src[i]
        if c == "\\":
            i += 1
        elif c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth == 0:
                return found
        elif src.startswith("&&", i):
            found = True
        i += 1
    return False


def parse_regex(pattern: str, dialect: str = "python") -> ParsedRegex:
    """Parse ``pattern`` or raise ``ConstraintError`` naming the construct and position."""
    if not isinstance(pattern, str):
        raise ConstraintError(f"a regex must be a str, got {type(pattern).__name__}")
    assert dialect in ("python", "ecma"), dialect
    return ParsedRegex(pattern, dialect, _Parser(pattern, dialect).parse())


class _Parser:
    def __init__(self, src: str, dialect: str, lookahead: bool = False):
        self.src, self.i, self.ecma = src, 0, dialect == "ecma"
        self.lookahead = lookahead  # read (?=...) and (?!...) as Look nodes
        self.depth = 0  # groups open
        self.products: dict[int, int] = {}  # repetition -> the product of the counts in it
        self.anchors: list[int] = []  # positions of the anchors read
        self.flags = ""  # inline flags in force (Python's: i, m, s)
        self.multiline = False  # whether a multiline anchor was read
        self.asserts: list[int] = []  # positions of the \\b, \\B and lookbehinds read
        space = _ECMA_SPACE if self.ecma else _PY_SPACE
        self.classes = dict(_CLASS_ESCAPES, s=space)
        dot_excluded = "\n\r\u2028\u2029" if self.ecma else "\n"
        self.dot = ANY_CHAR - CharSet.of(dot_excluded)

    def fail(self, what: str, at: int | None = None) -> ConstraintError:
        pos = self.i if at is None else at
        return ConstraintError(f"regex {self.src!r}: {what} at position {pos}")

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.src[j] if j < len(self.src) else ""

    def parse(self) -> tuple[Branch, ...]:
        node = self.alternation()
        if self.i < len(self.src):
            raise self.fail("unbalanced ')'")
        if self.asserts:
            return self.without_assertions(node)
        branches = [b for parts in self.split_anchors(node) for b in line_edges(*parts, self.ecma)]
        if not branches:
            inner = [p for p in self.anchors if 0 < p < len(self.src) - 1] or self.anchors
            return self.matches_nothing(
                "an anchor no text can satisfy ('$' before a character, '^' after one)", inner[0]
            )
        return tuple(branches)

    def matches_nothing(self, why: str, at: int) -> tuple[Branch, ...]:
        """A JSON Schema pattern no string matches (``"^a$"``, quotes and all) is a pattern
        like ``[^\\s\\S]``: the strings there are none, as for a validator; a gen's regex that
        nothing matches is an error."""
        if not self.ecma:
            raise self.fail(why, at)
        return (Branch(Chars(CharSet()), False, False),)

    def split_anchors(self, node: Node) -> list[Anchored]:
        """The pattern as alternatives (anchored at the start?, body, anchored at the end?)
        with the same search language: anchors may stand anywhere a regex engine allows them
        (`^$|(^[a-z]+$)`, `^(foo|^bar)$`, `(^a|b)c`). An anchor is satisfiable only where
        the text around it can be empty; combinations that cannot be are dropped."""
        if isinstance(node, Anchor):
            mode: Side = "m" if node.multiline else True
            return [(mode, EMPTY, False) if node.start else (False, EMPTY, mode)]
        if not _has_anchor(node):
            return [(False, node, False)]
        if isinstance(node, Alternation):
            out = [x for option in node.options for x in self.split_anchors(option)]
        elif isinstance(node, Concat):
            out = [(False, EMPTY, False)]
            for part in node.parts:
                try:
                    out = [
                        joined
                        for left in out
                        for right in self.split_anchors(part)
                        if (joined := join_anchored(left, right)) is not None
                    ]
                except Unsure:
                    raise self.fail(
                        "a multiline anchor ('(?m)') beside text that may or may not hold "
                        "the line break it asks for",
                        self.anchors[0],
                    ) from None
                self.check_anchored(out)
        else:
            assert isinstance(node, Repeat), node  # a Chars holds no anchor
            if node.hi == 1:  # x? = "" | x
                return self.split_anchors(Alternation((EMPTY, node.node)))
            out = self.split_repeat(node)
        self.check_anchored(out)
        return out

    def split_repeat(self, node: Repeat) -> list[Anchored]:
        """``x{lo,hi}`` with anchors inside ``x`` (``^(?:[a-z]+(?:,|$))+``): the iterations
        written out (x{lo,hi} = x^lo .. x^hi, for a count up to MAX_ANCHORED_REPEAT), or x^lo
        then x*. In x*, an iteration anchored at the start has only empty text before it and
        one anchored at the end only empty text after it, so those around them can be left
        out (a star may stop or start anywhere): x* is the plain iterations P*, or
        S P*, P* E, S P* E, SE (S, E, SE: x's alternatives anchored at the start, the end,
        both), each exact by ``join_anchored``."""
        parts = self.split_anchors(node.node)
        if any("m" in (s, e) for s, _, e in parts):
            raise self.fail("a multiline anchor ('(?m)') inside a repeated group", self.anchors[0])
        if node.hi is not None and node.hi > MAX_ANCHORED_REPEAT:
            raise self.fail(
                f"an anchor inside a group repeated more than {MAX_ANCHORED_REPEAT} times "
                "(a count of at most that, or unbounded)",
                self.anchors[0],
            )
        count = node.lo if node.hi is None else node.hi
        if node.hi is None:
            plain = [b for s, b, e in parts if not s and not e]
            loop: Node = EMPTY
            if plain:
                loop = Repeat(plain[0] if len(plain) == 1 else Alternation(tuple(plain)), 0, None)
            starts = [b for s, b, e in parts if s and not e]
            ends = [b for s, b, e in parts if e and not s]
            out: list[Anchored] = [(False, loop, False)]
            out += [(True, concat_nodes(b, loop), False) for b in starts]
            out += [(False, concat_nodes(loop, b), True) for b in ends]
            out += [
                (True, concat_nodes(concat_nodes(a, loop), b), True) for a in starts for b in ends
            ]
            out += [(True, b, True) for s, b, e in parts if s and e]
        else:
            out = []
        tail: list[Anchored] = [(False, EMPTY, False)]  # x^n
        for n in range(count + 1):
            if node.hi is not None and n >= node.lo:
                out += tail
            if n == count:
                break
            tail = [j for t in tail for p in parts if (j := join_anchored(t, p)) is not None]
            self.check_anchored(tail)
        if node.hi is None:  # x^lo then x*
            out = [j for t in tail for p in out if (j := join_anchored(t, p)) is not None]
        return out

    def without_assertions(self, node: Node) -> tuple[Branch, ...]:
        """The pattern of the strings in which ``node`` (with ``\\b``, ``\\B`` or lookbehinds)
        finds a match, as branches without them (``assertions.py``)."""
        try:
            branches = without_assertions(node)
        except (OverflowError, RecursionError) as e:
            raise self.fail(
                f"a word boundary or lookaround whose pattern's automaton is too large ({e})",
                self.asserts[0],
            ) from None
        out = tuple(  # a Python-dialect regex matches the whole string: no text around it
            Branch(_Parser(r.text, "python").alternation(), start, end)
            for start, r, end in branches
            if self.ecma or start and end
        )
        why = "a word boundary or lookaround no text can satisfy"
        return out or self.matches_nothing(why, self.asserts[0])

    def check_anchored(self, out: list[Anchored]) -> None:
        if len(out) > MAX_ANCHORED_BRANCHES:
            raise self.fail(
                f"anchors inside groups that expand to more than {MAX_ANCHORED_BRANCHES} "
                "alternatives",
                0,
            )

    def alternation(self) -> Node:
        options = [self.concat()]
        while self.peek() == "|":
            self.i += 1
            options.append(self.concat())
        return options[0] if len(options) == 1 else Alternation(tuple(options))

    def concat(self) -> Node:
        parts = []
        while self.i < len(self.src) and self.peek() not in "|)":
            parts.append(self.quantified())
        return parts[0] if len(parts) == 1 else Concat(tuple(parts))

    def quantified(self) -> Node:
        if self.quantifier(consume=False):
            raise self.fail("quantifier with nothing to repeat")
        start = self.i
        node = self.atom()
        bounds = self.quantifier()
        if bounds is None:
            return node
        if self.quantifier(consume=False):
            what = "possessive quantifier" if self.peek() == "+" else "repeated quantifier"
            raise self.fail(what)
        out = Repeat(node, *bounds)
        self.counted(out, start)
        return out

    def counted(self, node: Repeat, start: int) -> None:
        """Refuse counts llguidance cannot expand while decoding (``a{300000}``,
        ``(a{0,100}){0,100}``: "too many expressions constructed" at the first tokens):
        one count past MAX_REPEAT, or counts nested inside one another whose product passes
        MAX_NESTED_REPEAT (``*`` and ``+`` count as their minimum)."""
        count = node.hi if node.hi is not None else max(node.lo, 1)
        if count > MAX_REPEAT:
            raise self.fail(f"a repetition count over {MAX_REPEAT:,}", start)
        inner, stack = 1, [node.node]
        while stack:  # down to the nearest repetitions, whose products are known
            n = stack.pop()
            if isinstance(n, Repeat):
                inner = max(inner, self.products.get(id(n), 1))
            else:
                stack.extend(getattr(n, "parts", ()) or getattr(n, "options", ()))
                below = getattr(n, "node", None)
                if below is not None:
                    stack.append(below)
        self.products[id(node)] = count * inner
        if inner > 1 and count * inner > MAX_NESTED_REPEAT:
            raise self.fail(
                f"repetitions nested inside one another whose counts multiply past "
                f"{MAX_NESTED_REPEAT:,}",
                start,
            )

    def quantifier(self, consume: bool = True) -> tuple[int, int | None] | None:
        c = self.peek()
        if c and c in "*+?":
            end, bounds = self.i + 1, {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        elif c == "{" and (m := _BRACES.match(self.src, self.i)):
            lo_s, comma, hi_s = m.group(1), m.group(2), m.group(3)
            if not lo_s and (not comma or not hi_s or self.ecma):
                return None  # '{', '{}' and '{,}' are literals
            lo = int(lo_s or 0)
            hi = lo if not comma else (int(hi_s) if hi_s else None)
            if hi is not None and hi < lo:
                raise self.fail(f"quantifier {m.group(0)} with min > max")
            end, bounds = m.end(), (lo, hi)
        else:
            return None
        if consume:
            self.i = end + (
                self.src[end : end + 1] == "?"
            )  # lazy: same language when matching whole strings
        return bounds

    def atom(self) -> Node:
        c, start = self.peek(), self.i
        self.i += 1
        if c == "(" and self.src.startswith("?#", self.i):
            end = self.src.find(")", self.i)
            if end < 0:
                raise self.fail("unterminated comment group", start)
            self.i = end + 1
            return EMPTY
        if c == "(":
            return self.group(start)
        if c == "[":
            return Chars(self.char_class())
        if c == ".":
            return Chars(ANY_CHAR if "s" in self.flags else self.dot)
        if c == "\\":
            if self.peek() in ("A", "Z") or (not self.ecma and self.peek() == "z"):
                self.anchors.append(start)  # \A, \Z in a JSON Schema pattern: Python's anchors
                self.i += 1
                return ANCHOR_ESCAPES[self.src[self.i - 1]]  # type: ignore[return-value]  # a parse-time node (split_anchors removes it)
            if self.peek() == "G":
                raise self.fail("anchor '\\G'", start)
            if self.peek() in ("b", "B"):
                from lmprog.fsm.regex.assertions import WORD, Assert

                self.i += 1
                self.asserts.append(start)
                return Assert("boundary", WORD, self.src[start + 1] == "B", start)  # type: ignore[return-value]  # a parse-time node (split_anchors, without_assertions remove it)
            return Chars(self.cased(self.escape(in_class=False)))
        if c in "^$":
            self.anchors.append(start)
            self.multiline = self.multiline or "m" in self.flags
            return Anchor(c == "^", "m" in self.flags)  # type: ignore[return-value]  # a parse-time node (split_anchors, without_assertions remove it)
        return Chars(self.cased(CharSet.of(c)))

    def cased(self, chars: CharSet) -> CharSet:
        """``chars`` as the pattern matches them: case-insensitively under ``(?i)``."""
        return fold(chars) if "i" in self.flags else chars

    def group(self, start: int) -> Node:
        look: bool | str | None = None
        flags = self.flags
        if self.peek() == "?":
            self.i += 1
            scope = self.inline_flags(start)
            if scope == "rest":
                return EMPTY
            if scope is None:
                look = self.group_extension(start)
        self.depth += 1
        if self.depth > MAX_GROUP_DEPTH:
            raise self.fail(f"groups nested more than {MAX_GROUP_DEPTH} deep", start)
        node = self.alternation()
        self.depth -= 1
        if self.peek() != ")":
            raise self.fail("missing ')' for the group opened", start)
        self.i += 1
        self.flags = flags
        if isinstance(look, str):  # "behind" or "ahead"
            return self.one_character(node, look, start)
        return node if look is None else Look(node, look, start)  # type: ignore[return-value]  # a parse-time node (split_anchors, without_assertions remove it)

    def one_character(self, node: Node, kind: str, start: int) -> Node:
        """``(?<=X)``, ``(?<!X)`` with X one character class, and (where lookaheads are not
        read as ``Look``s) ``(?=X)``, ``(?!X)``: assertions (``assertions.py``)."""
        negative = self.src[start + (3 if kind == "behind" else 2)] == "!"
        if not isinstance(node, Chars) and kind == "behind":
            raise self.fail("lookbehind of other than one character class", start)
        self.asserts.append(start)
        if not isinstance(node, Chars):  # a longer lookahead: through the automaton too
            return Assert("lookahead", CharSet(), negative, start, node)  # type: ignore[return-value]  # a parse-time node (split_anchors, without_assertions remove it)
        return Assert(kind, node.chars, negative, start)  # type: ignore[return-value]  # a parse-time node (split_anchors, without_assertions remove it)

    def inline_flags(self, start: int) -> str | None:
        """Reads Python's inline flags: ``(?i-s)`` ("rest": for the rest of the enclosing group
        or pattern, as the ``regex`` module reads them anywhere and ``re`` at the pattern's
        start, where it allows them) or ``(?i-s:...)`` ("scoped": for the group, read on by the
        caller); None where the group is no flag group."""
        m = _FLAGS.match(self.src, self.i)
        if not m or not (m.group(1) or m.group(2) is not None):
            return None
        on, off, scoped = m.group(1), m.group(2) or "", m.group(3) == ":"
        for flag in on + off:
            if flag not in _FLAG_NAMES:
                raise self.fail(f"inline flag {flag!r} (only i, m, s and u are read)", start)
        self.flags = "".join(sorted((set(self.flags) | set(on)) - set(off)))
        self.i = m.end()
        return "scoped" if scoped else "rest"

    def group_extension(self, start: int) -> bool | str | None:
        """Skips a group's ``?...`` prefix; for a lookahead read as a ``Look``, whether it is
        negative; "behind" or "ahead" for a lookaround read as an assertion."""
        rest = self.src[self.i :]
        if rest.startswith(":"):
            self.i += 1
            return None
        if self.lookahead and rest[:1] in ("=", "!"):
            self.i += 1
            return rest[0] == "!"
        if rest[:2] in ("<=", "<!") or rest[:1] in ("=", "!"):
            self.i += 1 + (rest[0] == "<")
            return "behind" if rest[0] == "<" else "ahead"
        named = re.match(r"(P?<)([A-Za-z_][A-Za-z0-9_]*)>", rest)
        if named and not (self.ecma and named.group(1) == "P<"):
            self.i += named.end()
            return None
        for prefix, what in (
            ("P=", "backreference"),
            ("(", "conditional group"),
            (">", "atomic group"),
        ):
            if rest.startswith(prefix):
                raise self.fail(f"{what} '(?{prefix}'", start)
        raise self.fail("an unknown group extension '(?'", start)

    def char_class(self) -> CharSet:
        start = self.i - 1
        if self.ecma and _java_intersection(self.src, self.i):
            return self.java_class(start)
        negated = self.peek() == "^"
        self.i += negated
        members = CharSet()
        first = True
        while True:
            c = self.peek()
            if not c:
                raise self.fail("unterminated character class", start)
            if c == "]" and not (first and not self.ecma):
                self.i += 1
                break
            members = members | self.class_item()
            first = False
        members = self.cased(members)
        return ANY_CHAR - members if negated else members

    def java_class(self, start: int) -> CharSet:
        """A class of Java's syntax (java.util.regex: ``[a-z&&[^aeiou]]``, ``&&`` intersects,
        a nested ``[...]`` is a union member) in a JSON Schema pattern, as CloudFormation's
        resource schemas (written for a Java validator) use it: read where a class holds
        ``&&`` and a nested class, which ECMA-262 with the ``u`` flag JSON Schema asks for
        refuses (the nested class's ``]`` closes the outer one, leaving a lone ``]``); a
        ``&&`` without a nested class (``[a-z&&aeiou]``: two '&' in ECMA, an intersection in
        Java) is refused as ambiguous."""
        members, nested = self.java_operands(start)
        if not nested:
            raise self.fail(
                "'&&' in a character class without a nested class (Java intersects, ECMA-262 "
                "reads two '&'); write the intersection as [a-z&&[aeiou]] or the characters "
                "with one '&'",
                start,
            )
        if "i" in self.flags:
            raise self.fail("Java's class intersection '&&' under the 'i' flag", start)
        return members

    def java_operands(self, start: int) -> tuple[CharSet, bool]:
        """The members of one Java class, read after its ``[``, and whether it held a nested
        class."""
        negated = self.peek() == "^"
        self.i += negated
        operands: list[CharSet] = []
        union: CharSet | None = None
        nested = False
        while (c := self.peek()) != "]":
            at = self.i
            if not c:
                raise self.fail("unterminated character class", start)
            if self.src.startswith("&&", at):
                self.i += 2
                if union is None or self.peek() in ("]", "&"):
                    raise self.fail("an empty operand of '&&' in a character class", at)
                operands.append(union)
                union = None
                continue
            if c == "[":
                self.i += 1
                part, _ = self.java_operands(at)
                nested = True
            else:
                part = self.class_item()
            union = part if union is None else union | part
        self.i += 1
        if union is None:
            raise self.fail("an empty character class in a Java class", start)
        if negated and operands:  # Java 8 negates the first operand, 9 on the whole class
            raise self.fail("a negated class holding '&&' (write [^...] as a nested class)", start)
        members = union
        for operand in operands:
            members = members & operand
        return (ANY_CHAR - members if negated else members), nested

    def class_item(self) -> CharSet:
        start = self.i
        low = self.class_atom()
        if self.peek() != "-" or self.peek(1) in ("]", ""):
            return low
        self.i += 1
        high = self.class_atom()
        if (low.size() != 1 or high.size() != 1) and self.ecma:
            return low | CharSet.of("-") | high  # [\w-.]: ECMA's Annex B and ``regex`` read '-'
        if low.size() != 1 or high.size() != 1:
            raise self.fail("character class escape used as a range endpoint", start)
        a, b = low.ranges[0][0], high.ranges[0][0]
        if a > b:
            raise self.fail("character range out of order", start)
        return CharSet(((a, b),))

    def class_atom(self) -> CharSet:
        c = self.peek()
        self.i += 1
        if c == "\\":
            return self.escape(in_class=True)
        if c == "[" and not self.ecma and self.peek() == ":":
            raise self.fail("POSIX character class '[:'", self.i - 1)
        return CharSet.of(c)

    def escape(self, in_class: bool) -> CharSet:
        start = self.i - 1
        c = self.peek()
        if not c:
            raise self.fail("trailing backslash", start)
        self.i += 1
        if c.lower() in self.classes:
            base = self.classes[c.lower()]
            return ANY_CHAR - base if c.isupper() else base
        if c in _SIMPLE:
            return CharSet.of(_SIMPLE[c])
        if c == "b" and in_class:
            return CharSet.of("\b")
        if c == "a" and not self.ecma:
            return CharSet.of("\a")
        if c == "x":
            return self.hex_escape(2, start)
        if c == "u":
            return self.unicode_escape(start)
        if c == "U" and not self.ecma:
            return self.hex_escape(8, start)
        if c == "c" and self.ecma and self.peek().isascii() and self.peek().isalpha():
            self.i += 1
            return CharSet.of(chr(ord(self.src[self.i - 1]) % 32))
        if c == "0" or (c.isdigit() and in_class and not self.ecma):
            return self.octal_escape(c, start)
        if c.isdigit() or c == "k":
            raise self.fail(f"backreference '\\{c}'", start)
        if c in "bB":
            raise self.fail(f"word boundary '\\{c}'", start)
        if c in "AZzG":
            where = "inside a character class" if in_class else "in this regex dialect"
            raise self.fail(f"anchor '\\{c}' {where}", start)
        if c in "pP":
            return self.property_class(c, start)
        if c.isascii() and c.isalnum():
            raise self.fail(f"unknown escape '\\{c}'", start)
        return CharSet.of(c)

    def property_class(self, c: str, start: int) -> CharSet:
        m = re.match(r"\{([A-Za-z_]+)\}", self.src[self.i :])
        name = m.group(1) if m else ""
        if m and name in POSIX_CLASSES:
            self.i += m.end()
            return ANY_CHAR - POSIX_CLASSES[name] if c == "P" else POSIX_CLASSES[name]
        name = CATEGORY_NAMES.get(name, name)
        if not m or not (len(name) in (1, 2) and name[0] in CATEGORY_NAMES.values()):
            raise self.fail(
                f"Unicode property class '\\{c}' (only general categories such as "
                "\\p{L} or \\p{Letter}, and Java's POSIX classes such as \\p{Graph}, "
                "are supported)",
                start,
            )
        self.i += m.end()
        members = unicode_category(name)
        if members.is_empty():
            raise self.fail(f"unknown Unicode general category {name!r}", start)
        return ANY_CHAR - members if c == "P" else members

    def hex_escape(self, width: int, start: int) -> CharSet:
        digits = self.src[self.i : self.i + width]
        if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
            raise self.fail(f"malformed escape (expected {width} hex digits)", start)
        self.i += width
        cp = int(digits, 16)
        if cp > MAX_CP:
            raise self.fail("code point out of range", start)
        return CharSet(((cp, cp),))

    def unicode_escape(self, start: int) -> CharSet:
        if self.ecma and self.peek() == "{":
            m = re.match(r"\{([0-9a-fA-F]{1,6})\}", self.src[self.i :])
            if not m or int(m.group(1), 16) > MAX_CP:
                raise self.fail("malformed '\\u{...}' escape", start)
            self.i += m.end()
            cp = int(m.group(1), 16)
            return CharSet(((cp, cp),))
        high = self.hex_escape(4, start).ranges[0][0]
        low_m = re.match(r"\\u([dD][c-fC-F][0-9a-fA-F]{2})", self.src[self.i :])
        if 0xD800 <= high <= 0xDBFF and low_m:
            self.i += low_m.end()
            cp = 0x10000 + ((high - 0xD800) << 10) + (int(low_m.group(1), 16) - 0xDC00)
            return CharSet(((cp, cp),))
        if 0xD800 <= high <= 0xDFFF:
            raise self.fail("lone surrogate escape", start)
        return CharSet(((high, high),))

    def octal_escape(self, first: str, start: int) -> CharSet:
        if self.ecma:
            if self.peek().isdigit():
                raise self.fail("octal escape", start)
            return CharSet.of("\0")
        m = re.match(r"[0-7]{0,2}", self.src[self.i :])
        assert m is not None  # (it matches "" at least)
        self.i += m.end()
        return CharSet.of(chr(int(first + m.group(0), 8)))
