"""Comparing the greedy outputs of two paths that compute the same model in a different order
(chunked or whole prefill, batched or alone, a restored or cached prefix or a fresh one,
verified drafts or plain decoding).

Floating-point sums taken in another order are not bitwise equal on every CPU (SIMD width,
how a kernel blocks the batch), so where the reference's two most likely tokens are nearly
tied, the other path may pick the second one and then continue differently. What holds on
any machine: the outputs agree up to the first position where the reference's top two
logprobs are within `eps`, with eps far above the numerical noise between the two paths and
far below what a real bug changes. Each test also checks that most positions were compared,
so that the comparison cannot become vacuous. The backends report raw logprobs (before
constraint masks and penalties): this describes plain greedy decoding only.

    ref = run(plain, greedy(40, return_logprob=True, top_logprobs_num=2))
    n = assert_greedy_agrees(out.token_ids, ref.token_ids, top2_logprobs(ref.logprobs), 1e-3)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def top2_logprobs(logprobs: Iterable) -> list[tuple[float, float]]:
    """(best, second) logprob per position, from entries with two or more `top` alternatives
    (lmprog's TokenLogprob) or from the top logprobs themselves (a sequence of floats)."""
    out = []
    for entry in logprobs:
        top = getattr(entry, "top", entry)
        values = sorted((getattr(t, "logprob", t) for t in top), reverse=True)
        assert len(values) >= 2, "the reference needs top_logprobs_num >= 2"
        out.append((float(values[0]), float(values[1])))
    return out


def near_tie(ref_top2: Sequence[tuple[float, float]], eps: float) -> int:
    """Index of the first position whose top two logprobs are within `eps` (len if none)."""
    return next((i for i, (a, b) in enumerate(ref_top2) if a - b < eps), len(ref_top2))


def assert_greedy_agrees(
    got: Sequence[int], ref: Sequence[int], ref_top2: Sequence[tuple[float, float]], eps: float
) -> int:
    """Assert `got` equals `ref` up to the first near tie of the reference (all of it, length
    included, if there is none); return how many positions were compared."""
    got, ref = list(got), list(ref)
    assert len(ref_top2) >= len(ref), "one (best, second) pair per reference token"
    n = near_tie(ref_top2[: len(ref)], eps)
    if n == len(ref):
        assert got == ref, _diff(got, ref, ref_top2)
    else:
        assert got[:n] == ref[:n], _diff(got, ref, ref_top2)
    return n


def _diff(got: list[int], ref: list[int], ref_top2: Sequence[tuple[float, float]]) -> str:
    i = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
    gap = f"{ref_top2[i][0] - ref_top2[i][1]:.3g}" if i < len(ref_top2) else "n/a"
    return (
        f"outputs differ at position {i} where the reference's top-2 gap is {gap}: "
        f"got {got[i : i + 4]}..., reference {ref[i : i + 4]}... (lengths {len(got)}, {len(ref)})"
    )
