"""LoraManager: the adapters an engine serves, the device pool they page through, and each
step's layout.

    manager = LoraManager(model, LoraConfig(...), [read_adapter(path, config, name="sql")])
    uid = manager.resolve("sql")                 # submission: the request's Req.lora_id
    plan = manager.prepare(batch)                # each step: slots paged in, the layout

Under tensor parallelism rank 0's manager is `mirrored`: what it does to its pool (adapters
loaded and dropped, slots paged in) is logged, sent to the other ranks before the next step
(`take_changes`) and repeated there on their shards (`follow`).
Engine thread only, except `read`. Paging, unloading, ranks: docs/design/lora.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from lmprog.core.errors import LoraError

from ..config import LORA_TARGET_MODULES, LoraConfig
from .adapter import LoraAdapter, check_model_supports_lora, read_adapter
from .layers import LoraContext, attach_lora_
from .ops import LoraStepPlan, plan_lora_step
from .pool import LoraPool, Staged

if TYPE_CHECKING:
    from ..models.llama import LlamaForCausalLM
    from ..parallel.sharding import ShardPlan

log = logging.getLogger(__name__)
DEFAULT_RANK = 16
# what a mirrored manager did to its pool, for the other ranks to repeat in order:
# ("load", uid, LoraAdapter), ("drop", uid), ("write", slot, uid)
Change = tuple[Any, ...]


@dataclass
class _Loaded:
    name: str
    path: str
    uid: int
    rank: int
    targets: frozenset[str]
    staged: Staged


class LoraManager:
    """See docs/design/lora.md. `adapters`: read at start-up (they size the pool when the
    config leaves max_lora_rank / lora_target_modules to them). shard: this rank's part of
    a tensor-parallel model; mirrored: log the pool's changes for the other ranks (rank 0
    of a tensor-parallel group; they build theirs from `pool_config()` and `follow`)."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        config: LoraConfig,
        adapters: Sequence[LoraAdapter] = (),
        shard: ShardPlan | None = None,
        *,
        mirrored: bool = False,
    ) -> None:
        check_model_supports_lora(model)
        self.config = config
        self.model_config = model.config
        param = next(model.parameters())
        rank = config.max_lora_rank or max((a.rank for a in adapters), default=DEFAULT_RANK)
        targets = config.lora_target_modules
        if targets is None:
            found = set().union(*(a.targets for a in adapters)) if adapters else set()
            targets = tuple(m for m in LORA_TARGET_MODULES if m in found) or LORA_TARGET_MODULES
        self.pool = LoraPool(
            model.config,
            slots=config.max_loras_per_batch,
            max_rank=rank,
            targets=targets,
            dtype=param.dtype,
            device=param.device,
            shard=shard,
        )
        layers = attach_lora_(model, self.pool)
        self.context = LoraContext(_use_triton(param.device), self.pool, layers)
        self._changes: list[Change] | None = [] if mirrored else None
        self._uids = itertools.count(1)
        self._by_name: dict[str, _Loaded] = {}
        self._by_uid: dict[int, _Loaded] = {}  # registered and retired ones
        self._retired: set[int] = set()
        self._slot_of: OrderedDict[int, int] = OrderedDict()  # uid -> slot, LRU first
        self._free = list(range(config.max_loras_per_batch))
        self.swaps = 0  # adapters paged into a slot (a statistic)
        self.snapshot: tuple[dict[str, Any], ...] = ()  # adapters(), for any thread
        for adapter in adapters:
            self.register(adapter)

    # ---- adapters --------------------------------------------------------------------------
    @property
    def max_loras_per_batch(self) -> int:
        return self.config.max_loras_per_batch

    def pool_config(self) -> LoraConfig:
        """The config that builds this pool again with no adapter given (its rank and
        target modules as resolved here): what the other tensor-parallel ranks get."""
        targets = tuple(m for m in LORA_TARGET_MODULES if m in self.pool.targets)
        return dataclasses.replace(
            self.config, max_lora_rank=self.pool.rank, lora_target_modules=targets
        )

    def read(self, name: str, path: str) -> LoraAdapter:
        """Read and check an adapter folder for this model and pool (any thread)."""
        adapter = read_adapter(path, self.model_config, name=name)
        self.check(adapter)
        return adapter

    def check(self, adapter: LoraAdapter) -> None:
        """LoraError when the pool cannot hold `adapter` (its rank, its modules)."""
        name = adapter.name
        if adapter.rank > self.pool.rank:
            raise LoraError(
                f"LoRA adapter {name!r} has rank {adapter.rank}, above the pool's "
                f"max_lora_rank {self.pool.rank}; start the runtime with max_lora_rank >= "
                f"{adapter.rank} (--max-lora-rank)",
                adapter=name,
            )
        extra = sorted(adapter.targets - self.pool.targets)
        if extra:
            raise LoraError(
                f"LoRA adapter {name!r} adapts {', '.join(extra)}, outside the runtime's "
                f"lora_target_modules ({', '.join(sorted(self.pool.targets))}); start it with "
                "those modules too (--lora-target-modules)",
                adapter=name,
            )

    def register(self, adapter: LoraAdapter) -> int:
        """Make a checked adapter servable under its name; returns its uid (also set on it)."""
        name = adapter.name
        _check_name(name)
        if name in self._by_name:
            raise LoraError(
                f"a LoRA adapter named {name!r} is already loaded; unload it first", adapter=name
            )
        limit = self.config.max_loaded_loras
        if limit is not None and len(self._by_name) >= limit:
            raise LoraError(
                f"{len(self._by_name)} LoRA adapters are loaded, the most max_loaded_loras "
                f"allows; unload one before loading {name!r}",
                adapter=name,
            )
        self.check(adapter)
        uid = next(self._uids)
        staged = self.pool.stage(adapter.weights)
        entry = _Loaded(name, adapter.path, uid, adapter.rank, adapter.targets, staged)
        self._by_name[name] = self._by_uid[uid] = entry
        adapter.uid = uid
        if self._changes is not None:
            self._changes.append(("load", uid, adapter))
        self.snapshot = tuple(self.adapters())
        log.info("LoRA adapter %s loaded from %s (rank %d, uid %d)", name, adapter.path,
                 adapter.rank, uid)  # fmt: skip
        return uid

    def unregister(self, name: str, in_use: Iterable[int] = ()) -> None:
        """Stop serving `name` to new requests; its memory goes now, or once the unfinished
        requests using it (`in_use`: their uids) are done (`collect`)."""
        entry = self._by_name.pop(name, None)
        if entry is None:
            raise LoraError(f"no LoRA adapter named {name!r} is loaded", adapter=name, unknown=True)
        self._retired.add(entry.uid)
        self.snapshot = tuple(self.adapters())
        self.collect(in_use)
        log.info("LoRA adapter %s unloaded", name)

    def collect(self, in_use: Iterable[int]) -> None:
        """Free the retired adapters no unfinished request uses."""
        if not self._retired:
            return
        used = set(in_use)
        for uid in [u for u in self._retired if u not in used]:
            self._retired.discard(uid)
            del self._by_uid[uid]
            slot = self._slot_of.pop(uid, None)
            if slot is not None:
                self._free.append(slot)
            if self._changes is not None:
                self._changes.append(("drop", uid))

    @property
    def retired(self) -> frozenset[int]:
        return frozenset(self._retired)

    def resolve(self, name: Any) -> int:
        """The uid of adapter `name` (None or "": 0, the base model)."""
        if name is None or name == "":
            return 0
        entry = self._by_name.get(name) if isinstance(name, str) else None
        if entry is None:
            loaded = ", ".join(sorted(self._by_name)) or "none"
            raise LoraError(
                f"no LoRA adapter named {name!r} is loaded (loaded: {loaded})",
                adapter=name if isinstance(name, str) else None,
                unknown=True,
            )
        return entry.uid

    def adapters(self) -> list[dict[str, Any]]:
        """The loaded adapters: name, path, rank, target modules, uid."""
        return [
            {"name": e.name, "path": e.path, "rank": e.rank, "target_modules": sorted(e.targets),
             "uid": e.uid}
            for e in self._by_name.values()
        ]  # fmt: skip

    def stats(self) -> dict[str, Any]:
        return {
            "lora_adapters": len(self._by_name),
            "lora_resident": len(self._slot_of),
            "lora_swaps": self.swaps,
            "max_loras_per_batch": self.config.max_loras_per_batch,
            "max_lora_rank": self.pool.rank,
        }

    # ---- steps -----------------------------------------------------------------------------
    def prepare(
        self, uids: Sequence[int], extend_lens: Sequence[int], *, block_m: int | None = None
    ) -> LoraStepPlan | None:
        """Page in the adapters of a step whose entry e feeds extend_lens[e] tokens under
        adapter uids[e] (0: base); returns its layout, None when no entry has an adapter."""
        if not any(uids):
            return None
        needed = {u for u in uids if u}
        if len(needed) > self.pool.slots:
            raise AssertionError(
                f"a step uses {len(needed)} LoRA adapters but the pool has {self.pool.slots} "
                "slots; the scheduler should have kept them apart"
            )
        for uid in needed:
            if uid in self._slot_of:
                self._slot_of.move_to_end(uid)
        for uid in needed:
            if uid not in self._slot_of:
                self._page_in(uid, needed)
        slots = [self._slot_of[u] if u else -1 for u in uids]
        return plan_lora_step(slots, extend_lens, block_m)

    def slot_of(self, uid: int) -> int | None:
        return self._slot_of.get(uid)

    def _page_in(self, uid: int, keep: set[int]) -> None:
        entry = self._by_uid[uid]
        if self._free:
            slot = self._free.pop()
        else:
            victim = next(u for u in self._slot_of if u not in keep)  # LRU first
            slot = self._slot_of.pop(victim)
        self.pool.write(slot, entry.staged)
        self._slot_of[uid] = slot
        self.swaps += 1
        if self._changes is not None:
            self._changes.append(("write", slot, uid))

    # ---- tensor parallelism ----------------------------------------------------------------
    def take_changes(self) -> list[Change]:
        """A mirrored manager's changes since the last call, in order (then forgotten)."""
        if self._changes is None:
            return []
        changes, self._changes = self._changes, []
        return changes

    def follow(self, changes: Iterable[Change]) -> None:
        """Repeat rank 0's changes on this rank's pool (its shard of every adapter), before
        the step they came with: adapters staged and dropped under rank 0's uids, slots
        paged in as rank 0 paged its own."""
        for change in changes:
            kind, key = change[0], change[1]
            if kind == "load":
                adapter: LoraAdapter = change[2]
                staged = self.pool.stage(adapter.weights)
                self._by_uid[key] = _Loaded(
                    adapter.name, adapter.path, key, adapter.rank, adapter.targets, staged
                )
            elif kind == "drop":
                del self._by_uid[key]
            elif kind == "write":
                self.pool.write(key, self._by_uid[change[2]].staged)
            else:
                raise ValueError(f"unknown LoRA change {kind!r}")


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name or name != name.strip() or len(name) > 256:
        raise LoraError(f"a LoRA adapter's name must be a non-empty string, got {name!r}")


def _use_triton(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    from ..kernels import triton_available

    return triton_available()
