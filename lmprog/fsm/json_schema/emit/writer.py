"""The emitter as the writers of containers (arrays, objects, members, unordered) call it back:
they write a node's items and members through it, and it imports them (``emitter.Emitter``)."""

from __future__ import annotations

from typing import Any, Protocol

from lmprog.fsm.json_schema.emit.lark import Frag
from lmprog.fsm.json_schema.terms.nodes import ArrT, Node, ObjT


class Writer(Protocol):
    @property
    def sep(self) -> Frag | None: ...  # the separator lexeme, ws "," ws
    @property
    def any_order(self) -> bool: ...  # objects' members in any order (key_order="any")

    def node(self, node: Node) -> Frag | None: ...
    def check(self, t: ArrT | ObjT) -> None: ...
    def derived(self, node: Node, other: Node) -> Frag | None: ...
    def member(self, key: Frag | None, value: Frag | None) -> Frag | None: ...
    def container(
        self, open_: str, body: Frag | None, empty_ok: bool, close: str
    ) -> Frag | None: ...
    def value(self, v: Any) -> Frag | None: ...
    def finite_values(self, node: Node) -> list[Any] | None: ...
