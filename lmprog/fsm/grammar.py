"""EBNF grammars: the GBNF dialect of llama.cpp's grammars and SGLang's `ebnf` parameter.

    ebnf_to_lark(text) -> str      the grammar in llguidance's Lark syntax (its Earley parser
                                   over a lazy lexer runs it: recursion at any depth)

    root   ::= object                       rules `name ::= alternatives`, `root` is the start
    object ::= "{" ws pair ("," ws pair)* "}"
    pair   ::= string ":" ws value          "literal" strings, [a-z] / [^"\\] classes,
    ws     ::= [ \\t\\n]*                      ( ) grouping, | * + ? {m,n} repetition, # comments

A grammar already in Lark syntax (a `start:` rule, or `%llguidance`) is taken as it is.

Checked here, before any token is spent (ConstraintError naming the rule or the position):
the syntax, rules used but not defined, a missing `root`, and a language with nothing in it
-- a `root` that can never finish (every derivation recurses forever, as in
`root ::= "a" root`) -- which llguidance would otherwise accept and then never allow EOS.
"""

from __future__ import annotations

from typing import Any

from lmprog.core.errors import ConstraintError

MAX_GRAMMAR_CHARS = 1_000_000  # the size of grammar text one constraint may hand over


def ebnf_to_lark(text: str) -> str:
    """The Lark text of a GBNF grammar (or a Lark grammar, unchanged); ConstraintError if the
    grammar is malformed or its language is empty."""
    if not isinstance(text, str):
        raise TypeError(f"an EBNF grammar must be a str, got {type(text).__name__}")
    if not text.strip():
        raise ConstraintError("the EBNF grammar is empty: it needs at least a `root ::= ...` rule")
    if len(text) > MAX_GRAMMAR_CHARS:
        raise ConstraintError(
            f"the grammar has {len(text):,} characters, over the limit of {MAX_GRAMMAR_CHARS:,}"
        )
    try:
        from llguidance import gbnf_to_lark as gbnf
    except ImportError as exc:
        raise ConstraintError(f"grammars need llguidance ({exc})") from None
    if gbnf.is_lark_syntax(text):
        return text
    try:
        rules = gbnf.GrammarParser().parse(text)
    except gbnf.GbnfToLarkError as exc:
        raise ConstraintError(f"invalid EBNF grammar: {exc}") from None
    except RecursionError:
        raise ConstraintError("invalid EBNF grammar: nested too deeply to parse") from None
    _check_rules(rules)
    try:
        return gbnf.gbnf_to_lark(text)
    except Exception as exc:  # noqa: BLE001 - the converter raises bare Exceptions for grammar errors
        raise ConstraintError(f"invalid EBNF grammar: {exc}") from None


def _check_rules(rules: dict[str, Any]) -> None:
    if "root" not in rules:
        raise ConstraintError(
            "the EBNF grammar has no `root` rule (the start symbol): add `root ::= ...`"
        )
    for name, rule in rules.items():
        for ref in _refs(rule.alternatives):
            if ref not in rules:
                raise ConstraintError(
                    f"invalid EBNF grammar: rule {ref!r} is used in {name!r} but never defined"
                )
    productive = _productive(rules)
    if "root" not in productive:
        stuck = sorted(n for n in rules if n not in productive)
        raise ConstraintError(
            "the grammar's language is empty: `root` can never finish (every derivation "
            f"recurses forever); rules that never end: {', '.join(stuck)}"
        )


def _refs(node: Any) -> list[str]:
    """Names of the rules a node refers to (iteratively: grammars may nest deeply)."""
    out, stack = [], [node]
    while stack:
        cur = stack.pop()
        if type(cur).__name__ == "RuleRefNode":
            out.append(cur.name)
        stack.extend(cur.children())
    return out


def _productive(rules: dict[str, Any]) -> set[str]:
    """The rules that derive at least one finite string (a least fixpoint)."""
    done: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, rule in rules.items():
            if name not in done and _derives(rule.alternatives, done):
                done.add(name)
                changed = True
    return done


def _derives(node: Any, productive: set[str]) -> bool:
    kind = type(node).__name__
    if kind == "RuleRefNode":
        return node.name in productive
    if kind == "SequenceNode":
        return all(_derives(n, productive) for n in node.nodes)
    if kind == "AlternativeNode":
        return any(_derives(n, productive) for n in node.alternatives)
    if kind == "RepetitionNode":
        return node.min_times == 0 or _derives(node.node, productive)
    return True  # a literal or a character class
