"""The executor: a scheduled batch in, logits out. The model runner, the step's device
tensors (forward_batch.py), the KV pool and its moves (kv_pool.py, kv_shift.py, host_kv.py),
and the CUDA graphs that replay a step (cuda_graph.py, piecewise_graph.py)."""
