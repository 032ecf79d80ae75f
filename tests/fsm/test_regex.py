"""The regex layer: strict parsing, canonical emission, and agreement between engines."""

import json
import random
import re
import warnings

import interegular
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint
from lmprog.fsm.regex import (
    ANY_CHAR,
    CharSet,
    alt,
    cat,
    charset_regex,
    compile_user_regex,
    cs,
    lit,
    parse_regex,
    rep,
    value_matcher,
)

FAST = settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


@pytest.mark.parametrize(
    "pattern, expected",
    [
        (r"\d+", "[0-9]+"),
        (r"(ab|cd)*e?", "(?:ab|cd)*e?"),
        (r"^hello$", "hello"),
        (r"\w{2,5}", "[0-9A-Z_a-z]{2,5}"),
        (r"a{,3}", "a{0,3}"),
        (r"x{", r"x\{"),
        (r"[]a]", r"[\]a]"),
        (r"(?P<n>a)(?:b)", "ab"),
        (r"a*?b+?c??", "a*b+c?"),
        (r"(?#note)a", "a"),
        (".", r"[^\x0a]"),
        (r"[\s\S]", r"[\s\S]"),
        (r"\u00e9\U0001F600\x41", "é😀A"),
        (r"[a-c&~-]", r"[\&\-a-c\~]"),
    ],
)
def test_canonical_emission(pattern, expected):
    assert compile_user_regex(pattern) == expected


@pytest.mark.parametrize(
    "pattern, construct, position",
    [
        (r"(?=ab)b", "lookaround no text can satisfy", 0),
        (r"(?<=ab)b", "lookbehind", 0),
        (r"(a)\1", "backreference", 3),
        (r"(?P<x>a)(?P=x)", "backreference", 8),
        (r"a^b", "anchor", 1),
        (r"a$b", "anchor", 1),
        (r"(^a){0,40}", "anchor inside a group repeated more than 16 times", 1),
        (r"(?m)(a$)+", "multiline anchor ('(?m)') inside a repeated group", 6),
        (r"a\bb", "word boundary", 1),
        (r"(?x)abc", "inline flag", 0),
        (r"\p{Script=Greek}", "Unicode property", 0),
        (r"\p{Xx}", "Unicode property class", 0),
        (r"*a", "nothing to repeat", 0),
        (r"a**", "repeated quantifier", 2),
        (r"a++", "possessive", 2),
        (r"[b-a]", "out of order", 1),
        (r"(a", "missing ')'", 0),
        (r"a)", "unbalanced", 1),
        (r"[a", "unterminated", 0),
        (r"a{3,1}", "min > max", 1),
        (r"(?>a)", "atomic", 0),
        ("[^\\s\\S]", "matches no string", None),
    ],
)
def test_rejections_name_construct_and_position(pattern, construct, position):
    with pytest.raises(ConstraintError) as info:
        compile_user_regex(pattern)
    message = str(info.value)
    assert construct in message
    if position is not None:
        assert f"position {position}" in message


def test_unicode_general_categories():
    m = value_matcher(parse_regex(r"^\p{Letter}+\P{L}$", "ecma"))
    assert m.fullmatch("aλé1") and m.fullmatch("Ж ")
    assert not m.fullmatch("a") and not m.fullmatch("1a")
    assert re.fullmatch(compile_user_regex(r"\p{Lu}\p{Nd}"), "Ä٣")


def test_javas_posix_classes_as_cloudformation_schemas_use_them():
    """\\p{Graph}, \\p{Print}, \\p{ASCII}...: Java's US-ASCII POSIX classes (CloudFormation's
    resource schemas are written for a Java validator), compared with the classes spelled out;
    \\P{...} is the complement."""
    spelled = {
        "Graph": "[!-~]",
        "Print": "[ -~]",
        "Punct": r"[!-/:-@\[-`{-~]",
        "ASCII": r"[\x00-\x7f]",
        "Alnum": "[a-zA-Z0-9]",
        "Space": r"[ \t\n\x0b\x0c\r]",
        "Cntrl": r"[\x00-\x1f\x7f]",
    }
    chars = [chr(c) for c in range(0x100)] + ["é", "Ж", "\u3000", "😀"]
    for name, cls in spelled.items():
        for sign, ref in (("p", cls), ("P", "[^" + cls[1:])):
            m = value_matcher(parse_regex(rf"^\{sign}{{{name}}}$", "ecma"))
            for ch in chars:
                assert bool(m.fullmatch(ch)) == bool(re.fullmatch(ref, ch)), (sign, name, ch)
    m = value_matcher(parse_regex(r"^[\p{Graph}\x20]*$", "ecma"))
    assert m.fullmatch("a b~") and not m.fullmatch("a\tb") and not m.fullmatch("é")
    with pytest.raises(ConstraintError, match="POSIX classes"):
        parse_regex(r"\p{Script=Latin}", "ecma")


