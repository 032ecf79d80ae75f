"""Small thread-safe pieces every backend keeps: named counters (for `stats()`) and values
resolved once on first use (an endpoint's tokenizer, chat template, model name)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any


class Counters:
    """Integer counters by name; `add` and `snapshot` from any thread."""

    def __init__(self, names: Iterable[str]) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(names, 0)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, value in deltas.items():
                self._values[name] += value

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)


class Once:
    """Values made on first use and kept: `get(key, make)`. `make` runs outside the lock (it
    may load a tokenizer or call a server); if two threads race, the first value stored wins."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, Any] = {}

    def get(self, key: str, make: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._values:
                return self._values[key]
        value = make()
        with self._lock:
            return self._values.setdefault(key, value)
