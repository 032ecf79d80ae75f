"""``$ref`` resolution within one schema document: ``$id`` base URIs, ``$anchor`` names and
JSON pointers. In a draft-03 or draft-04 document the base URI is ``id`` (``$id`` is not a
keyword there)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

from lmprog.core.errors import ConstraintError

# keywords whose value is a schema, a list of schemas, or a map of schemas
SCHEMA_KEYWORDS = {
    "not",
    "if",
    "then",
    "else",
    "additionalProperties",
    "unevaluatedProperties",
    "unevaluatedItems",
    "contains",
    "propertyNames",
    "additionalItems",
    "items",
    "contentSchema",
}
SCHEMA_LISTS = {"allOf", "anyOf", "oneOf", "prefixItems", "items"}
SCHEMA_MAPS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}


def _join(base: str, ref: str) -> str:
    if ref.startswith("#") or not base:
        return base + ref if ref.startswith("#") else ref
    if base.startswith("urn:") and not ref.startswith("urn:"):
        return base if not ref else ref
    return urljoin(base, ref)


_ID_DRAFTS = re.compile(r"json-schema\.org/draft-0[34]/schema")  # whose identifier is "id"


def id_keyword(document: object) -> str:
    """The keyword naming a schema's URI in this document: ``id`` under draft-03/04 (by its
    ``$schema``), ``$id`` otherwise."""
    declared = document.get("$schema") if isinstance(document, dict) else None
    return "id" if _ID_DRAFTS.search(str(declared)) else "$id"


class Registry:
    """Every schema resource (``$id``) and anchor of one document, with each schema's base URI."""

    def __init__(self, root: object) -> None:
        self.resources: dict[str, object] = {}
        self.anchors: dict[tuple[str, str], object] = {}
        self.bases: dict[int, str] = {}
        self.dynamic: dict[
            str, list[object]
        ] = {}  # $dynamicAnchor name -> the schemas declaring it
        self.recursive: list[object] = []  # resource roots with $recursiveAnchor: true
        self._walk(root, "", id_keyword(root))
        self.root = self.bases[id(root)] if isinstance(root, dict) else ""  # its base URI

    def _walk(self, schema: object, base: str, id_key: str) -> None:
        if not isinstance(schema, dict):
            return
        uri = schema.get(id_key)
        if isinstance(uri, str) and uri.startswith("#"):
            self.anchors.setdefault((base, uri[1:]), schema)  # draft 4-7 anchor
        elif isinstance(uri, str):
            base = urldefrag(_join(base, uri))[0]
            self.resources.setdefault(base, schema)
        if not self.resources:
            self.resources[base] = schema
        self.bases[id(schema)] = base
        for key in ("$anchor", "$dynamicAnchor"):
            if isinstance(schema.get(key), str):
                self.anchors.setdefault((base, schema[key]), schema)
        if isinstance(schema.get("$dynamicAnchor"), str):
            self.dynamic.setdefault(schema["$dynamicAnchor"], []).append(schema)
        if schema.get("$recursiveAnchor") is True:
            self.recursive.append(schema)
        for key, value in schema.items():
            if key in SCHEMA_KEYWORDS and isinstance(value, dict):
                self._walk(value, base, id_key)
            elif key in SCHEMA_LISTS and isinstance(value, list):
                for sub in value:
                    self._walk(sub, base, id_key)
            elif key in SCHEMA_MAPS and isinstance(value, dict):
                for sub in value.values():
                    self._walk(sub, base, id_key)

    def resolve_dynamic(self, ref: str, base: str, recursive: bool) -> tuple[Any, str]:
        """(target, base URI) of ``$dynamicRef`` (or draft 2019-09's ``$recursiveRef``): the
        ``$ref`` target, unless it declares a dynamic (recursive) anchor; then the outermost
        schema in the dynamic scope declaring the same, which is the target itself when this
        document declares that anchor once, and the root resource's when it declares it (every
        evaluation starts there: the outermost scope; for ``$recursiveRef``, when every
        resource declares ``$recursiveAnchor``, so that none breaks the chain out to the root:
        the 2019-09 and 2020-12 metaschemas). ConstraintError when it declares it several
        times otherwise (the answer would depend on the path evaluation took)."""
        target, target_base = self.resolve(ref, base)
        if recursive:
            if ref != "#":
                raise ConstraintError(f"$recursiveRef must be '#', got {ref!r}")
            dynamic = target.get("$recursiveAnchor") is True and len(self.recursive) > 1
            if dynamic and all(
                isinstance(r, dict) and r.get("$recursiveAnchor") is True
                for r in self.resources.values()
            ):
                return self.resources[self.root], self.root
        else:
            fragment = urldefrag(ref)[1]
            name = target.get("$dynamicAnchor") if isinstance(target, dict) else None
            dynamic = name == fragment and len(self.dynamic.get(name, [])) > 1
            outermost = self._root_anchor(name) if dynamic else None
            # (written in the root resource, only a target there: jsonschema's scope then
            # holds no outer resource, and takes the target's own)
            if outermost is not None and (base != self.root or target_base == self.root):
                return outermost, self.root
        if dynamic:
            raise ConstraintError(
                f"{'$recursiveRef' if recursive else '$dynamicRef'} {ref!r}: the document "
                "declares that anchor more than once (which one applies depends on the "
                "evaluation path), not supported"
            )
        return target, target_base

    def _root_anchor(self, name: object) -> object:
        """The schema of the root resource declaring ``$dynamicAnchor`` `name`; else None."""
        for schema in self.dynamic.get(name, []) if isinstance(name, str) else []:
            if self.bases.get(id(schema)) == self.root:
                return schema
        return None

    def _metaschema(self, uri: str) -> object:
        """A metaschema bundled by ``jsonschema-specifications`` (no network), registered as a
        resource of this document; None for any other URI."""
        try:
            from jsonschema_specifications import REGISTRY
        except ImportError:
            return None
        for key in (
            uri,
            uri.replace("https://", "http://", 1),
            uri.replace("http://", "https://", 1),
        ):
            try:
                doc = REGISTRY.contents(key)
            except LookupError:
                continue
            self.resources[uri] = doc
            self._walk(doc, uri, id_keyword(doc))
            return doc
        return None

    def base_of(self, schema: object, default: str) -> str:
        return self.bases.get(id(schema), default)

    def resolve(self, ref: str, base: str) -> tuple[Any, str]:  # (a JSON value)
        """(target schema, its base URI) of ``$ref`` written where the base URI is ``base``."""
        uri, fragment = urldefrag(_join(base, ref))
        doc = self.resources.get(uri)
        if doc is None:
            doc = self._metaschema(uri)
        if doc is None:
            raise ConstraintError(
                f"$ref {ref!r} points outside this schema ({uri!r}); remote "
                "references are not fetched"
            )
        if not fragment:
            return doc, uri
        if not fragment.startswith("/"):
            target = self.anchors.get((uri, fragment))
            if target is None:
                raise ConstraintError(f"$ref {ref!r}: no anchor {fragment!r}")
            return target, self.base_of(target, uri)
        target = doc
        for token in fragment.split("/")[1:]:
            token = unquote(token).replace("~1", "/").replace("~0", "~")
            if isinstance(target, list) and token.isdigit() and int(token) < len(target):
                target = target[int(token)]
            elif isinstance(target, dict) and token in target:
                target = target[token]
            else:
                raise ConstraintError(f"$ref {ref!r}: pointer does not resolve")
        return target, self.base_of(target, uri)
