"""How much stack llguidance's Lark compiler needs for a grammar, bounded before it runs.

    compile_stack_bytes(lark_text) -> int     an upper bound, in bytes
    check_compile_stack(lark_text) -> bool    True: compile it on_deep_stack; ConstraintError
                                              past what even that stack holds
    on_deep_stack(fn, *args)                  fn(*args) on lmprog's deep-compile thread

llguidance compiles rules recursively, so a long chain of rules would overflow a thread's
stack (SIGSEGV, which no Python code can catch): every grammar is measured here first, as the
longest path over its graph of references. A grammar within MAX_COMPILE_STACK compiles on the
caller's thread; one whose rule chains need more (a large real schema such as Renovate's
configuration, ~450 rules deep) compiles on a thread of DEEP_STACK bytes, as long as its
terminals alone stay within MAX_COMPILE_STACK: a terminal's regex is also derived as text is
lexed, on whichever thread computes a mask, while the rule graph is walked only by the
compile. Design: docs/design/constraints.md.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from lmprog.core.errors import ConstraintError

_T = TypeVar("_T")

# Stack bytes per frame, measured on llguidance 1.9.1 (a chain of rules crashes a 1 MiB
# thread between 300 and 400 levels: ~2.9 KB a rule; 15 rules of 28 nested groups pass,
# 20 do not: ~1.8 KB a group; a chain of terminals between 400 and 500: ~2.3 KB a terminal),
# rounded up
RULE_FRAME = 4096
GROUP_FRAME = 2560
TERMINAL_FRAME = 3072
BASE_FRAMES = 64 * 1024  # the compile's own frames below the first rule, and the regex compiler
# The most one grammar's compile may use: half the smallest default thread stack (glibc's
# 2 MiB where RLIMIT_STACK is unlimited), so that the caller's own frames fit beside it
MAX_COMPILE_STACK = 1 << 20
# The deep-compile thread's stack (address space: pages are touched only as deep as a compile
# goes), and the most a compile on it may use (half, as above)
DEEP_STACK = 64 << 20
MAX_DEEP_COMPILE_STACK = DEEP_STACK // 2

_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t]+|(?:\#|//)[^\n]*)
  | (?P<nl>(?:\r?\n)+[ \t]*)
  | (?P<string>"(?:\\(?:["\\/bfnrt]|u[a-fA-F0-9]{4}|x[a-fA-F0-9]{2})|[^"\\\x00-\x1f\x7f])*"i?)
  | (?P<regex>/(?:\\.|[^/\\])+/[imslux]*)
  | (?P<kwvalue>%json|%llguidance|%regex)
  | (?P<lark>%lark)
  | (?P<kw>%[a-z]+)
  | (?P<rule>!?[_?]?[a-z][_a-z0-9\-]*)
  | (?P<term>_?[A-Z][_A-Z0-9\-]*)
  | (?P<open>[(\[])
  | (?P<close>[)\]])
  | (?P<lbrace>\{)
  | (?P<rbrace>\})
  | (?P<vbar>\|)
  | (?P<colon>::|:)
  | (?P<arrow>->)
  | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)
_JSON = json.JSONDecoder()


class _Unreadable(Exception):
    """A text this lexer cannot follow (measured conservatively instead)."""


def check_compile_stack(lark: str) -> bool:
    """Whether compiling `lark` in llguidance needs the deep-compile thread (`on_deep_stack`):
    its rule chains need more than MAX_COMPILE_STACK bytes of stack. ConstraintError if they
    need more than MAX_DEEP_COMPILE_STACK, or its terminals alone more than MAX_COMPILE_STACK
    (they refer to one another too deeply)."""
    need = compile_stack_bytes(lark)
    if need <= MAX_COMPILE_STACK:
        return False
    _refuse(compile_stack_bytes(lark, rule_frame=0), "terminals")
    _refuse(need, "rules", MAX_DEEP_COMPILE_STACK)
    return True


def _refuse(need: int, what: str = "rules", limit: int = MAX_COMPILE_STACK) -> None:
    if need > limit:
        name = "MAX_COMPILE_STACK" if limit == MAX_COMPILE_STACK else "MAX_DEEP_COMPILE_STACK"
        raise ConstraintError(
            f"the grammar nests too deeply to compile safely: its chains of {what} referring "
            f"to {what} need about {need // 1024:,} KiB of stack (limit {limit // 1024:,} "
            f"KiB, lmprog.fsm.grammar_depth.{name}); flatten the grammar (fewer {what} each "
            "referring to the next)"
        )


_deep_lock = threading.Lock()
_deep_pool: ThreadPoolExecutor | None = None


def on_deep_stack(fn: Callable[..., _T], *args: object) -> _T:
    """fn(*args) on lmprog's deep-compile thread (one, of DEEP_STACK bytes, started on first
    use); the caller waits for it (llguidance's compile releases the GIL)."""
    global _deep_pool
    with _deep_lock:
        if _deep_pool is None:
            # threading.stack_size is the process's setting for threads started after it:
            # the pool's one thread is started here, under it
            before = threading.stack_size(DEEP_STACK)
            try:
                pool = ThreadPoolExecutor(1, thread_name_prefix="lmprog-deep-compile")
                pool.submit(int).result()
            finally:
                threading.stack_size(before)
            _deep_pool = pool
    return _deep_pool.submit(fn, *args).result()


def check_rule_graph(refs: dict[str, list[str]], root: str) -> None:
    """The same bound over a grammar given as its rules' references (rule -> the rules it
    names), one rule frame an edge: checked on a GBNF grammar before it is converted to Lark
    (the conversion's passes grow with the longest chain of rules)."""
    edges = {a: [(b, RULE_FRAME) for b in bs if b in refs] for a, bs in refs.items()}
    _refuse(BASE_FRAMES + _longest(edges, [root] if root in refs else []))


def compile_stack_bytes(lark: str, rule_frame: int = RULE_FRAME) -> int:
    """An upper bound of the stack llguidance's compile of `lark` uses (bytes); rule_frame=0:
    that of its terminals' chains alone."""
    try:
        tokens = _lex(lark)
    except _Unreadable:
        return _conservative(lark)
    return _measure(tokens, rule_frame)


def _lex(text: str) -> list[tuple[str, str]]:
    out, pos, n = [], 0, len(text)
    while pos < n:
        m = _TOKEN.match(text, pos)
        assert m is not None  # `other` matches any character
        kind, value = m.lastgroup, m.group()
        assert kind is not None  # every alternative of _TOKEN is a named group
        pos = m.end()
        if kind == "ws":
            continue
        if kind == "kwvalue":  # a JSON value follows: skipped as llguidance reads it
            while pos < n and text[pos] in " \t\r\n":
                pos += 1
            try:
                _, pos = _JSON.raw_decode(text, pos)
            except ValueError:
                raise _Unreadable from None
            out.append(("value", value))
            continue
        out.append((kind, value))
    return out


def _measure(tokens: list[tuple[str, str]], rule_frame: int = RULE_FRAME) -> int:
    """The bound over one grammar (and, apart, each nested %lark grammar in it)."""
    defs: dict[str, list[tuple[str, int]]] = {}  # name -> [(referred name, nesting)]
    frames: dict[str, int] = {}  # name -> the frame of its kind
    roots: list[tuple[str, int]] = [("start", 0)]
    nested: list[list[tuple[str, str]]] = []
    for item in _items(tokens):
        head = item[0]
        body, at = _body(item)
        refs = _refs(body, nested)
        if head[0] in ("rule", "term") and at is not None:
            name = head[1].lstrip("!?")
            defs.setdefault(name, []).extend(refs)
            frames[name] = rule_frame if head[0] == "rule" else TERMINAL_FRAME
        elif head == ("kw", "%ignore"):
            defs.setdefault("%ignore", []).extend(refs)
            frames["%ignore"] = 0
            roots.append(("%ignore", 0))
        else:  # %import, %declare, %override ...: every name it holds may be compiled
            defs.setdefault("%other", []).extend(refs)
            frames["%other"] = rule_frame
            roots.append(("%other", 0))
    edges = {
        a: [(b, frames[a] + GROUP_FRAME * depth) for b, depth in refs if b in defs]
        for a, refs in defs.items()
    }
    own = max((_measure(t, rule_frame) for t in nested), default=0)
    return max(own, BASE_FRAMES + _longest(edges, [r for r, _ in roots if r in defs]))


def _items(tokens: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The tokens split into items: a newline ends one unless a `|` follows it (outside a
    %lark block, whose braces may hold newlines)."""
    items: list[list[tuple[str, str]]] = [[]]
    braces = 0
    for i, (kind, value) in enumerate(tokens):
        if kind == "lbrace":
            braces += 1
        elif kind == "rbrace":
            braces = max(0, braces - 1)
        if kind == "nl" and braces == 0:
            following = tokens[i + 1][0] if i + 1 < len(tokens) else None
            if following != "vbar" and items[-1]:
                items.append([])
            continue
        items[-1].append((kind, value))
    return [it for it in items if it]


def _body(item: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], int | None]:
    """The tokens after the definition's colon (the whole item if it has none), and the
    colon's position."""
    depth = 0
    for i, (kind, value) in enumerate(item):
        if kind == "open":
            depth += 1
        elif kind == "close":
            depth -= 1
        elif kind == "colon" and value == ":" and depth == 0:
            return item[i + 1 :], i
    return item, None


def _refs(
    body: list[tuple[str, str]], nested: list[list[tuple[str, str]]]
) -> list[tuple[str, int]]:
    """(name, groups around it) of each name in a body; %lark blocks go to `nested`."""
    out, depth, i = [], 0, 0
    while i < len(body):
        kind, value = body[i]
        if kind == "lark":
            j, braces = i + 1, 0
            while j < len(body):
                braces += {"lbrace": 1, "rbrace": -1}.get(body[j][0], 0)
                if braces == 0:
                    break
                j += 1
            inner = [t if t[0] != "nl" else ("nl", "\n") for t in body[i + 2 : j]]
            nested.append(inner)
            i = j + 1
            continue
        if kind == "open":
            depth += 1
        elif kind == "close":
            depth = max(0, depth - 1)
        elif kind in ("rule", "term"):
            out.append((value.lstrip("!?"), depth))
        i += 1
    return out


def _longest(edges: dict[str, list[tuple[str, int]]], roots: list[str]) -> int:
    """The heaviest simple path from a root, bounded over strongly connected components."""
    comp = _components(edges)
    inner: dict[int, int] = {}
    for a, out in edges.items():
        heaviest = max((w for b, w in out if comp[b] == comp[a]), default=0)
        inner[comp[a]] = inner.get(comp[a], 0) + heaviest
    exits: dict[int, list[tuple[int, int]]] = {}
    for a, out in edges.items():
        for b, w in out:
            if comp[b] != comp[a]:
                exits.setdefault(comp[a], []).append((comp[b], w))
    # components come out of Tarjan's algorithm in reverse topological order: each one's
    # successors are done before it
    best: dict[int, int] = {}
    for c in sorted(set(comp.values())):
        best[c] = inner.get(c, 0) + max((w + best[d] for d, w in exits.get(c, ())), default=0)
    return max((best[comp[r]] for r in roots), default=0)


def _components(edges: dict[str, list[tuple[str, int]]]) -> dict[str, int]:
    """Tarjan's strongly connected components, iteratively; numbered in reverse topological
    order (a component's successors have smaller numbers)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    comp: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    counter = found = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            out = edges.get(node, [])
            if i < len(out):
                work.append((node, i + 1))
                nxt = out[i][0]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp[top] = found
                    if top == node:
                        break
                found += 1
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return comp


def _conservative(lark: str) -> int:
    """Every name-like word a nested reference: a bound for a text the lexer cannot follow."""
    names = len(re.findall(r"[A-Za-z_][\w\-]*", lark))
    return BASE_FRAMES + names * (RULE_FRAME + 30 * GROUP_FRAME)
