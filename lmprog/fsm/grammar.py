"""EBNF grammars: the GBNF dialect of llama.cpp's grammars and SGLang's `ebnf` parameter.

    ebnf_to_lark(text) -> str      the grammar in llguidance's Lark syntax

    root   ::= object                       rules `name ::= alternatives`, `root` is the start
    object ::= "{" ws pair ("," ws pair)* "}"
    pair   ::= string ":" ws value          "literal" strings, [a-z] / [^"\\] classes,
    ws     ::= [ \\t\\n]*                      ( ) grouping, | * + ? {m,n} repetition, # comments

A grammar already in Lark syntax is taken as it is. The syntax, undefined rules, a missing
`root` and a `root` that can never finish raise ConstraintError before any token is spent.
Design: docs/design/constraints.md.
"""

from __future__ import annotations

from typing import Any

from lmprog.core.errors import ConstraintError
from lmprog.fsm.fixpoint import finite_nodes
from lmprog.fsm.grammar_depth import check_rule_graph

MAX_GRAMMAR_CHARS = 1_000_000  # the size of grammar text one constraint may hand over
# GBNF rules of one grammar: the converter to Lark (llguidance's, in Python) marks rules that
# are terminals pass after pass, each pass over every rule, as many passes as the longest chain
# of rules (itself bounded by grammar_depth): ~2 s at this many rules
MAX_RULES = 5_000


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
    refs = _check_rules(rules)
    try:
        return _to_lark(gbnf, rules, refs)
    except Exception as exc:  # noqa: BLE001 - the converter raises bare Exceptions for grammar errors
        raise ConstraintError(f"invalid EBNF grammar: {exc}") from None


def _to_lark(gbnf: Any, rules: dict[str, Any], refs: dict[str, list[str]]) -> str:
    """llguidance's `gbnf_to_lark` over the rules parsed already, handed to its `resolve`
    each after the rules it names: resolve marks a rule a terminal once every rule it names
    is one, pass after pass over the rules until a pass marks none, so in the written order a
    chain of n rules took n passes over every rule (17 s for 4,000 rules); in this order, two.
    The text lists the rules as written, as gbnf_to_lark does."""
    written = {id(rule): i for i, rule in enumerate(rules.values())}
    ordered = {name: rules[name] for name in _named_first(refs)}
    gbnf.resolve(ordered)
    out, prev_nl = "%llguidance {}\n\n", True
    for rule in sorted(ordered.values(), key=lambda r: written[id(r)]):
        text = str(rule)
        if not prev_nl and "\n" in text:
            out += "\n"
        out += text + "\n"
        prev_nl = "\n" in text
        if prev_nl:
            out += "\n"
    return out


def _named_first(refs: dict[str, list[str]]) -> list[str]:
    """The rules in depth-first post-order: each after the rules it names (cycles aside)."""
    out: list[str] = []
    seen: set[str] = set()
    for root in refs:
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(refs[root]))]
        while stack:
            name, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                out.append(name)
            elif child not in seen:
                seen.add(child)
                stack.append((child, iter(refs[child])))
    return out


def _check_rules(rules: dict[str, Any]) -> dict[str, list[str]]:
    """Refuse what llguidance would take but never finish; the rules each rule names."""
    if "root" not in rules:
        raise ConstraintError(
            "the EBNF grammar has no `root` rule (the start symbol): add `root ::= ...`"
        )
    if len(rules) > MAX_RULES:
        raise ConstraintError(
            f"the grammar has {len(rules):,} rules, over the limit of {MAX_RULES:,}"
        )
    refs = {name: _refs(rule.alternatives) for name, rule in rules.items()}
    for name, named in refs.items():
        for ref in named:
            if ref not in rules:
                raise ConstraintError(
                    f"invalid EBNF grammar: rule {ref!r} is used in {name!r} but never defined"
                )
    check_rule_graph(refs, "root")
    productive = _productive(rules)
    if "root" not in productive:
        stuck = sorted(n for n in rules if n not in productive)
        raise ConstraintError(
            "the grammar's language is empty: `root` can never finish (every derivation "
            f"recurses forever); rules that never end: {', '.join(stuck)}"
        )
    return refs


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
    """The rules that derive at least one finite string (`fixpoint.finite_nodes`: linear in
    the grammar; passes over every rule took minutes at 12,500 rules)."""

    def parts(node: Any) -> list[Any]:
        kind = type(node).__name__
        if kind == "RuleRefNode":
            return [rules[node.name].alternatives]
        if kind == "SequenceNode":
            return list(node.nodes)
        if kind == "AlternativeNode":
            return list(node.alternatives)
        if kind == "RepetitionNode" and node.min_times > 0:
            return [node.node]
        return []  # a literal, a character class, an optional repetition

    def need(node: Any, its_parts: list[Any]) -> int:
        if type(node).__name__ == "SequenceNode":
            return len(its_parts)
        return min(1, len(its_parts))

    done = finite_nodes((rule.alternatives for rule in rules.values()), parts, need)
    return {name for name, rule in rules.items() if id(rule.alternatives) in done}
