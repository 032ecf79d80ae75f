"""Tiny HF folders lp.Runtime loads like a real model's: the default model's tokenizer, and
a tiny random-weights Llama saved as transformers saves one beside it
(tests/core/test_hf_cache.py, tests/backends/test_runtime_dp.py, tests/runtime/tp_testing.py)."""

from __future__ import annotations

import copy


def default_hf_tokenizer():
    """The default model's tokenizer as a transformers tokenizer (save_pretrained, len), a copy
    the caller may change (the loaded one is shared by the process); skips the test where the
    default model is not installed."""
    import pytest

    from lmprog.core.models import load_tokenizer, resolve_model

    try:
        tok = load_tokenizer(resolve_model())
    except ValueError as e:
        pytest.skip(f"the default model is not installed: {e}")
    return copy.deepcopy(tok.hf_tokenizer() if hasattr(tok, "hf_tokenizer") else tok)


def save_tiny_llama(folder, tok, max_position_embeddings: int = 512):
    """Write the model (seed 0) and `tok` (an HF tokenizer) into folder; returns folder."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
