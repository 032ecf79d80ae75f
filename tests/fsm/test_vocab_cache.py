"""The vocabulary's bytes cached on disk for a tokenizer loaded from a folder: read back equal,
rebuilt when damaged or when the tokenizer around the same tokenizer.json differs."""

from __future__ import annotations

import pytest
from fsm_toys import byte_level_tokenizer

from lmprog.fsm import vocab as vocab_mod


@pytest.fixture
def saved(tmp_path, monkeypatch):
    """(a tokenizer loaded from a folder, that folder); the cache in tmp_path/cache."""
    from transformers import AutoTokenizer

    folder = tmp_path / "tok"
    byte_level_tokenizer().save_pretrained(folder)
    monkeypatch.setenv("LMPROG_CACHE_DIR", str(tmp_path / "cache"))
    return AutoTokenizer.from_pretrained(str(folder)), folder


def _not_read(monkeypatch):
    def fail(tokenizer):
        raise AssertionError("the vocabulary was read out of the tokenizer, not the cache")

    monkeypatch.setattr(vocab_mod, "_read_vocab", fail)


def test_a_saved_tokenizer_has_its_vocabulary_cached(saved, monkeypatch, tmp_path):
    tok, _ = saved
    built = vocab_mod._vocab_from_tokenizer(tok)
    (entry,) = (tmp_path / "cache" / "vocab").iterdir()
    assert {p.name for p in entry.iterdir()} == {
        "bytes.bin",
        "lengths.bin",
        "order.bin",
        "vocab.json",
    }
    _not_read(monkeypatch)
    cached = vocab_mod._vocab_from_tokenizer(tok)
    assert cached.token_bytes == built.token_bytes
    assert cached.eos_token_id == built.eos_token_id
    assert cached.fingerprint == built.fingerprint
    assert "sorted_tokens" in cached.__dict__  # read back, not sorted again
    assert cached.sorted_tokens[0] == built.sorted_tokens[0]
    assert cached.sorted_tokens[1].tolist() == built.sorted_tokens[1].tolist()
    cached.__dict__.pop("fingerprint")
    assert cached.fingerprint == built.fingerprint  # the stored one is the computed one


def test_a_damaged_entry_is_rebuilt(saved, tmp_path):
    tok, _ = saved
    built = vocab_mod._vocab_from_tokenizer(tok)
    (entry,) = (tmp_path / "cache" / "vocab").iterdir()
    data = bytearray((entry / "bytes.bin").read_bytes())
    data[:4] = b"XXXX"
    (entry / "bytes.bin").write_bytes(bytes(data))
    again = vocab_mod._vocab_from_tokenizer(tok)
    assert again.token_bytes == built.token_bytes


def test_another_tokenizer_over_the_same_file_is_not_served_the_cache(saved):
    from transformers import AutoTokenizer

    tok, folder = saved
    first = vocab_mod._vocab_from_tokenizer(tok)
    other = AutoTokenizer.from_pretrained(str(folder), eos_token="abc")  # a text token as EOS
    vocab = vocab_mod._vocab_from_tokenizer(other)
    abc = other.convert_tokens_to_ids("abc")
    assert vocab.eos_token_id == abc != first.eos_token_id
    assert vocab.token_bytes[abc] is None and first.token_bytes[abc] == b"abc"


def test_a_tokenizer_without_a_folder_is_read_each_time(monkeypatch, tmp_path):
    monkeypatch.setenv("LMPROG_CACHE_DIR", str(tmp_path / "cache"))
    vocab_mod._vocab_from_tokenizer(byte_level_tokenizer())
    assert not (tmp_path / "cache").exists()
