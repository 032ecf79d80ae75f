"""lmprog's one verbosity switch and its progress reports.

    configure_logging("info")                  # the `lmprog` logger to stderr (None: env)
    with slow_step("building x (once)"): ...   # a step that can take seconds
    with progress(n, "step") as bar: ...       # one whose amount is known

Everything goes through `logging` under the `lmprog` logger; a library user sets
`LMPROG_LOG_LEVEL=info` or configures `logging` as usual. What shows at each level:
docs/design/foundations.md.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any

ENV_VAR = "LMPROG_LOG_LEVEL"
LEVELS = ("debug", "info", "warning", "error", "critical")
_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
_handler: logging.Handler | None = None
SLOW_S = 1.0  # at the default verbosity, a step says what it does once it has run this long


def parse_level(level: str | int) -> int:
    """A level name (any case) or number -> the logging level; ValueError naming the choices."""
    if isinstance(level, int) and not isinstance(level, bool):
        return level
    if isinstance(level, str) and level.strip().lower() in LEVELS:
        number: int = getattr(logging, level.strip().upper())
        return number
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


class slow_step:  # used like a function: `with slow_step("building x (once)"):`
    """A step that may take seconds; a context manager. See the module's table. `amount`:
    how much it does ("4 MiB"), said beside `desc` in its lines."""

    def __init__(self, desc: str, *, amount: str = "", logger: str = "lmprog") -> None:
        self._log = logging.getLogger(logger)
        self._desc, self._amount = desc, amount
        self._started = time.perf_counter()
        self._verbosity = _verbosity(self._log)
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._said = False
        if self._verbosity == "info":
            self._log.info("%s...", self._start_line())
        elif self._verbosity == "default":
            self._timer = threading.Timer(SLOW_S, self._say_start)
            self._timer.daemon = True
            self._timer.start()

    def _say_start(self) -> None:
        with self._lock:
            if self._timer is None:  # closed meanwhile
                return
            self._said = True
        _say(f"{self._start_line()}...")

    def _start_line(self) -> str:
        return f"{self._desc} ({self._amount})" if self._amount else self._desc

    def close(self) -> None:
        """End the step (idempotent)."""
        elapsed = time.perf_counter() - self._started
        amount = f"{self._amount} in " if self._amount else ""
        done = f"{self._desc}: done ({amount}{elapsed:.1f} s)"
        if self._verbosity == "info":
            self._verbosity = "closed"
            self._log.info("%s", done)
            return
        with self._lock:
            timer, self._timer = self._timer, None
            said, self._said = self._said, False
        if timer is not None:
            timer.cancel()
        if said:
            _say(done)

    def __enter__(self) -> slow_step:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class progress:  # used like a function: `with progress(n, "step") as bar:`
    """A known amount of work: `update(n)` as it is done; a context manager. See the
    module's table."""

    def __init__(self, total: float, desc: str, *, unit: str = "B", logger: str = "lmprog") -> None:
        self._log = logging.getLogger(logger)
        self._desc, self._total, self._unit = desc, total, unit
        self._started = time.perf_counter()
        self._verbosity = _verbosity(self._log)
        self._bar: Any = None
        self._step: slow_step | None = None
        if self._verbosity != "quiet" and _interactive():
            try:
                from tqdm.auto import tqdm  # lazy: ~25 ms of `import lmprog`, for a bar only
            except ImportError:  # tqdm is a dependency; a stripped environment logs instead
                tqdm = None
            if tqdm is not None:
                scale = unit == "B"
                self._bar = tqdm(
                    total=total, desc=desc, unit=unit, unit_scale=scale, unit_divisor=1024,
                    leave=False, delay=SLOW_S if self._verbosity == "default" else 0,
                )  # fmt: skip
        if self._bar is None:
            self._step = slow_step(desc, amount=_amount(total, unit), logger=logger)

    def update(self, n: float) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._step is not None:
            self._step.close()
            return
        if self._bar is None:
            return
        self._bar.close()
        self._bar = None
        elapsed = time.perf_counter() - self._started
        done = f"{self._desc}: done ({_amount(self._total, self._unit)} in {elapsed:.1f} s)"
        if self._verbosity == "info":
            self._log.info("%s", done)
        elif elapsed >= SLOW_S:  # the bar was shown
            _say(done)

    def __enter__(self) -> progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _verbosity(log: logging.Logger) -> str:
    """ "info" where `log` shows info; "default" where no level was set on it, its parents
    or the `lmprog` logger (no $LMPROG_LOG_LEVEL, no configure_logging, no setLevel); else
    "quiet"."""
    if log.isEnabledFor(logging.INFO):
        return "info"
    node: logging.Logger | None = log
    while node is not None and node is not logging.root:
        if node.level != logging.NOTSET:
            return "quiet"
        node = node.parent
    # (the `lmprog` logger is not a parent of lmprog's loggers until someone asks for it)
    return "default" if logging.getLogger("lmprog").level == logging.NOTSET else "quiet"


def _say(line: str) -> None:
    """One line on stderr, at the default verbosity (not through logging: it is no warning)."""
    try:
        print(f"lmprog: {line}", file=sys.stderr, flush=True)
    except (AttributeError, OSError, ValueError):  # no stderr, or a closed one
        pass


def _interactive() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stderr
        return False


def _amount(total: float, unit: str) -> str:
    if unit == "B":
        return f"{total / 2**20:.0f} MiB"
    return f"{total:g} {unit}"
