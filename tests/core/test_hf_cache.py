"""Hugging Face model ids resolve from the local Hugging Face cache, never the network
(issue 16, item 5): GGUF files and safetensors folders, HF_HUB_CACHE / HF_HOME layouts, a
clear error naming where it looked; a safetensors + tokenizer folder runs on the runtime."""

import pytest

from lmprog.core.models import ModelSource, hf_hub_cache, resolve_model


def _snapshot(hub, repo_id, files, rev="0123abcd", ref=True):
    """The hub layout: blobs/ holding the bytes, snapshots/<rev>/ links to them, refs/main."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name, data in files.items():
        blob = repo / "blobs" / f"blob-{abs(hash(name))}"
        blob.write_bytes(data)
        (snap / name).symlink_to(blob)
    if ref:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(rev)
    return snap


@pytest.fixture
def hub(tmp_path, monkeypatch):
    for var in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    path = tmp_path / "hub"
    path.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(path))
    return path


def test_the_cache_folder_follows_huggingface_hub(tmp_path, monkeypatch):
    for var in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hf_hub_cache() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hf_hub_cache() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hf_hub_cache() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c"))
    assert hf_hub_cache() == tmp_path / "c"


def test_a_gguf_repo_resolves_to_its_file_in_the_snapshot_refs_main_names(hub):
    snap = _snapshot(hub, "org/tiny-GGUF", {"tiny.Q4_0.gguf": b"GGUF"})
    _snapshot(hub, "org/tiny-GGUF", {"old.gguf": b"GGUF"}, rev="ffff0000", ref=False)
    source = resolve_model("org/tiny-GGUF")
    assert source == ModelSource("org/tiny-GGUF", "gguf", snap.absolute() / "tiny.Q4_0.gguf")
    assert source.path.suffix == ".gguf"  # the snapshot's name, not the blob's


def test_a_safetensors_repo_resolves_to_its_snapshot_folder(hub, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    snap = _snapshot(
        tmp_path / "home" / "hub",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        {"config.json": b"{}", "model.safetensors": b"", "tokenizer.json": b"{}"},
        ref=False,  # no refs/main: the newest snapshot
    )
    source = resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert source.kind == "hf" and source.path == snap.absolute()


def test_missing_or_unusable_repos_say_where_they_looked(hub):
    with pytest.raises(ValueError, match=r"models--org--absent.*huggingface-cli download"):
        resolve_model("org/absent")
    _snapshot(hub, "org/two", {"a.gguf": b"", "b.gguf": b""})
    with pytest.raises(ValueError, match=r"several GGUF files \['a.gguf', 'b.gguf'\]"):
        resolve_model("org/two")
    _snapshot(hub, "org/bin", {"config.json": b"{}", "pytorch_model.bin": b""})
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        resolve_model("org/bin")
    _snapshot(hub, "org/empty", {"README.md": b""})
    with pytest.raises(ValueError, match="neither config.json"):
        resolve_model("org/empty")


def test_a_safetensors_model_with_its_tokenizer_runs_on_the_runtime(hub):
    """A tiny random-weights Llama saved as transformers saves one, with the default model's
    tokenizer files, in the fake cache: lp.Runtime('org/tiny') loads and generates."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from hf_tiny import save_tiny_llama

    from lmprog.backends.runtime import Runtime
    from lmprog.core.models import load_tokenizer
    from lmprog.core.protocol import GenerateRequest
    from lmprog.core.sampling import SamplingParams

    tok = load_tokenizer(resolve_model())
    tok = tok.hf_tokenizer() if hasattr(tok, "hf_tokenizer") else tok
    staging = save_tiny_llama(hub.parent / "staging", tok, max_position_embeddings=256)
    files = {p.name: p.read_bytes() for p in staging.iterdir() if p.is_file()}
    assert "model.safetensors" in files and "tokenizer.json" in files
    _snapshot(hub, "org/tiny-llama", files)

    rt = Runtime("org/tiny-llama", device="cpu", max_total_tokens=512)
    try:
        assert rt.model_name == "org/tiny-llama"
        result = rt.generate(
            GenerateRequest(prompt="Hello", params=SamplingParams(max_tokens=4, temperature=0))
        )
        assert result.completion_tokens == 4 and isinstance(result.text, str)
    finally:
        rt.shutdown()
