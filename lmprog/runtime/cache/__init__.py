"""KV-slot bookkeeping (torch-free): allocator, prefix caches, req_to_token table, manager."""

from .allocator import TokenSlotAllocator
from .base import IntegrityError, MatchResult, PrefixCache
from .disabled import NoPrefixCache
from .eviction import EvictionPolicy, LFUPolicy, LRUPolicy, make_eviction_policy
from .manager import CacheManager, make_prefix_cache
from .radix import RadixCache, TreeNode
from .req_table import ReqToTokenTable

__all__ = [
    "CacheManager",
    "EvictionPolicy",
    "IntegrityError",
    "LFUPolicy",
    "LRUPolicy",
    "MatchResult",
    "NoPrefixCache",
    "PrefixCache",
    "RadixCache",
    "ReqToTokenTable",
    "TokenSlotAllocator",
    "TreeNode",
    "make_eviction_policy",
    "make_prefix_cache",
]
