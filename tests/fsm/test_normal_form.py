"""Schemas whose normal form multiplied past the caps (issue 36): an intersection of unions kept
the size of its result (terms.algebra.without_subsumed), oneOf over objects with several typed
keys counted as decoded (complement.one_of, checks), and the 2019-09 and 2020-12 metaschemas
(a dynamic anchor declared several times, the root's taken). Judged by jsonschema."""

from __future__ import annotations

import itertools
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


_CLOSING = frozenset(b'}]"0')


def _walk_near(c: Constraint, rng: random.Random, like: str, limit: int = 500) -> str | None:
    """A random text of `c` written byte by byte near `like` (as ``fsm_toys.random_text``),
    then toward its end; a step where no byte may follow raises (ConstraintError: a dead
    end), a walk past `limit` bytes gives None."""
    from lmprog.fsm.index import BYTES, TokenIndex

    guide = TokenIndex.get(c, BYTES).new_guide()
    target, k, out = like.encode(), 0, bytearray()
    while len(out) < limit:
        ids = guide.allowed_token_ids().tolist()  # raises at a dead end
        if ids == [256] or 256 in ids and k >= len(target) and rng.random() < 0.5:
            return out.decode()
        ids = [t for t in ids if t != 256]
        if k < len(target) and target[k] in ids and rng.random() < 0.95:
            byte = target[k]
        elif k >= len(target) and rng.random() < 0.8 and set(ids) & _CLOSING:
            byte = rng.choice(sorted(set(ids) & _CLOSING))  # toward the end
        else:
            byte = rng.choice(ids)
            k += rng.random() < 0.5
        k += k < len(target) and byte == target[k]
        guide.advance(byte)
        out.append(byte)
    return None


def _mixed(schema: dict, rng: random.Random) -> str:
    """An object holding the keys of one to three branches, and some other keys of theirs."""
    branches = len(schema["oneOf"])
    names = sorted({k for b in schema["oneOf"] for k in b["properties"]})
    x: dict = {}
    for _ in range(rng.randint(1, 3)):
        x.update(_branch_value(schema, rng.randrange(branches)))
    for k in rng.sample(names, rng.randint(0, 2)):
        x[k] = rng.choice(["x", 7, True, None, 2.5, [1]])
    items = list(x.items())
    rng.shuffle(items)
    return json.dumps(dict(items))


@pytest.mark.parametrize(
    "n, keys, shared, typed",
    [(8, 2, 0, True), (8, 2, 1, False), (10, 3, 0, True), (4, 2, 1, True)],
)
def test_a_counted_one_of_foresees_the_objects_in_several_branches(n, keys, shared, typed):
    """Writing a branch's keys beside another's: the member that would leave the object in
    two branches for good is refused as it is written (a key, a value's first byte, a number
    that can only be an integer), so a random walk never reaches a "}" the check refuses."""
    from decimal import Decimal

    schema = _typed_branches(n, keys, shared, typed)
    c = Constraint.from_json_schema(schema, strict=False)
    validator = jsonschema.validators.validator_for(schema)(schema)
    rng = random.Random(n + keys)
    done = 0
    for _ in range(120):
        text = _walk_near(c, rng, _mixed(schema, rng))
        if text is not None:  # (jsonschema reads numbers as floats: 1e17 + 0.2 is an integer)
            assert validator.is_valid(json.loads(text, parse_float=Decimal)), text
            done += 1
    assert done == 120  # (a walk trapped in two branches runs on to its limit)


def _prefix(c: Constraint, text: str) -> bool:
    """Whether the byte-level guide takes `text` (its mask and `is_allowed` agreeing)."""
    from lmprog.fsm.index import BYTES, TokenIndex

    guide = TokenIndex.get(c, BYTES).new_guide()
    for byte in text.encode():
        allowed = byte in guide.allowed_token_ids().tolist()
        assert allowed == guide.is_allowed(byte), (text, chr(byte))
        if not allowed:
            return False
        guide.advance(byte)
    return True


def test_a_counted_one_of_refuses_the_member_that_closes_every_way():
    schema = _typed_branches(8)  # k0_0 string, k0_1 integer; k1_0 integer, k1_1 boolean
    c = Constraint.from_json_schema(schema, strict=False)
    head = '{"k0_0": "x", "k0_1": 7, "k1_0": 7, "k1_1": '
    assert not _prefix(c, head + "true") and _prefix(c, head + '"x"')
    assert c.matches(head + '"x"}') and not c.matches(head + "true}")
    head = '{"k0_0": "x", "k0_1": 7, "k1_1": true, "k1_0": 7'
    assert not _prefix(c, head + ",") and not _prefix(c, head + "e1")
    assert not _prefix(c, head + "e+") and _prefix(c, head + "e-")
    assert c.matches(head + ".5}") and c.matches(head + "e-1}")
    untyped = _typed_branches(8, typed=False)
    for branch in untyped["oneOf"]:
        branch["properties"] = {k: {} for k in branch["properties"]}
    c = Constraint.from_json_schema(untyped, strict=False)
    assert not _prefix(c, '{"k0_0": 1, "k0_1": 2, "k1_0": 3, "k1_1"')
    assert _prefix(c, '{"k0_0": 1, "k0_1": 2, "k1_0": 3, "k1_2"')
    # valid instances, in every key order, are still accepted; invalid ones refused
    c = Constraint.from_json_schema(schema, strict=False)
    validator = jsonschema.validators.validator_for(schema)(schema)
    for one in (
        {**_branch_value(schema, 0), "k1_0": 7, "k1_1": "x", "z": None},
        {**_branch_value(schema, 0), "k1_0": 7.5, "k1_1": True},
        {**_branch_value(schema, 0), "k1_0": 7, "k1_1": True},
    ):
        for order in itertools.permutations(one):
            x = {k: one[k] for k in order}
            assert c.matches(json.dumps(x)) == validator.is_valid(x), x
