"""Schema documents to nodes: keywords, in-place applicators, references and unevaluated*.

A schema object is the intersection of its type terms (``facets``), ``enum``/``const`` and
``allOf``/``$ref``/``dependent*`` parts, with its ``anyOf``, ``oneOf``, ``not`` and
``if``/``then``/``else``; then ``unevaluated*`` apply. A recursive reference becomes a ``RefT``
(a grammar rule); where the algebra must look inside one it raises ``Unroll`` and the schema is
built again, unrolled ``max_recursion_depth`` times. Design: docs/design/json-schema.md.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from lmprog.core.errors import ConstraintError
from lmprog.fsm.json_schema.read import facets, keywords
from lmprog.fsm.json_schema.read.facets import SchemaDict, Sub
from lmprog.fsm.json_schema.read.refs import Registry
from lmprog.fsm.json_schema.terms.algebra import conj, conj_all, normalize_arr, normalize_obj
from lmprog.fsm.json_schema.terms.complement import neg, one_of
from lmprog.fsm.json_schema.terms.nodes import (
    FULL_TERMS,
    NEVER,
    TOP,
    ArrT,
    Bodies,
    KeyRule,
    Node,
    ObjT,
    RefT,
    Unroll,
    charge,
    expand,
    make_node,
    union,
)

log = logging.getLogger(__name__)
_OLD_DRAFT = re.compile(r"json-schema\.org/draft-0[3-7]/schema")
_SERIAL = itertools.count()  # RefT keys of one compile never equal another's (cached algebra)


class Builder:
    def __init__(
        self,
        root: object,
        max_recursion_depth: int,
        unroll: bool = False,
        registry: Registry | None = None,
    ) -> None:
        self.registry = registry or Registry(root)
        self.max_depth = max_recursion_depth
        self.unroll = unroll
        self.cut = False  # a reference was left empty at the recursion bound (unroll)
        self.active: dict[tuple[Any, ...], int] = {}  # target key -> expansions in progress
        self.memo: dict[Hashable, Node] = {}
        self.bodies: Bodies = {}  # RefT key -> the node of its schema
        self._serial = next(_SERIAL)
        # Drafts 3 to 7: "$ref" replaces the schema it is in (its siblings are ignored)
        self.ref_alone = isinstance(root, dict) and bool(
            _OLD_DRAFT.search(str(root.get("$schema")))
        )

    def build_root(self, document: object) -> Node:
        """The node of the whole document (``$ref: "#"`` inside it is a RefT to it)."""
        return self._expand(document, self.registry.base_of(document, ""), "#")

    def build(self, schema: object, base: str = "", path: str = "#") -> Node:
        charge()
        if schema is True:
            return TOP
        if schema is False:
            return NEVER
        if not isinstance(schema, dict):
            raise ConstraintError(f"invalid schema: expected an object or a boolean at {path}")
        base = self.registry.base_of(schema, base)
        if self.ref_alone and "$ref" in schema:
            return self._ref(schema["$ref"], base, f"{path}/$ref")
        self._check_keywords(schema, path)
        sub = lambda s, suffix: self.build(s, base, path + suffix)
        node = facets.typed_terms(schema, path, sub)
        values, applied = self._values(schema, path), self._applicators(schema, base, path, sub)
        # a $ref's terms first: its declared properties come before the sibling ones (the
        # order llguidance writes), then allOf's and the others' after them
        referenced = self._ref(schema["$ref"], base, f"{path}/$ref") if "$ref" in schema else TOP
        with self.at(path):
            node = conj(referenced, conj(conj(node, values), applied))
            return self._unevaluated(schema, node, path, sub)

    def _check_keywords(self, schema: SchemaDict, path: str) -> None:
        for key in schema:
            if key not in keywords.KNOWN:
                log.debug(
                    "JSON schema: unknown keyword %r at %s ignored (an annotation)", key, path
                )

    @contextmanager
    def at(self, path: str) -> Iterator[None]:
        """Name the schema location in errors raised by set operations."""
        try:
            yield
        except ConstraintError as e:
            if " at #" in str(e):
                raise
            raise ConstraintError(f"{e} at {path}") from None

    def _values(self, schema: SchemaDict, path: str) -> Node:
        node = TOP
        if "const" in schema:
            node = facets.value_node(schema["const"])
        if "enum" in schema:
            if not isinstance(schema["enum"], list):
                raise ConstraintError(f"invalid schema: enum must be a list at {path}/enum")
            node = conj(node, union(*(facets.value_node(v) for v in schema["enum"])))
        return node

    def _applicators(self, schema: SchemaDict, base: str, path: str, sub: Sub) -> Node:
        parts = []
        for key in ("allOf", "anyOf", "oneOf"):
            if key in schema:
                branches = self._list(schema, key, path, sub)
                with self.at(f"{path}/{key}"):
                    parts.append(
                        {"allOf": conj_all, "anyOf": lambda b: union(*b), "oneOf": one_of}[key](
                            branches
                        )
                    )
        if "not" in schema:
            inner = sub(schema["not"], "/not")
            with self.at(f"{path}/not"):
                parts.append(neg(inner))
        if "if" in schema and ("then" in schema or "else" in schema):
            parts.append(self._conditional(schema, path, sub))
        elif "if" in schema and ("unevaluatedProperties" in schema or "unevaluatedItems" in schema):
            parts.append(self._annotating_if(sub(schema["if"], "/if")))
        for key in ("$dynamicRef", "$recursiveRef"):
            if key in schema:
                parts.append(self._ref(schema[key], base, f"{path}/{key}", dynamic=key))
        parts += self._dependencies(schema, path, sub)
        return conj_all(parts)

    def _list(self, schema: SchemaDict, key: str, path: str, sub: Sub) -> list[Node]:
        value = schema[key]
        if not isinstance(value, list) or not value:
            raise ConstraintError(f"invalid schema: {key} must be a non-empty list at {path}/{key}")
        return [sub(s, f"/{key}/{i}") for i, s in enumerate(value)]

    def _conditional(self, schema: SchemaDict, path: str, sub: Sub) -> Node:
        cond = sub(schema["if"], "/if")
        then = sub(schema["then"], "/then") if "then" in schema else TOP
        other = sub(schema["else"], "/else") if "else" in schema else TOP
        with self.at(f"{path}/if"):
            return union(conj(cond, then), conj(neg(cond), other))

    @staticmethod
    def _annotating_if(cond: Node) -> Node:
        """``if`` alone asserts nothing, but when it holds its annotations count for unevaluated*:
        ``cond | !cond`` keeps them on the ``cond`` side (or nothing, if ``cond`` has no exact
        complement; unevaluated* then sees fewer evaluated keys, which only narrows)."""
        try:
            return union(cond, neg(cond))
        except ConstraintError:
            return TOP

    def _ref(self, ref: object, base: str, path: str, dynamic: str = "") -> Node:
        if not isinstance(ref, str):
            raise ConstraintError(f"invalid schema: {dynamic or '$ref'} must be a string at {path}")
        with self.at(path):
            if dynamic:
                target, target_base = self.registry.resolve_dynamic(
                    ref, base, dynamic == "$recursiveRef"
                )
            else:
                target, target_base = self.registry.resolve(ref, base)
        return self._expand(target, target_base, path)

    def _expand(self, target: object, base: str, path: str) -> Node:
        key = (self._serial, id(target), base)
        if self.unroll:
            if self.active.get(key, 0) > self.max_depth:
                self.cut = True
                return NEVER  # recursion bound reached: this branch must end before here
            memo_key: Hashable = (key, tuple(sorted(self.active.items())))
        else:
            if key in self.active:
                return Node((RefT(key),))
            memo_key = key
        if memo_key not in self.memo:
            self.active[key] = self.active.get(key, 0) + 1
            try:
                self.memo[memo_key] = self.build(target, base, path)
            finally:
                self.active[key] -= 1
                if not self.active[key]:
                    del self.active[key]
            self.bodies[key] = self.memo[memo_key]
        return self.memo[memo_key]

    def _dependencies(self, schema: SchemaDict, path: str, sub: Sub) -> list[Node]:
        required = dict(schema.get("dependentRequired", {}))
        schemas = dict(schema.get("dependentSchemas", {}))
        for key, value in schema.get("dependencies", {}).items():  # draft 7 spelling
            (required if isinstance(value, list) else schemas)[key] = value
        others = [t for t in FULL_TERMS if not isinstance(t, ObjT)]
        out = []
        for key, names in required.items():
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ConstraintError(
                    f"invalid schema: dependentRequired/{key} must list strings at {path}"
                )
            keys = (key,) + tuple(n for n in dict.fromkeys(names) if n != key)
            present = ObjT(
                props=tuple((k, TOP) for k in keys), required=keys, undeclared=frozenset(keys)
            )
            out.append(make_node(others + [_absent(key), present]))
        for key, dep in schemas.items():
            has_key = make_node(
                (ObjT(props=((key, TOP),), required=(key,), undeclared=frozenset((key,))),)
            )
            with self.at(f"{path}/dependentSchemas"):
                out.append(
                    union(
                        make_node(others + [_absent(key)]),
                        conj(has_key, sub(dep, f"/dependentSchemas/{key}")),
                    )
                )
        return out

    def _unevaluated(self, schema: SchemaDict, node: Node, path: str, sub: Sub) -> Node:
        if ("unevaluatedProperties" in schema or "unevaluatedItems" in schema) and any(
            isinstance(t, RefT) for t in node.terms
        ):
            raise Unroll  # what a recursive reference evaluates is behind it
        if "unevaluatedProperties" in schema:
            extra = sub(schema["unevaluatedProperties"], "/unevaluatedProperties")
            node = make_node(
                tuple(_uneval_props(t, extra) if isinstance(t, ObjT) else t for t in expand(node))
            )
        if "unevaluatedItems" in schema:
            extra = sub(schema["unevaluatedItems"], "/unevaluatedItems")
            node = make_node(
                tuple(_uneval_items(t, extra) if isinstance(t, ArrT) else t for t in expand(node))
            )
        return node


def _absent(key: str) -> ObjT:
    return ObjT(props=((key, NEVER),), undeclared=frozenset((key,)))


def _uneval_props(t: ObjT, extra: Node) -> ObjT | None:
    """Keys that no part of the schema evaluated must also satisfy ``extra``."""
    if t.eval_all:
        return t
    from lmprog.fsm.json_schema.terms.values import pattern_matcher

    def evaluated(k: str) -> bool:
        return k in t.eval_names or any(pattern_matcher(p).fullmatch(k) for p in t.eval_patterns)

    props = tuple((k, v if evaluated(k) else conj(v, extra)) for k, v in t.props)
    rule = KeyRule(tuple((p, TOP) for p in sorted(t.eval_patterns)), extra)
    return normalize_obj(replace(t, props=props, rules=t.rules + (rule,), eval_all=True))


def _uneval_items(t: ArrT, extra: Node) -> ArrT | None:
    """Items past the evaluated prefix must also satisfy ``extra``."""
    if t.eval_all:
        return t
    n = max(t.eval_prefix, len(t.prefix))
    prefix = tuple(t.prefix[i] if i < len(t.prefix) else t.rest for i in range(n))
    prefix = tuple(p if i < t.eval_prefix else conj(p, extra) for i, p in enumerate(prefix))
    return normalize_arr(replace(t, prefix=prefix, rest=conj(t.rest, extra), eval_all=True))
