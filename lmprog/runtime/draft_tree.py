"""Draft token trees: the arithmetic the Speculator, the scheduler, the model runner and the
verification share. Plain Python and numpy, no torch.

A tree of n drafts is `parents`: parents[i] is the index of draft i's parent, -1 for a child
of the last token fed (the root), parents[i] < i (topological order; any prefix of the
drafts is a tree too). Siblings are alternatives for the same position; the verify entry
feeds all n drafts, draft i at position root + 1 + depth(i), and lets each one attend to the
prefix and its own ancestors only (`mask_block`). What the target accepts is one path from
the root (`walk`); its KV is moved to the positions a chain would have given it
(`path_moves`). Design: docs/design/speculative.md (Token trees).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ROOT = -1


def check_parents(parents: Sequence[int], n: int) -> tuple[int, ...]:
    """parents as a tuple of ints, or ValueError unless it describes a tree of n drafts."""
    out = tuple(int(p) for p in parents)
    if len(out) != n:
        raise ValueError(f"a draft tree needs one parent per token: {len(out)} for {n} tokens")
    for i, p in enumerate(out):
        if not ROOT <= p < i:
            raise ValueError(
                f"parents[{i}] = {p}: a parent must be -1 (the root) or an earlier draft"
            )
    return out


def is_chain(parents: Sequence[int] | None) -> bool:
    """Whether the tree is a plain chain (draft i's parent is draft i - 1)."""
    return parents is None or all(p == i - 1 for i, p in enumerate(parents))


def depths(parents: Sequence[int]) -> list[int]:
    """depth[i]: 0 for a child of the root, else its parent's depth + 1."""
    out: list[int] = []
    for p in parents:
        out.append(0 if p == ROOT else out[p] + 1)
    return out


def children(parents: Sequence[int]) -> list[list[int]]:
    """kids[node + 1]: the children of `node` (ROOT included, at index 0), in order."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        kids[p + 1].append(i)
    return kids


def walk(drafts: Sequence[int], parents: Sequence[int] | None, tokens: Sequence[int]) -> list[int]:
    """The drafts `tokens` follow from the root: at each step the first child whose token is
    the next token, until none is (verification accepts a child only so: see
    lmprog.runtime.engine.step_outputs)."""
    if parents is None:
        path = []
        for i, (d, t) in enumerate(zip(drafts, tokens)):
            if d != t:
                break
            path.append(i)
        return path
    kids = children(parents)
    path, node = [], ROOT
    for t in tokens:
        node = next((c for c in kids[node + 1] if drafts[c] == t), ROOT)
        if node == ROOT:
            break
        path.append(node)
    return path


def path_moves(path: Sequence[int]) -> list[tuple[int, int]]:
    """(from, to) draft indices: the accepted path's KV, computed at the indices of its
    nodes, goes where a chain would hold it (node path[j] -> index j). Ascending `to`, and
    path[j] >= j, so copying in order never overwrites a source not yet read."""
    return [(node, j) for j, node in enumerate(path) if node != j]


def first_branch(parents: Sequence[int]) -> int:
    """How many leading drafts form a chain (0 -> 1 -> 2 ...): the tree's first branch."""
    n = 0
    while n < len(parents) and parents[n] == n - 1:
        n += 1
    return n


def mask_block(num_real: int, parents: Sequence[int] | None, seq_len: int) -> np.ndarray:
    """bool [num_real + n, seq_len]: which keys each token of a verify entry may see. The
    entry feeds num_real tokens (causal) then n drafts at the end of a sequence of seq_len;
    a draft sees the whole prefix and the real tokens, itself and its ancestors."""
    n = 0 if parents is None else len(parents)
    rows = num_real + n
    prefix = seq_len - rows
    mask = np.zeros((rows, seq_len), dtype=np.bool_)
    mask[:, :prefix] = True
    real = np.tril(np.ones((rows, num_real), dtype=np.bool_))
    mask[:, prefix : prefix + num_real] = real
    if parents is not None:
        base = prefix + num_real
        block = mask[num_real:, base:]
        for i, p in enumerate(parents):
            if p != ROOT:
                block[i, :i] = block[p, :i]
            block[i, i] = True
    return mask


def tree_masks(
    trees: Sequence[Sequence[int] | None], ext: np.ndarray, seq_lens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A step's attention masks from its entries' draft parents (trees[i] None: entry i is
    causal), each feeding ext[i] tokens up to seq_lens[i]: (the flat bool mask, the int64
    offset of each entry's block into it, -1 for a causal entry). Entry i's block is
    mask_block(ext[i] - len(trees[i]), trees[i], seq_lens[i]), row-major."""
    blocks, indptr, at = [], np.full(len(trees), -1, dtype=np.int64), 0
    for i, parents in enumerate(trees):
        if parents is None:
            continue
        block = mask_block(int(ext[i]) - len(parents), parents, int(seq_lens[i]))
        blocks.append(block.reshape(-1))
        indptr[i] = at
        at += block.size
    mask = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.bool_)
    return mask, indptr


def prune(parents: Sequence[int], keep: Sequence[bool]) -> tuple[list[int], tuple[int, ...]]:
    """Drop the drafts with keep[i] False, and every descendant of a dropped one. Returns the
    kept indices (in order) and their parents renumbered."""
    new_index = [-2] * len(parents)
    kept: list[int] = []
    new_parents: list[int] = []
    for i, p in enumerate(parents):
        if not keep[i] or (p != ROOT and new_index[p] < 0):
            continue
        new_index[i] = len(kept)
        kept.append(i)
        new_parents.append(ROOT if p == ROOT else new_index[p])
    return kept, tuple(new_parents)
