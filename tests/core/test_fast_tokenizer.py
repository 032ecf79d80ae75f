"""The cached tokenizer without transformers (core/tokenizer.py) equals transformers' own, and
`lp.LlamaCpp()` with warm caches never imports transformers (nor torch)."""

import json
import os
import random
import subprocess
import sys
import textwrap

import pytest

from lmprog.core import models
from lmprog.core.models import load_tokenizer, resolve_model, tokenizer_cache_path
from lmprog.core.tokenizer import CHECK_TEXTS, META_FILE, FastTokenizer


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A fresh cache dir with the default model's tokenizer built (by transformers) in it."""
    path = tmp_path_factory.mktemp("lmprog-cache")
    old = os.environ.get("LMPROG_CACHE_DIR")
    os.environ["LMPROG_CACHE_DIR"] = str(path)
    saved = dict(models._tokenizers)
    models._tokenizers.clear()
    try:
        built = load_tokenizer(resolve_model())
        models._tokenizers.clear()
        warm = load_tokenizer(resolve_model())
        yield path, built, warm
    finally:
        models._tokenizers.clear()
        models._tokenizers.update(saved)
        if old is None:
            del os.environ["LMPROG_CACHE_DIR"]
        else:
            os.environ["LMPROG_CACHE_DIR"] = old


def _texts():
    rng = random.Random(16)
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<|"]
    alphabet = (
        "abc XYZ 019 .,;:!?'\"-_\n\t\r  éüß中文日本語한국어🙂👍🏽\u200d\u0301\u00a0{}[]<>|\\/"
    )
    out = list(CHECK_TEXTS)
    for _ in range(300):
        n = rng.randint(1, 40)
        pieces = [rng.choice(alphabet) for _ in range(n)]
        if rng.random() < 0.3:
            pieces.insert(rng.randrange(n + 1), rng.choice(specials))
        out.append("".join(pieces))
    return out


def test_the_warm_load_is_a_fast_tokenizer_with_a_checked_description(cache):
    path, built, warm = cache
    assert type(built).__module__.startswith("transformers.")  # the miss built it
    assert isinstance(warm, FastTokenizer)
    meta = json.loads((tokenizer_cache_path(resolve_model()) / META_FILE).read_text())
    assert meta["verified"] is True and meta["eos_token_id"] == 2


def test_encode_and_decode_equal_transformers(cache):
    _, hf, fast = cache
    for text in _texts():
        for add in (False, True):
            assert fast.encode(text, add_special_tokens=add) == hf.encode(
                text, add_special_tokens=add
            ), text
        assert fast.encode(text, add_special_tokens=False, split_special_tokens=True) == (
            hf.encode(text, add_special_tokens=False, split_special_tokens=True)
        )
        ids = fast.encode(text, add_special_tokens=False)
        for skip in (False, True):
            assert fast.decode(ids, skip_special_tokens=skip) == hf.decode(
                ids, skip_special_tokens=skip
            )
    rng = random.Random(0)
    for _ in range(500):  # arbitrary id windows: partial UTF-8, specials, leading spaces
        ids = [rng.randrange(len(hf)) if rng.random() < 0.9 else rng.randrange(20) for _ in "abcd"]
        for skip in (False, True):
            kw = {"skip_special_tokens": skip, "clean_up_tokenization_spaces": False}
            assert fast.decode(ids, **kw) == hf.decode(ids, **kw)
    assert fast.decode(5) == hf.decode(5)


def test_attributes_lmprog_reads_equal_transformers(cache):
    _, hf, fast = cache
    for name in (
        "eos_token_id",
        "bos_token_id",
        "pad_token_id",
        "eos_token",
        "bos_token",
        "all_special_tokens",
        "all_special_ids",
        "special_tokens_map",
        "add_bos_token",
        "chat_template",
    ):
        assert getattr(fast, name) == getattr(hf, name), name
    assert len(fast) == len(hf) and fast.get_vocab() == hf.get_vocab()
    assert {i: t.content for i, t in fast.added_tokens_decoder.items()} == {
        i: t.content for i, t in hf.added_tokens_decoder.items()
    }
    ids = list(range(0, len(hf), 97))
    assert fast.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)
    assert fast.convert_ids_to_tokens(ids, skip_special_tokens=True) == hf.convert_ids_to_tokens(
        ids, skip_special_tokens=True
    )
    tokens = hf.convert_ids_to_tokens(ids)
    assert fast.convert_tokens_to_string(tokens) == hf.convert_tokens_to_string(tokens)
    chat = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi ünï"}]
    assert fast.apply_chat_template(chat, add_generation_prompt=True) == hf.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True
    )


def test_what_lmprog_builds_from_it_is_the_same(cache):
    from lmprog.core.chat import template_from_tokenizer
    from lmprog.core.prompt import encode_as_text, encode_prompt
    from lmprog.fsm.vocab import TokenVocab

    _, hf, fast = cache
    ours_v, theirs_v = TokenVocab.from_tokenizer(fast), TokenVocab.from_tokenizer(hf)
    assert ours_v.token_bytes == theirs_v.token_bytes
    assert ours_v.eos_token_id == theirs_v.eos_token_id
    ours, theirs = template_from_tokenizer(fast), template_from_tokenizer(hf)
    assert ours.role_prefix("user") == theirs.role_prefix("user")
    for text in ("x <|im_end|> y", " <|im_start|>user", "日本 <|endoftext|>"):
        assert encode_prompt(fast, text) == encode_prompt(hf, text)
        assert encode_as_text(fast, text) == encode_as_text(hf, text)


def test_an_unchecked_or_damaged_description_falls_back_to_transformers(cache, monkeypatch):
    path, _, _ = cache
    saved = tokenizer_cache_path(resolve_model())
    meta_file = saved / META_FILE
    good = meta_file.read_text()
    monkeypatch.setattr(models, "_tokenizers", {})
    try:
        meta_file.write_text(json.dumps({**json.loads(good), "verified": False}))
        assert FastTokenizer.load(saved) is None
        meta_file.write_text("{not json")
        tok = load_tokenizer(resolve_model())  # rebuilt description, this process: transformers
        assert type(tok).__module__.startswith("transformers.")
        assert json.loads(meta_file.read_text())["verified"] is True
    finally:
        meta_file.write_text(good)


def test_llamacpp_with_warm_caches_imports_neither_transformers_nor_torch(cache):
    pytest.importorskip("llama_cpp")
    path, _, _ = cache
    code = textwrap.dedent(
        """
        import sys
        import lmprog as lp
        backend = lp.LlamaCpp()
        print(sorted({m.split('.')[0] for m in sys.modules} & {'transformers', 'torch'}))
        """
    )
    env = {**os.environ, "LMPROG_CACHE_DIR": str(path)}
    for _ in range(2):  # the second with every cache warm (the GGUF check's too)
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