JAVA_INTERSECTIONS = [  # a JSON Schema pattern in Java's class syntax, and Python's reading
    (r"^[a-z&&[^aeiou]]+$", r"^(?:(?=[a-z])[^aeiou])+$"),
    (r"^[\p{Print}&&[^|:/]]{1,8}$", r"^(?:(?=[ -~])[^|:/]){1,8}$"),
    (r"[[a-z]&&[^aeiou]&&[a-m]]", r"(?=[a-z])(?=[^aeiou])[a-m]"),
    (r"^[a-f[0-3]&&[^b-e][x]]$", r"^(?=[a-f0-3])[^b-e]$"),
    (r"^[\w&&[^_\d]][x&-]?$", r"(?a)^(?=\w)[^_\d][x&-]?$"),  # ECMA: \w is ASCII
]


@pytest.mark.parametrize("pattern, python", JAVA_INTERSECTIONS)
def test_javas_class_intersection_in_json_schema_patterns(pattern, python):
    """``[a-z&&[^aeiou]]``, ``[\\p{Print}&&[^|:/]]`` (CloudFormation's resource schemas, written
    for a Java validator): where a class holds ``&&`` and a nested class, which ECMA-262 with
    the ``u`` flag refuses, read as Java intersects; compared with Python ``re`` lookaheads
    that mean the same, on random strings over the characters they name and a few others."""
    m = value_matcher(parse_regex(pattern, "ecma"))
    ref = re.compile(python)
    rng = random.Random(pattern)
    alphabet = "abcdefmxz_AZ09-|:/ &[]^\\\té😀"
    matched = 0
    for n in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4 if n % 2 else 1)))
        assert bool(m.fullmatch(text)) == bool(ref.search(text)), (pattern, text)
        matched += bool(ref.search(text))
    assert 10 <= matched <= 390, (pattern, matched)  # both sides tried
    c = Constraint.from_json_schema({"type": "string", "pattern": pattern}, strict=False)
    for text in ("b", "bcd", "Az", "a", "|x", "zz-"):
        assert c.matches(json.dumps(text)) == bool(ref.search(text)), (pattern, text)


