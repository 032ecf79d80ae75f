"""A GGUF the runtime cannot read is one ValueError naming the file and what to do: not a GGUF
(gguf says only "GGUF magic invalid"), metadata a converter should have written (was a bare
KeyError: 'tokenizer.ggml.tokens'), a truncated file (was numpy's reshape error)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from lmprog.runtime.models.loaders.gguf import read_gguf

gguf = pytest.importorskip("gguf")


def _without_vocabulary(path):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tensor("token_embd.weight", np.zeros((10, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _bundled_gguf():
    from lmprog.core.models import resolve_model

    return resolve_model(None).path


def test_a_file_that_is_not_a_gguf(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04 a zip, not a gguf")
    with pytest.raises(ValueError, match=rf"{re.escape(str(junk))} is not a GGUF file.*b'PK"):
        read_gguf(junk)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.gguf is not a GGUF file"):
        read_gguf(empty)


def test_missing_metadata_is_named(tmp_path):
    path = _without_vocabulary(tmp_path / "novocab.gguf")
    with pytest.raises(
        ValueError,
        match=r"novocab\.gguf lacks the GGUF metadata 'tokenizer\.ggml\.tokens'.*convert",
    ):
        read_gguf(path)


@pytest.mark.parametrize("size", [1_000, 2_000_000])
def test_a_truncated_file_says_so(tmp_path, size):
    with open(_bundled_gguf(), "rb") as f:
        head = f.read(size)
    path = tmp_path / "truncated.gguf"
    path.write_bytes(head)
    with pytest.raises(
        ValueError, match=r"truncated\.gguf could not be read.*truncated or damaged"
    ):
        read_gguf(path)


def test_the_runtime_reports_the_same_line(tmp_path):
    import lmprog as lp

    path = _without_vocabulary(tmp_path / "novocab.gguf")
    with pytest.raises(ValueError, match=r"lacks the GGUF metadata 'tokenizer\.ggml\.tokens'"):
        lp.Runtime(str(path), device="cpu")
