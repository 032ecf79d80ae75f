"""lmprog's one verbosity switch and its progress reports.

Everything lmprog reports goes through the `logging` module under the `lmprog` logger
(`lmprog.serve.access` for the server's access lines). `configure_logging(level)` gives that
logger a stderr handler at `level`; without a level it reads `$LMPROG_LOG_LEVEL`. `lmprog
serve` always calls it (`--log-level`, default `$LMPROG_LOG_LEVEL`, else info); a library user
sets `LMPROG_LOG_LEVEL=info` (read at `import lmprog`) or configures `logging` as usual.

`progress(total, desc)` reports a long step whose amount is known: a tqdm bar on an
interactive stderr (when the `lmprog` logger would show info), else an info line at its start
and one with the elapsed time at its end.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

ENV_VAR = "LMPROG_LOG_LEVEL"
LEVELS = ("debug", "info", "warning", "error", "critical")
_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
_handler: logging.Handler | None = None


def parse_level(level: str | int) -> int:
    """A level name (any case) or number -> the logging level; ValueError naming the choices."""
    if isinstance(level, int) and not isinstance(level, bool):
        return level
    if isinstance(level, str) and level.strip().lower() in LEVELS:
        return getattr(logging, level.strip().upper())
    raise ValueError(f"log level must be one of {', '.join(LEVELS)}; got {level!r}")


def configure_logging(level: str | int | None = None) -> int:
    """Give the `lmprog` logger a stderr handler at `level` (default `$LMPROG_LOG_LEVEL`, else
    info); called again, it changes the level. Returns the level set."""
    global _handler
    if level is None:
        level = os.environ.get(ENV_VAR) or "info"
    value = parse_level(level)
    logger = logging.getLogger("lmprog")
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter(_FORMAT))
        logger.addHandler(_handler)
        logger.propagate = False  # one line per record, whatever the root logger has
    logger.setLevel(value)
    return value


def configure_from_env() -> None:
    """`configure_logging()` where `$LMPROG_LOG_LEVEL` is set (a bad value: a warning)."""
    if os.environ.get(ENV_VAR):
        try:
            configure_logging()
        except ValueError as e:
            logging.getLogger("lmprog").warning("ignoring $%s: %s", ENV_VAR, e)


class progress:  # used like a function: `with progress(n, "step") as bar:`
    """A known amount of work: `update(n)` as it is done; a context manager."""

    def __init__(self, total: float, desc: str, *, unit: str = "B", logger: str = "lmprog") -> None:
        self._log = logging.getLogger(logger)
        self._desc, self._total, self._unit = desc, total, unit
        self._started = time.perf_counter()
        self._bar: Any = None
        if self._log.isEnabledFor(logging.INFO) and _interactive():
            try:
                from tqdm.auto import tqdm
            except ImportError:  # tqdm is a dependency; a stripped environment logs instead
                tqdm = None
            if tqdm is not None:
                scale = unit == "B"
                self._bar = tqdm(
                    total=total, desc=desc, unit=unit, unit_scale=scale, unit_divisor=1024,
                    leave=False,
                )  # fmt: skip
        if self._bar is None:
            self._log.info("%s (%s)...", desc, _amount(total, unit))

    def update(self, n: float) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._log.info(
            "%s: done (%s in %.1f s)",
            self._desc,
            _amount(self._total, self._unit),
            time.perf_counter() - self._started,
        )

    def __enter__(self) -> progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _interactive() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stderr
        return False


def _amount(total: float, unit: str) -> str:
    if unit == "B":
        return f"{total / 2**20:.0f} MiB"
    return f"{total:g} {unit}"