def test_javas_class_syntax_elsewhere_is_read_as_before_or_refused():
    """A Python regex keeps ``re``'s reading (a literal ``&``, ``[`` and ``]``); in a JSON Schema
    pattern a ``&&`` without a nested class is ambiguous (ECMA-262: two '&'), a negated class
    holding ``&&`` negates the first operand in Java 8 and the whole class from Java 9: both
    refused, as are an empty operand and ``&&`` under ``(?i)``; a class with a ``[`` that does
    not balance is ECMA's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # re: "possible set intersection"
        ref = re.compile(r"[a-z&&[^aeiou]]")
    m = value_matcher(parse_regex(r"^[a-z&&[^aeiou]]$", "python"))
    for text in ("b]", "a]", "&]", "[]", "b", "^]"):
        assert bool(m.fullmatch(text)) == bool(ref.fullmatch(text)), text
    for pattern, what in [
        (r"[a-z&&aeiou]", "without a nested class"),
        (r"[^a-z&&[b]]", "a negated class holding '&&'"),
        (r"[a-z&&]", "an empty operand"),
        (r"[&&[a]]", "an empty operand"),
        (r"(?i)[a-z&&[^b]]", "under the 'i' flag"),
    ]:
        with pytest.raises(ConstraintError, match=re.escape(what)):
            parse_regex(pattern, "ecma")
    m = value_matcher(parse_regex(r"^[&&[]+$", "ecma"))  # ECMA: the class of '&' and '['
    assert m.fullmatch("&[&") and not m.fullmatch("a")


def test_ecma_dialect_semantics():
    p = parse_regex(r"^\s.$", "ecma")
    m = value_matcher(p)
    assert m.fullmatch("\u00a0x") and m.fullmatch("\u3000y")  # ECMA \s is Unicode
    assert not m.fullmatch(" \u2028")  # ECMA . excludes line terminators
    assert value_matcher(parse_regex(r"\u{1F600}", "ecma")).fullmatch("a😀b")
    assert value_matcher(parse_regex(r"\ud83d\ude00", "ecma")).fullmatch("😀")
    with pytest.raises(ConstraintError, match="backreference"):
        parse_regex(r"(a)\k<x>", "ecma")


@pytest.mark.parametrize(
    "pattern, yes, no",
    [
        ("a+", ["a", "xay", "aaa"], ["", "b"]),
        ("^a", ["a", "ab"], ["ba"]),
        ("a$", ["a", "ba"], ["ab"]),
        ("^a|b$", ["ax", "xb"], ["xa", "bx"]),
    ],
)
def test_search_semantics_of_json_schema_patterns(pattern, yes, no):
    m = value_matcher(parse_regex(pattern, "ecma"))
    assert all(m.fullmatch(s) for s in yes)
    assert not any(m.fullmatch(s) for s in no)


def test_charset_algebra_and_classes():
    a, b = cs("a-m"), cs("h-z")
    assert (a & b) == cs("h-m") and (a | b) == cs("a-z") and (a - b) == cs("a-g")
    assert "q" in b and "q" not in a
    assert charset_regex(CharSet()) is None
    assert charset_regex(ANY_CHAR).text == r"[\s\S]"
    big = ANY_CHAR - CharSet.of('"\\')
    assert charset_regex(big).text == '[^"\\\\]'  # large sets are written negated


@pytest.mark.parametrize(
    "cls",
    [
        r"\p{L}",
        r"[\p{L}\p{Z}\p{N}_.:/=+\-@]",
        r"\P{L}",
        r"\p{Co}",
        r"[^\ud7ff\ue000]",
        r"[^\ud7fe-\ue001]",
    ],
)
def test_character_classes_through_the_token_engine(cls):
    """An emitted class (large ones negated) admits exactly its set through llguidance, tried
    at every edge of its ranges: where the scalars outside a class ran up to U+D7FF and on from
    U+E000, the negated class let U+E000 through (random walks over a CloudFormation schema's
    tag pattern wrote it)."""
    from lmprog.fsm import Constraint
    from lmprog.fsm.regex.charset import SURROGATES

    chars = parse_regex(cls, "ecma").branches[0].node.chars
    c = Constraint.from_json_schema({"type": "string", "pattern": f"^{cls}$"})
    edges = {0xD7FF, 0xE000}
    for lo, hi in chars.ranges:
        edges |= {lo - 1, lo, hi, hi + 1}
    for cp in sorted(edges):
        if 0 <= cp <= 0x10FFFF and not SURROGATES[0] <= cp <= SURROGATES[1]:
            text = json.dumps(chr(cp), ensure_ascii=False)
            assert c.matches(text) == (chr(cp) in chars), hex(cp)


def test_combinators_group_only_where_needed():
    ab = alt(lit("a"), lit("b"))
    assert cat(ab, lit("c")).text == "(?:a|b)c"
    assert rep(cat(lit("a"), lit("b")), 0, None).text == "(?:ab)*"
    assert rep(lit("a"), 2, 2).text == "a{2}"
    assert alt(lit("a"), cat()).text == "a?"
    assert cat(lit("a"), None) is None and alt(None, None) is None
    assert lit("a.b").text == r"a\.b"


PATTERNS = [
    r"[a-z]{2,4}[0-9]?",
    r"(ab|a)(b|c)*",
    r"x?[^a-c\n]{0,3}y",
    r"(?:[A-F]\.){1,3}",
    r"[\w.-]+@[a-z]+",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_emitted_pattern_agrees_with_python_and_interegular(pattern):
    emitted = compile_user_regex(pattern)
    fsm = interegular.parse_pattern(emitted).to_fsm()
    ours, theirs = re.compile(emitted), re.compile(pattern, re.ASCII)

    @FAST
    @given(
        st.one_of(
            st.from_regex(pattern, fullmatch=True),
            st.text(alphabet="abcxyz0129.-@AF\n", max_size=8),
        )
    )
    def check(text):
        expected = theirs.fullmatch(text) is not None
        assert (ours.fullmatch(text) is not None) == expected
        assert fsm.accepts(text) == expected

    check()


NULLABLE = [r"a*", r"(ab)?c*", r"(a|b?)(c|)", r"(a?){2,3}b?", r"(?:x*y?){0,2}", r"a{0}"]


@pytest.mark.parametrize("pattern", NULLABLE)
def test_nonempty_keeps_exactly_the_non_empty_matches(pattern):
    import itertools

    from lmprog.fsm.regex import emit, parse_regex
    from lmprog.fsm.regex.syntax import nonempty, nullable

    node = parse_regex(pattern).whole()
    assert nullable(node)
    rest = nonempty(node)
    emitted = None if rest is None else re.compile(emit(rest).text)
    original = re.compile(pattern)
    for n in range(6):
        for text in map("".join, itertools.product("abcxy", repeat=n)):
            want = text != "" and original.fullmatch(text) is not None
            got = emitted is not None and emitted.fullmatch(text) is not None
            assert got == want, (pattern, text)


def test_a_regex_matching_only_the_empty_string_is_refused_at_once():
    from lmprog.fsm.regex import check_not_only_empty

    for pattern in ("", "(?:)", "a{0}", "()*"):
        with pytest.raises(ConstraintError, match="only the empty string"):
            check_not_only_empty(pattern)


@pytest.mark.parametrize(
    "pattern",
    [
        *[r"^$|(^[a-z]+$)", r"^(foo|^bar)$", r"(^a|b)c", r"a$|b", r"x($)?y?", r"(?:^ab|cd$)|ef"],
        # inside repeated groups (issue 36): a list ending at the end, separators or the start
        *[r"^(?:[a-z]+(?:,|$))+", r"(a$)*b", r"^(ab|c$)*", r"(^a|b)*c", r"^(x|^y|z$){2,4}$"],
        *[r"(?:(?:^|-)[a-z]{1,3})+$", r"^(a|$)+", r"(^|,)(bc)(,|$)", r"^(?:(?:^|,)[ab])*$"],
        *[r"(x|$){2,}a", r"^(?:(?:a|b$)c?){1,3}"],
    ],
)
def test_anchors_anywhere_an_engine_allows_them(pattern):
    """JSON Schema `pattern`s with anchors inside groups keep their search semantics: the
    constraint accepts a string iff ECMA-style search (Python's re.search) finds the pattern."""
    import itertools
    import re

    from lmprog.fsm import Constraint

    c = Constraint.from_json_schema({"type": "string", "pattern": pattern})
    for n in range(4):
        for letters in itertools.product("abcefxy,", repeat=n):
            text = "".join(letters)
            expected = re.search(pattern, text) is not None
            assert c.matches(json.dumps(text)) == expected, (pattern, text)


@pytest.mark.parametrize(
    "pattern",
    [
        r"^(?!ab).+$",
        r"^a(?!.*bb)[a-c]*$",
        r"^(?!b)(?!.*c$)(?=.*a)[a-c]+$",
        r"(?=^.{2,3}$)(?!^c+$)(^[a-c]*$)",
        r"^((?!ab).)*$",
        r"^(?=^[^c])(^((?!b{2}).)*$).*$",
        r"^a((?!ca|^b).)*$",
        r"^(?!a*$)",
        r"(?!^a+$)[ab]+",
        r"(?=^ab)[ab]c?",
        r"(?!^a)(?!^b$)b",
        r"(?!ab)b",  # these look from a moving position: through the automaton
        r"^a*(?!bc)c",
        r"^(a(?!bc)|c)d",
        r"^((?!ab).)*b$",
        r"^([ab](?!ba))*c",
    ],
)
def test_lookaheads_keep_search_semantics(pattern):
    """A pattern with lookaheads where they look from a fixed position (after a fixed-length
    prefix of a pattern anchored at its start, or tempered tokens running to its end; or only
    at the string's start, ``(?!^...)``, in a pattern searched anywhere) is compiled as
    intersections: accepted iff Python's re.search finds it."""
    import itertools

    from lmprog.fsm import Constraint

    c = Constraint.from_json_schema({"type": "string", "pattern": pattern})
    for n in range(5):
        for letters in itertools.product("abc", repeat=n):
            text = "".join(letters)
            assert c.matches(json.dumps(text)) == (re.search(pattern, text) is not None), text


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "properties": {"aws:x": {"type": "integer"}},
            "patternProperties": {"^(?!aws:).+$": {"type": "string"}, "^a": {"type": "boolean"}},
            "additionalProperties": False,
        },
        {"type": "string", "not": {"pattern": "^(?!ab)(?=.*c).*$"}},
        {"type": "object", "propertyNames": {"pattern": "^(?!x)[a-c]+$"}},
    ],
)
def test_lookaheads_in_key_patterns_and_under_not(schema):
    """Lookaheads in patternProperties, propertyNames and under 'not': judged as jsonschema
    (Python's re) judges them, over every short key or string."""
    import itertools

    import jsonschema

    from lmprog.fsm import Constraint

    c = Constraint.from_json_schema(schema)
    v = jsonschema.Draft202012Validator(schema)
    words = ["".join(w) for n in range(4) for w in itertools.product("abc:", repeat=n)]
    words += ["aws:", "aws:x", "x", "xa"]
    for w in words:
        for x in ([w], {w: "s"}, {w: 1}, {w: True}) if schema["type"] == "object" else (w,):
            text = json.dumps(x[0] if isinstance(x, list) else x)
            assert c.matches(text) == v.is_valid(json.loads(text)), text


