"""Tensor parallelism for lmprog's runtime, applied from outside the plain models.

    group = start_tensor_parallel(tp_size, build)     # start.py: rank 0 + spawned/torchrun ranks
    net = assemble_model(**build, tp=group)           # load.py + sharding.py: this rank's shard
    engine = launch_engine(net, ..., tp=group)        # channel.py: each step to every rank

Rank 0 runs the whole engine; workers only run forwards. A broken group raises
ParallelError. Design: docs/design/tensor-parallel.md.
"""

from ..models.config import local_config
from .errors import ParallelError
from .sharding import ShardPlan, check_shardable

__all__ = ["ParallelError", "ShardPlan", "check_shardable", "local_config"]
