"""Special tokens inside constraints: a grammar names one (`<|call|>`, or `<[id]>` by id) and
the guide allows exactly that id there; jump-forward forces it as its id; a name the tokenizer
lacks is a ConstraintError naming it where the constraint is compiled for that tokenizer."""

from __future__ import annotations

import pytest

from lmprog.core.errors import ConstraintError
from lmprog.fsm import Constraint
from lmprog.fsm.index import TokenIndex, matches_bytes
from lmprog.fsm.jump import jump_forward
from tests.fsm.fsm_toys import special_tokenizer

pytest.importorskip("llguidance")


@pytest.fixture(scope="module")
def tok():
    return special_tokenizer()


def _ids(tok):
    return {name: tok.convert_tokens_to_ids(name) for name in ("<|channel|>", "<|call|>")}


def _allowed(guide):
    return set(guide.allowed_token_ids().tolist())


def test_vocabulary_names_its_special_tokens(tok):
    from lmprog.fsm.vocab import TokenVocab

    vocab = TokenVocab.from_tokenizer(tok)
    call = tok.convert_tokens_to_ids("<|call|>")
    assert vocab.token_bytes[call] is None and vocab.special_ids["<|call|>"] == call
    assert vocab.token_bytes[tok.convert_tokens_to_ids("<think>")] == b"<think>"  # added text
    assert vocab.special_ids["<eos>"] == vocab.eos_token_id


def test_named_special_token_is_exactly_its_id(tok):
    c = Constraint.from_ebnf('start: "ab" <|call|>')  # construction does not need the tokenizer
    guide = TokenIndex.get(c, tok).new_guide()
    call = _ids(tok)["<|call|>"]
    guide.advance_all(tok.encode("ab", add_special_tokens=False))
    assert _allowed(guide) == {call}
    assert guide.is_allowed(call) and not guide.is_allowed(tok.convert_tokens_to_ids("<"))
    assert not guide.is_allowed(_ids(tok)["<|channel|>"])
    guide.advance(call)
    assert guide.can_stop() and _allowed(guide) == {guide.index.eos_token_id}
    # over text (a detokenized output), the name's text reads as the token
    assert matches_bytes(c, b"ab<|call|>") and not matches_bytes(c, b"ab<|call|")


def test_by_id_and_spelled_form_both(tok):
    call = _ids(tok)["<|call|>"]
    c = Constraint.from_ebnf(f'start: "x" (<[{call}]> | "<|call|>")')
    guide = TokenIndex.get(c, tok).new_guide()
    guide.advance(tok.convert_tokens_to_ids("x"))
    allowed = _allowed(guide)
    assert allowed == {call, tok.convert_tokens_to_ids("<")}  # the id, and the text's first byte
    assert c.matches("x<|call|>")  # the spelled form over bytes


def test_walk_through_masks_produces_the_special_id(tok):
    c = Constraint.from_ebnf('start: <|channel|> ("commentary" | "final") <|call|>')
    guide = TokenIndex.get(c, tok).new_guide()
    out, eos = [], guide.index.eos_token_id
    while not guide.is_finished():
        allowed = [t for t in guide.allowed_token_ids().tolist() if t != eos]
        if not allowed:
            break
        token = max(allowed)  # the special ids are the highest here
        guide.advance(token)
        out.append(token)
    ids = _ids(tok)
    assert out[0] == ids["<|channel|>"] and out[-1] == ids["<|call|>"]
    assert tok.decode(out) in ("<|channel|>commentary<|call|>", "<|channel|>final<|call|>")


def test_jump_forward_forces_the_special_id(tok):
    ids = _ids(tok)
    c = Constraint.from_ebnf('start: "a" "bc" <|call|> "true" <|channel|> ("x" | "y")')
    guide = TokenIndex.get(c, tok).new_guide()
    out = [tok.convert_tokens_to_ids("a")]
    guide.advance(out[0])
    result = jump_forward(guide, out, tok)
    out = result.apply(out)
    assert tok.decode(out) == "abc<|call|>true<|channel|>"
    assert ids["<|call|>"] in out and out[-1] == ids["<|channel|>"]  # ids, not spellings
    assert result.drop_last_n_tokens == 1  # "a" + "bc" retokenized as the tokenizer's "abc"
    assert guide.num_tokens == len(out) and not guide.can_stop()
    # the next jump has nothing forced; after "x" the text is complete
    assert jump_forward(guide, out, tok).is_noop
    guide.advance(tok.convert_tokens_to_ids("x"))
    assert guide.can_stop()


def test_jump_never_retokenizes_across_a_special_token(tok):
    call = _ids(tok)["<|call|>"]
    c = Constraint.from_ebnf('start: "a" <|call|> "b" "c"')
    guide = TokenIndex.get(c, tok).new_guide()
    out = [tok.convert_tokens_to_ids("a"), call]
    guide.advance_all(out)
    result = jump_forward(guide, out, tok)
    assert result.drop_last_n_tokens == 0  # the window stops at the special token
    assert tok.decode(result.apply(out)) == "a<|call|>bc"
    # with a budget of one token: the special id alone
    guide = TokenIndex.get(Constraint.from_ebnf('start: "a" <|call|> "bc"'), tok).new_guide()
    guide.advance(out[0])
    one = jump_forward(guide, out[:1], tok, max_new_tokens=1)
    assert one.new_token_ids == (call,) and guide.num_tokens == 2


def test_unknown_special_token_names_it_at_index_time(tok):
    c = Constraint.from_ebnf('start: "a" <|return|>')  # fine without a tokenizer
    with pytest.raises(ConstraintError, match=r"special token <\|return\|>.*does not have"):
        TokenIndex.get(c, tok)


