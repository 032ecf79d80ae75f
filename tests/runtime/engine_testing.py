"""Shared by the engine tests: a tiny random Llama with the default model's real tokenizer
(49k vocab), random weights for any config, an engine builder, prompts sharing a head, and
batch helpers."""

from __future__ import annotations

import pytest
import torch

from lmprog.core.models import load_tokenizer, resolve_model
from lmprog.core.sampling import SamplingParams as SP
from lmprog.runtime.config import CacheConfig, SchedulerConfig
from lmprog.runtime.engine.engine import EngineConfig
from lmprog.runtime.engine.io import EngineRequest
from lmprog.runtime.engine.launch import launch_engine
from lmprog.runtime.models import ModelConfig, build_model

EOS = (0, 2)
TINY = ModelConfig(
    "llama",
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    max_position=256,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_ids=(2,),
)


@pytest.fixture(scope="module")
def tok():
    """The default model's tokenizer; its tests skip where the bundled model is not installed
    (a GPU machine without it, say)."""
    try:
        source = resolve_model()
    except ValueError as e:  # the model's package or its file is missing
        pytest.skip(f"the default model is not installed: {e}")
    return load_tokenizer(source)


def random_llama(
    config: ModelConfig, std: float, seed: int = 0, device: str = "cpu", attention: str = "torch"
) -> torch.nn.Module:
    """`config` with N(0, std) weights and unit norm weights, fp32. std 0.3: the output
    depends on the whole context; std 0.1: it repeats a token for a while, then moves on."""
    net = build_model(config, device=device, dtype="float32", attention=attention)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(0.0, std, generator=g)
    return net


@pytest.fixture(scope="module")
def model():
    """Random weights large enough (std 0.3) that the output depends on the whole context
    rather than settling into repeating one token."""
    return random_llama(TINY, 0.3)


def engine_for(
    model,
    tok,
    *,
    radix=True,
    slots=4096,
    budget=512,
    max_reqs=32,
    jump=True,
    overlap=False,
    speculative=None,
    proposer=None,
    **sched,
):
    """An engine checking its bookkeeping every step; **sched: SchedulerConfig's fields."""
    return launch_engine(
        model,
        tok,
        eos_token_ids=EOS,
        max_total_tokens=slots,
        cache_config=CacheConfig(radix_cache=radix),
        scheduler_config=SchedulerConfig(
            max_num_batched_tokens=budget, max_running_requests=max_reqs, **sched
        ),
        engine_config=EngineConfig(jump_forward=jump, check_integrity=True, overlap=overlap),
        speculative=speculative,
        proposer=proposer,
    )


SHARED = list(range(1000, 1024))  # a shared 24-token head, so the radix cache has work
PROMPTS = [SHARED[: 8 + i % 16] + [3000 + 7 * i + j for j in range(1 + i % 5)] for i in range(16)]


def greedy(n=12, **kw):
    return SP(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def run_all(engine, prompts, params, together=True):
    if together:
        handles = [engine.submit(EngineRequest(tuple(p), params)) for p in prompts]
        return [h.result(timeout=120) for h in handles]
    return [engine.submit(EngineRequest(tuple(p), params)).result(timeout=120) for p in prompts]
