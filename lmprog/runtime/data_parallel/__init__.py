"""Data parallelism in one process: several engines behind one `submit` (replicas.py), and
the cache-aware router that picks a replica per request (router.py)."""
