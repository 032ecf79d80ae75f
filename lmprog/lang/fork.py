"""`s.fork(n)`: a group of copies of a state that continue independently."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

from lmprog.lang.ir import Expr, Fork, flatten


class Copy(Protocol):
    """What a group needs of a copy (a `FrontendState`): to append to it."""

    def _append(self, exprs: tuple[Expr, ...]) -> None: ...


S_co = TypeVar("S_co", bound=Copy, covariant=True)
S_contra = TypeVar("S_contra", bound=Copy, contravariant=True)


class Parent(Protocol[S_contra]):
    """What a group needs of the state it was forked from (a `FrontendState`)."""

    def _join(self, group: ForkGroup[S_contra], mode: str) -> None: ...


class ForkGroup(Generic[S_co]):
    """The `n` copies made by `s.fork(n)`.

    Each copy starts with the parent's text, variables and open role at the fork, and
    runs as an independent request (concurrently with its siblings).

        forks = s.fork(3)
        forks += lambda i: f"Idea {i + 1}: " + lp.gen("idea", max_tokens=32)  # f(i) per copy
        forks += ["a", "b", "c"]                # one item per copy
        forks += "\\n"                           # the same for every copy
        forks[0] += "extra"                     # a single copy
        forks.join()                            # s["idea"] == [idea0, idea1, idea2]

    After `join()` the copies are read-only and the group takes no more appends.
    """

    def __init__(
        self, parent: Parent[S_co], fork: Fork, children: list[S_co], open_role: str | None
    ) -> None:
        assert len(children) == fork.n
        self._parent = parent
        self.fork = fork
        self._children = children
        self.open_role = open_role  # the parent's open role at the fork
        self.joined = False

    def __len__(self) -> int:
        return len(self._children)

    def __iter__(self) -> Iterator[S_co]:
        return iter(self._children)

    def __getitem__(self, i: int) -> S_co:
        return self._children[i]

    def __setitem__(self, i: int, value: object) -> None:
        # `group[i] += x` appends to the copy in place, then assigns it back here.
        if value is not self._children[i]:
            raise TypeError(
                "a fork's copies cannot be replaced; append to one with `group[i] += ...`"
            )

    def __iadd__(
        self, value: Callable[[int], object] | list[object] | tuple[object, ...] | object
    ) -> ForkGroup[S_co]:
        self._check_open()
        n = len(self._children)
        if callable(value) and not isinstance(value, Expr):
            items = [value(i) for i in range(n)]
        elif isinstance(value, (list, tuple)):
            if len(value) != n:
                raise ValueError(
                    f"appending a list to a fork of {n} needs exactly {n} items, got {len(value)}"
                )
            items = list(value)
        else:
            items = [value] * n
        flat = [flatten(item) for item in items]  # every TypeError before any append
        for child, exprs in zip(self._children, flat):
            child._append(exprs)
        return self

    def join(self, mode: str = "gather") -> None:
        """Join the copies back into the parent.

        - `mode="gather"` (default; SGLang's "gather_variable" is accepted too): every
          variable a copy created after the fork becomes a list on the parent, one item per
          copy in order (None for a copy that did not set it). The parent's text is
          unchanged.
        - `mode="concat_and_append"` (SGLang's "concate_and_append" is accepted too): the
          text each copy appended after the fork is appended to the parent, copy 0 first.
          A backend's prefix cache reuses the parent prefix and the first copy's segment;
          later segments are recomputed when the parent continues, because their positions
          in the concatenated text have shifted.
        """
        self._check_open()
        self._parent._join(self, mode)
        self.joined = True

    def _check_open(self) -> None:
        if self.joined:
            raise ValueError(
                "this fork group was already joined; append to the parent state instead"
            )

    def __repr__(self) -> str:
        return f"ForkGroup(n={len(self._children)}, id={self.fork.fork_id}, joined={self.joined})"