@pytest.mark.parametrize(
    "pattern",
    [r"aws:", r"^aws:", r"^.* {2}", r"^(.*[./\\]|aws:)", r"a.{2}b", r"^(ab|a)*$", r"^$", r"x?"]
    + [r"[^a]+$", r"^[a-]{2,3}$|b -", r"(?:a|^b)\n"],
)
def test_complement_of_a_pattern_through_its_automaton(pattern):
    """``complement_source`` (a negative lookahead or ``not: {pattern}`` as a positive
    pattern) matches exactly the strings in which Python's re.search finds no match, over
    every short string of a small alphabet (ECMA's ``$`` is Python's ``\\Z``)."""
    import itertools

    from lmprog.fsm.regex.lookahead import complement_source

    positive = value_matcher(parse_regex(complement_source(pattern), "ecma"))
    python = re.compile(pattern.replace("$", r"\Z"))
    for n in range(6):
        for letters in itertools.product("ab -:\n", repeat=n):
            text = "".join(letters)
            assert bool(positive.fullmatch(text)) == (python.search(text) is None), repr(text)


def test_complement_gives_up_on_a_large_automaton():
    from lmprog.fsm.regex.lookahead import complement_source

    assert complement_source(r"a[ab]{12}$") is None  # 2^12 suffixes to remember
    assert complement_source(r"[\s\S]") == r"^(?:)$"


