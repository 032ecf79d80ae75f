"""Assembling an engine around a model: KV pool size, scheduler, runner, speculator, engine
thread (the model itself is built by lmprog.runtime.assemble).

    net = assemble_model(path_or_name, device="auto")
    engine = launch_engine(net, tokenizer, eos_token_ids=..., max_total_tokens=None)

The KV pool's size comes from executor.kv_pool.kv_slots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lmprog.core.errors import LoraError

from ..config import AttentionSinkConfig, CacheConfig, LoraConfig, SchedulerConfig
from ..executor.kv_pool import kv_slots
from ..executor.kv_shift import check_attention_sinks
from ..executor.model_runner import ModelRunner
from ..lora import LoraManager
from ..parallel.channel import StepChannel
from ..parallel.sharding import ShardPlan, gather_embedding
from ..parallel.worker import KVRequest, RunnerSpec
from ..scheduler import Scheduler
from ..speculative import Proposer, SpeculativeConfig, build_proposer
from ..speculative.speculator import Speculator
from .engine import Engine, EngineConfig

if TYPE_CHECKING:
    import torch

    from ..models.llama import LlamaForCausalLM


def launch_engine(
    model: LlamaForCausalLM,
    tokenizer: Any,
    *,
    eos_token_ids: tuple[int, ...],
    max_total_tokens: int | None = None,
    context_length: int | None = None,
    cache_config: CacheConfig | None = None,
    scheduler_config: SchedulerConfig | None = None,
    engine_config: EngineConfig | None = None,
    gpu_memory_fraction: float = 0.85,
    cuda_graphs: bool = True,
    speculative: SpeculativeConfig | None = None,
    proposer: Proposer | None = None,
    tp: Any = None,
    attention_sinks: AttentionSinkConfig | None = None,
    lora: LoraConfig | None = None,
    lora_adapters: Any = (),
) -> Engine:
    """Start an engine thread serving `model` (as assemble_model returns it; no transform here).

    cuda_graphs, speculative (its proposer built here unless given), tp (rank 0's TPGroup,
    owned by the engine from here), attention_sinks, lora / lora_adapters (the adapter pool is
    sized before the KV pool; the model's projections are wrapped, so it serves this engine
    alone): None or False turns each off. Design: docs/design/engine-step.md.
    """
    try:
        engine = _launch(
            model,
            tokenizer,
            eos_token_ids,
            max_total_tokens,
            context_length,
            cache_config,
            scheduler_config,
            engine_config,
            gpu_memory_fraction,
            cuda_graphs,
            speculative,
            proposer,
            tp,
            attention_sinks,
            lora,
            tuple(lora_adapters),
        )
    except BaseException:
        if tp is not None:  # the workers wait for this runner: let them go
            tp.close()
        raise
    if tp is not None:  # a worker dying while the engine idles stops it too
        tp.on_failure = lambda error: engine.shutdown(timeout=0, error=error)
    return engine


def _launch(
    model: LlamaForCausalLM,
    tokenizer: Any,
    eos_token_ids: tuple[int, ...],
    max_total_tokens: int | None,
    context_length: int | None,
    cache_config: CacheConfig | None,
    scheduler_config: SchedulerConfig | None,
    engine_config: EngineConfig | None,
    gpu_memory_fraction: float,
    cuda_graphs: bool,
    speculative: SpeculativeConfig | None,
    proposer: Proposer | None,
    tp: Any,
    attention_sinks: AttentionSinkConfig | None,
    lora: LoraConfig | None,
    lora_adapters: tuple[Any, ...],
) -> Engine:
    context = model.config.max_position if context_length is None else context_length
    if isinstance(context, bool) or not isinstance(context, int) or context < 2:
        raise ValueError(f"context_length must be an int >= 2, got {context!r}")
    scheduler_config = scheduler_config or SchedulerConfig()
    if attention_sinks is not None:
        check_attention_sinks(model, tp)
    head = None if speculative is None or proposer is not None else speculative.method
    if head in ("eagle", "medusa") and attention_sinks is not None:
        raise ValueError(f"speculative={head!r} does not work with attention sinks yet")
    manager = None
    if lora is not None or lora_adapters:
        manager = make_lora_manager(model, lora, lora_adapters, tp, attention_sinks)
    kv_dtype = (cache_config or CacheConfig()).kv_cache_dtype
    embedding = None
    if tp is not None:
        pool = None if manager is None else manager.pool_config()
        eagle = head == "eagle"  # its head shares the target's whole token embedding
        tp.send_object(KVRequest(max_total_tokens, gpu_memory_fraction, kv_dtype, pool, eagle))
        embedding = gather_embedding(model, tp) if eagle else None
    speculator = make_speculator(
        model,
        speculative,
        proposer,
        max_requests=scheduler_config.max_running_requests,
        context_length=context,
        trees=attention_sinks is None,
        embedding=embedding,
    )
    num_slots = kv_slots(model, max_total_tokens, gpu_memory_fraction, kv_dtype)
    if tp is not None:
        num_slots = tp.min_int(num_slots)
    scheduler = Scheduler(
        num_slots,
        context,
        scheduler_config,
        cache_config,
        attention_sinks,
        max_loras=None if manager is None else manager.max_loras_per_batch,
    )
    runner_args: dict[str, Any] = dict(
        cuda_graphs=cuda_graphs,
        piecewise_tokens=scheduler.config.max_num_batched_tokens,
        kv_cache_dtype=kv_dtype,
    )
    channel = None
    if tp is not None:
        shape = scheduler.req_to_token.shape
        tp.send_object(RunnerSpec(scheduler.cache.capacity, shape, **runner_args))
        channel = StepChannel(tp, manager)
    runner = ModelRunner(
        model,
        scheduler.cache.capacity,
        scheduler.req_to_token,
        channel=channel,
        lora=manager,
        hidden=None if speculator is None else speculator.head_capture,
        **runner_args,
    )
    return Engine(
        runner,
        scheduler,
        tokenizer,
        eos_token_ids=eos_token_ids,
        config=engine_config,
        speculator=speculator,
    )


def make_lora_manager(
    model: LlamaForCausalLM,
    config: LoraConfig | None,
    adapters: tuple[Any, ...],
    tp: Any,
    sinks: AttentionSinkConfig | None,
) -> Any:
    """The LoraManager around `model`, or a LoraError naming what LoRA does not combine
    with yet (attention sinks). Speculative decoding combines: the target verifies each
    request's drafts under its adapter (a draft model drafts without it; n-gram drafts need
    no model), so outputs keep the adapted model's distribution. Tensor parallelism
    combines: `model` is rank 0's shard, its pool holds rank 0's part of each adapter, and
    its changes go to the other ranks with the steps (lmprog.runtime.parallel.channel)."""

    if sinks is not None:
        raise LoraError(
            "LoRA adapters do not work with attention sinks yet; use no attention_sink_size"
        )
    shard = None if tp is None else ShardPlan(model.config, tp.rank, tp.world)
    return LoraManager(
        model, config or LoraConfig(), adapters, shard=shard, mirrored=tp is not None
    )


def make_speculator(
    model: LlamaForCausalLM,
    config: SpeculativeConfig | None,
    proposer: Proposer | None = None,
    *,
    max_requests: int | None = None,
    context_length: int | None = None,
    trees: bool = True,
    embedding: torch.Tensor | None = None,
) -> Speculator | None:
    """The engine's Speculator for `model`, or None when config and proposer are None.
    max_requests, context_length: the engine's max_running_requests and context length (a
    built draft model keeps state for that many requests of up to that length). trees: verify
    token trees (False under attention sinks: a tree's first branch is verified as a chain).
    embedding: the target's whole token embedding where `model` holds a shard of it (tensor
    parallelism), for an EAGLE-3 head to share."""
    if config is None and proposer is None:
        return None
    config = config if config is not None else SpeculativeConfig()
    if not isinstance(config, SpeculativeConfig):
        raise TypeError(f"speculative must be a SpeculativeConfig, got {type(config).__name__}")
    param = next(model.parameters())
    vocab = model.config.vocab_size
    name = None if proposer is None else type(proposer).__name__
    if proposer is None:
        proposer = build_proposer(
            config,
            vocab_size=vocab,
            device=param.device,
            dtype=param.dtype,
            max_requests=max_requests,
            context_length=context_length,
            target=model,
            target_embedding=embedding,
        )
    return Speculator(
        proposer, config, vocab_size=vocab, device=param.device, name=name, trees=trees
    )