def test_grammar_errors_still_raised_at_construction():
    with pytest.raises(ConstraintError):
        Constraint.from_ebnf('start: "a" <|call|> undefined_rule')


def test_think_as_added_text_token(tok):
    """A non-special added token (Qwen3's <think>) is text: the quoted literal allows it."""
    think = tok.convert_tokens_to_ids("<think>")
    guide = TokenIndex.get(Constraint.from_ebnf('start: "<think>" "x"'), tok).new_guide()
    assert think in _allowed(guide)


HARMONY_SPECIAL = (
    "<|channel|>",
    "<|message|>",
    "<|call|>",
    "<|end|>",
    "<|start|>",
    "<|constrain|>",
)


def test_thinking_markers_as_special_tokens():
    """gpt-oss's thinking block, its markers special tokens: the ids, not their spelling."""
    from lmprog.core.reasoning import FORMATS
    from lmprog.fsm.compose import special_markers
    from lmprog.fsm.thinking import for_format

    fmt = FORMATS["gpt-oss"]
    tok = special_tokenizer(HARMONY_SPECIAL)
    specials = special_markers(tok, (fmt.start, fmt.end, fmt.after_end, fmt.answer_prefix))
    assert set(specials) == set(HARMONY_SPECIAL) - {"<|call|>", "<|constrain|>"}
    whole = for_format(Constraint.from_regex("yes|no"), fmt, "none", specials=specials)
    text = "<|channel|>analysis<|message|>Hm, <|end no.<|end|><|start|>assistant"
    ids = tok.encode(text + "<|channel|>final<|message|>yes", add_special_tokens=False)
    guide = TokenIndex.get(whole, tok).new_guide()
    assert _allowed(guide) == {specials["<|channel|>"]}  # not "<" spelled
    end = ids.index(specials["<|end|>"])
    guide.advance_all(ids[:end])  # the thinking's text, then its end marker's id
    assert specials["<|end|>"] in _allowed(guide)
    guide.advance(ids[end])
    out = ids[: end + 1]
    result = jump_forward(guide, out, tok)  # the next message's header, forced
    assert result.new_token_ids[0] == specials["<|start|>"]
    assert result.new_token_ids[-1] == specials["<|message|>"]
    assert tok.decode(result.new_token_ids) == "<|start|>assistant<|channel|>final<|message|>"
    assert tok.decode(result.apply(out)) == text + "<|channel|>final<|message|>"
    opened = for_format(Constraint.from_regex("yes|no"), fmt, "open", specials=specials)
    assert opened.matches("thinking<|end|><|start|>assistant<|channel|>final<|message|>no")
    assert not opened.matches("thinking<|end|><|channel|>final<|message|>no")


def test_marker_without_a_lark_name_goes_by_id():
    """Mistral's `[TOOL_CALLS]` is no `<...>` name llguidance's Lark reads: `<[id]>`."""
    from lmprog.fsm import compose as c

    tok = special_tokenizer(("[TOOL_CALLS]", "<|call|>"))
    specials = c.special_markers(tok, ["[TOOL_CALLS] [", "x<|call|>"])
    calls = tok.convert_tokens_to_ids("[TOOL_CALLS]")
    part = c.seq(c.marked_text("[TOOL_CALLS] [", specials), c.marked_text("x<|call|>", specials))
    whole = c.constraint(part, "calls")
    assert f"<[{calls}]>" in whole.lark and "<|call|>" in whole.lark
    guide = TokenIndex.get(whole, tok).new_guide()
    assert _allowed(guide) == {calls}
    guide.advance_all(tok.encode("[TOOL_CALLS] [x<|call|>", add_special_tokens=False))
    assert guide.can_stop()


def test_a_grammar_cannot_name_the_eos(tok):
    """EOS ends a constrained output where the grammar is complete (unchanged): a grammar
    naming it as a token of its text is refused, naming it; its text in quotes is fine."""
    with pytest.raises(ConstraintError, match=r"<eos>, this tokenizer's EOS"):
        TokenIndex.get(Constraint.from_ebnf('start: "a" <eos>'), tok)
    with pytest.raises(ConstraintError, match=r"<\[270\]>, this tokenizer's EOS"):
        TokenIndex.get(Constraint.from_ebnf('start: "a" <[270]>'), tok)
    guide = TokenIndex.get(Constraint.from_ebnf('start: "a" "<eos>" /<eos>?/'), tok).new_guide()
    assert guide.index.eos_token_id not in _allowed(guide)


def test_a_marker_name_inside_a_json_string_reads_as_its_text():
    """Over a finished text a marker's name is the token only where the grammar takes the
    token: inside the arguments' JSON string it is their text."""
    from lmprog.fsm import compose as cc

    args = Constraint.from_json_schema(
        {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    )
    specials = {"<|message|>": 300, "<|end|>": 301}
    grammar = cc.seq(
        cc.marked_text("<|message|>", specials), cc.embed(args), cc.special("<|end|>", 301)
    )
    c = cc.constraint(grammar, "call")
    assert c.matches('<|message|>{"s": "a"}<|end|>')
    assert c.matches('<|message|>{"s": "x <|end|> y <|message|>"}<|end|>')
    assert c.parse('<|message|>{"s": "<|end|>"}<|end|>') == '<|message|>{"s": "<|end|>"}<|end|>'
    assert not c.matches('<|message|>{"s": "a"}')  # the end marker is the token's, not text
    assert not c.matches('<|message|>{"s": "a"}<|end|><|end|>')
    assert not c.matches('<|message|>{"s": "<|end|>"<|end|>')