@pytest.mark.parametrize(
    "schema",
    [
        {"pattern": r"^(?!(.*[.\/\\]|aws:)).*$", "minLength": 1, "maxLength": 255},
        {
            "pattern": r"^(?!.* {2})[ a-zA-Z0-9.,!?;:@#$%&\-_/\\]*$",
            "minLength": 1,
            "maxLength": 200,
        },
        {"pattern": r"^((?!aws:)[\p{L}\p{Z}\p{N}_.:/=+\-@]*)$", "minLength": 1, "maxLength": 128},
        {"not": {"pattern": " {2}|^aws:"}, "minLength": 1, "maxLength": 300},
    ],
)
def test_patterns_to_avoid_beside_a_max_length_decode_to_the_end(schema):
    """Negative lookaheads (CloudFormation's Glue::Catalog, BCM::Dashboard and SageMaker::Device
    tag patterns) and ``not: {pattern}`` beside min/maxLength: random walks through the token
    engine run to the end (llguidance's ``~`` beside the counted length ran out of lexer fuel
    mid-string), and every text is valid (the ``regex`` module reads ``\\p{..}``)."""
    import random

    import regex
    from fsm_toys import random_text

    from lmprog.fsm import Constraint

    c, rng = Constraint.from_json_schema({"type": "string", **schema}), random.Random(0)
    texts = [random_text(c, rng, limit=1200) for _ in range(40)]
    assert sum(t is not None for t in texts) >= 30
    for s in (json.loads(t) for t in texts if t is not None):
        assert schema["minLength"] <= len(s) <= schema["maxLength"]
        if "pattern" in schema:
            assert regex.search(schema["pattern"], s), s
        else:
            assert not regex.search(schema["not"]["pattern"], s), s
