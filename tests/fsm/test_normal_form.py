"""Schemas whose normal form multiplied past the caps (issue 36): an intersection of unions kept
the size of its result (terms.algebra.without_subsumed), oneOf over objects with several typed
keys counted as decoded (complement.one_of, checks), and the 2019-09 and 2020-12 metaschemas
(a dynamic anchor declared several times, the root's taken). Judged by jsonschema."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from fsm_toys import random_text

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint
from lmprog.fsm.json_schema import build_grammar
from lmprog.fsm.json_schema.terms.algebra import without_subsumed
from lmprog.fsm.json_schema.terms.nodes import TOP, Node, ObjT, StrT


def _agree(schema: object, instances: list, strict: bool = False) -> None:
    c = Constraint.from_json_schema(schema, strict=strict)
    validator = jsonschema.validators.validator_for(schema)(schema)
    for x in instances:
        assert c.matches(json.dumps(x)) == validator.is_valid(x), x


def _texts_valid(schema: object, likes: list[str], walks: int = 60) -> int:
    c = Constraint.from_json_schema(schema, strict=False)
    validator = jsonschema.validators.validator_for(schema)(schema)
    rng = random.Random(0)
    texts = [random_text(c, rng, likes[i % len(likes)], limit=600) for i in range(walks)]
    done = [t for t in texts if t is not None]
    for text in done:
        assert validator.is_valid(json.loads(text)), text
    return len(done)


def test_a_term_another_holds_is_dropped():
    wide = ObjT(props=(("a", TOP),), required=("a",))
    narrow = ObjT(props=(("a", Node((StrT(),))), ("b", TOP)), required=("a", "b"))
    other = ObjT(props=(("c", TOP),), required=("c",))
    assert without_subsumed(Node((narrow, wide, other))).terms == (wide, other)
    # annotations differ (unevaluated* reads them): both kept
    noted = ObjT(props=(("a", TOP),), required=("a",), eval_names=frozenset({"a"}))
    assert len(without_subsumed(Node((narrow, noted, other))).terms) == 3


NESTED_REFS = {  # the suite's "dynamic evalation inside nested refs"
    "$defs": {
        "one": {
            "oneOf": [
                {"$ref": "#/$defs/two"},
                {"required": ["b"], "properties": {"b": True}},
                {"required": ["xx"], "patternProperties": {"x": True}},
                {"required": ["all"], "unevaluatedProperties": True},
            ]
        },
        "two": {
            "oneOf": [
                {"required": ["c"], "properties": {"c": True}},
                {"required": ["d"], "properties": {"d": True}},
            ]
        },
    },
    "oneOf": [{"$ref": "#/$defs/one"}, {"required": ["a"], "properties": {"a": True}}],
    "unevaluatedProperties": False,
}


def test_dynamic_evaluation_inside_nested_refs_compiles_exactly():
    keys = ["a", "b", "c", "d", "xx", "xxx", "all", "foo"]
    instances: list = [{}, 1, "x", None]
    for i, k in enumerate(keys):
        instances.append({k: 1})
        for m in keys[i + 1 :]:
            instances.append({k: 1, m: 1})
    instances += [{"all": 1, "foo": 1, "b": 1}, {"xx": 1, "foox": 1}, {"c": 1, "d": 1, "a": 1}]
    _agree(NESTED_REFS, instances)


_TYPES = {"string": "x", "integer": 7, "boolean": True}


def _typed_branches(n: int, keys: int = 2, shared: int = 0, typed: bool = True) -> dict:
    """oneOf over n open objects, each requiring `keys` typed keys of its own (and `shared`
    keys every branch names, typed apart)."""
    branches = []
    for i in range(n):
        props = {f"k{i}_{j}": {"type": list(_TYPES)[(i + j) % 3]} for j in range(keys)}
        props.update({f"s{j}": {"type": list(_TYPES)[(i + j) % 2]} for j in range(shared)})
        branch: dict = {"properties": props, "required": list(props)}
        if typed:
            branch["type"] = "object"
        branches.append(branch)
    return {"oneOf": branches}


def _branch_value(schema: dict, i: int) -> dict:
    return {k: _TYPES[v["type"]] for k, v in schema["oneOf"][i]["properties"].items()}


@pytest.mark.parametrize(
    "n, keys, shared, typed",
    [(8, 2, 0, True), (8, 2, 1, False), (10, 3, 0, True), (16, 2, 0, True)],
)
def test_one_of_over_objects_with_several_typed_keys_is_counted_as_decoded(n, keys, shared, typed):
    schema = _typed_branches(n, keys, shared, typed)
    grammar = build_grammar(schema, strict=False)
    assert grammar.check is not None and len(grammar.lark) < 500 * n  # linear in the branches
    rng = random.Random(n)
    names = sorted({k for b in schema["oneOf"] for k in b["properties"]})
    instances: list = []
    for _ in range(400):
        x = _branch_value(schema, rng.randrange(n))
        for k in rng.sample(names, rng.randint(0, 4)):
            x[k] = rng.choice(["x", 7, True, None, 2.5, [], {}])
        if x and rng.random() < 0.3:
            x.pop(rng.choice(list(x)))
        instances += [x, rng.choice([1, "s", None, [x]])]
    _agree(schema, instances)
    assert _texts_valid(schema, [json.dumps(_branch_value(schema, i)) for i in range(n)]) > 40


def test_the_counted_one_of_under_strict_generation():
    schema = _typed_branches(8)
    c = Constraint.from_json_schema(schema)
    one, two = _branch_value(schema, 0), _branch_value(schema, 1)
    assert c.matches(json.dumps(one)) and not c.matches(json.dumps({**one, **two}))


def test_fewer_branches_stay_exact_in_the_grammar():
    assert build_grammar(_typed_branches(6), strict=False).check is None


def test_not_over_a_counted_one_of_is_refused():
    with pytest.raises(ConstraintError, match="oneOf"):
        build_grammar({"not": _typed_branches(8)}, strict=False)


METASCHEMA_INSTANCES = [
    True,
    False,
    {},
    3,
    "x",
    None,
    {"type": "string"},
    {"type": 3},
    {"type": ["string", "null"], "maxLength": 3},
    {"properties": {"a": {"minLength": -1}}},
    {"properties": {"a": {"type": "integer", "minimum": 1}}, "required": ["a"]},
    {"allOf": []},
    {"anyOf": [{"const": 1}, True]},
    {"$defs": {"x": {"enum": [1, 1]}}},
    {"items": [1]},
    {"items": {"type": "object", "additionalProperties": False}},
    {"required": ["a", "a"]},
    {"maxLength": 1.5},
    {"dependentRequired": {"a": ["b"]}},
    {"dependentRequired": {"a": [1]}},
    {"not": {"not": {"uniqueItems": "yes"}}},
    {"$ref": "#/$defs/a", "$defs": {"a": {"format": "date"}}},
    {"unevaluatedProperties": {"type": "string"}, "contentMediaType": 3},
]


@pytest.mark.parametrize(
    "uri",
    [
        "https://json-schema.org/draft/2020-12/schema",
        "https://json-schema.org/draft/2019-09/schema",
    ],
)
def test_the_metaschemas_compile_and_judge_schemas_as_jsonschema(uri):
    from jsonschema_specifications import REGISTRY

    metaschema = REGISTRY.contents(uri)
    _agree(metaschema, METASCHEMA_INSTANCES)
    likes = [json.dumps(x) for x in METASCHEMA_INSTANCES if isinstance(x, dict)]
    assert _texts_valid(metaschema, likes) > 40


def test_a_dynamic_anchor_declared_again_in_a_resource_resolves_to_the_root():
    schema = {
        "$id": "https://example.com/tree",
        "$dynamicAnchor": "node",
        "type": "object",
        "properties": {"data": True, "children": {"items": {"$dynamicRef": "#node"}}},
        "$defs": {
            "leaf": {
                "$id": "leaf",
                "$dynamicAnchor": "node",
                "type": "object",
                "properties": {"kids": {"items": {"$dynamicRef": "#node"}}},
            },
            "use": {"$ref": "leaf"},
        },
        "allOf": [{"$ref": "leaf"}],
    }
    _agree(
        schema,
        [
            {"children": [{"data": 1}, {"children": []}]},
            {"children": [1]},
            {"kids": [{"children": [2]}]},
            {"kids": [{"kids": [{}]}]},
            {"kids": ["x"]},
            [],
        ],
    )


def test_a_branch_within_another_is_not_written():
    schema = _typed_branches(8)
    inner = {"type": "object", "properties": {"k0_0": {"type": "string"}, "z": {"type": "null"}}}
    inner["properties"]["k0_1"] = {"type": "integer"}
    inner["required"] = ["k0_0", "k0_1", "z"]
    schema["oneOf"].append(inner)
    grammar = build_grammar(schema)
    assert grammar.check is not None and '"z"' not in grammar.lark
    _agree(schema, [_branch_value(schema, 0), {**_branch_value(schema, 0), "z": None}])


@pytest.mark.parametrize("where", ["items", "member after an array"])
def test_a_counted_one_of_nested_beside_checked_arrays(where):
    one = _typed_branches(8)
    if where == "items":
        schema: dict = {"type": "array", "uniqueItems": True, "items": one}
    else:  # the array's text is kept, then the object's starts within the same token
        schema = {
            "type": "object",
            "properties": {"list": {"type": "array", "items": one, "uniqueItems": True}, "o": one},
            "required": ["o"],
        }
    rng = random.Random(3)

    def obj() -> dict:
        x = _branch_value(one, rng.randrange(8))
        if rng.random() < 0.4:
            x.update(_branch_value(one, rng.randrange(8)))
        return x

    instances: list = []
    for _ in range(150):
        objs = [obj() for _ in range(rng.randint(0, 3))]
        if objs and rng.random() < 0.3:
            objs.append(dict(objs[0]))
        instances.append(objs if where == "items" else {"list": objs, "o": obj()})
    _agree(schema, instances)
    c = Constraint.from_json_schema(schema, strict=False)
    assert c.matches('{"list": [], "o": {"k7_0": 7, "k7_1": true}}') == (where != "items")
