"""Seeded generators: reproducible per (seed, count), uniform, independent of the batch."""

from __future__ import annotations

import numpy as np
import torch

from lmprog.decoding.rng import SeededGenerator, hashed_uniforms, make_generator, uniforms


def _splitmix64(state: int, n: int) -> list[float]:
    """The reference: SplitMix64 started at `state`, each output's top 24 bits / 2**24."""
    out, mask = [], (1 << 64) - 1
    for _ in range(n):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & mask
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB & mask
        out.append(((z ^ (z >> 31)) >> 40) / 2**24)
    return out


def test_numbers_are_splitmix64_of_the_seed():
    g = SeededGenerator(12345)
    got = torch.cat([uniforms([g], 1, "cpu") for _ in range(6)]).tolist()
    assert got == _splitmix64(g.key, 6) and g.drawn == 6
    assert make_generator(None) is None


def test_a_row_draws_the_same_alone_or_in_a_batch():
    alone = [uniforms([make_generator(7)], 1, "cpu").item() for _ in range(1)]
    g, others = make_generator(7), [make_generator(s) for s in (1, 2, 3)]
    batch = uniforms([others[0], None, g, others[1], others[2]], 5, "cpu")
    assert batch[2].item() == alone[0]
    assert (batch >= 0).all() and (batch < 1).all()


def test_uniform_across_counters_and_across_seeds():
    keys = np.array([SeededGenerator(s).key for s in range(200)], dtype=np.uint64)
    counters = np.arange(500, dtype=np.uint64)
    u = hashed_uniforms(keys[:, None], counters[None, :])  # [seeds, counters]
    assert u.dtype == np.float32 and u.min() >= 0 and u.max() < 1
    for sample in (u.ravel(), u[:, 0], u[0]):  # all, one counter over seeds, one seed's stream
        counts = np.bincount((sample * 10).astype(int), minlength=10)
        expected = len(sample) / 10
        assert ((counts - expected) ** 2 / expected).sum() < 40  # 9 dof: p ~ 1e-5
    # neighbouring seeds and counters are not correlated
    assert abs(np.corrcoef(u[:-1].ravel(), u[1:].ravel())[0, 1]) < 0.02
    assert abs(np.corrcoef(u[:, :-1].ravel(), u[:, 1:].ravel())[0, 1]) < 0.02
