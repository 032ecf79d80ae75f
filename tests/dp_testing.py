"""Shared by the data-parallel tests (tests/backends/test_runtime_dp.py, and over
tensor-parallel replicas tests/runtime/test_tp_dp.py): the router's counts per replica and
a forking program whose children must follow their prefix's replica."""

from __future__ import annotations

import lmprog as lp

UNRELATED = [f"Question number {w} is about something else entirely" for w in "abcdef"]


def routed(rt):
    """Requests each replica received so far, by reason (the router's counts)."""
    return [r["routed"] for r in rt.stats()["replicas"]]


def delta(before, after):
    return [{k: a[k] - b[k] for k in a if a[k] != b[k]} for b, a in zip(before, after)]


def fork_lands_on_one_replica(rt, prefix: str) -> int:
    """Run a program that forks 4 children after `prefix` (its cache empty beforehand):
    the prefix goes to the least-loaded replica and all 4 children are pinned there, the
    other replica gets nothing. Returns that replica's index."""

    @lp.function
    def forked(s):
        s += prefix
        forks = s.fork(4)
        forks += [f" Question {i}: what is {i} plus {i}? Answer:" for i in range(4)]
        forks += lp.gen("answer", max_tokens=3, temperature=0)
        forks.join()

    before = routed(rt)
    assert len(forked.run(backend=rt)["answer"]) == 4
    moved = delta(before, routed(rt))
    home = 0 if moved[0] else 1
    assert moved[1 - home] == {} and moved[home] == {"least_loaded": 1, "pinned": 4}
    return home
