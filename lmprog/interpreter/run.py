"""Running programs: one (`run_program`), many (`run_batch`), and the batch prefix.

A program body runs in some thread (the caller's, a background thread for streaming, a
pool thread in a batch); its state's worker executes what it appends. A batch first
traces the program to find the text every item starts with and asks the backend to
cache it once, then fans the items out over a thread pool.
Design: docs/design/frontend.md.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lmprog.core.protocol import Backend
from lmprog.interpreter.defaults import global_config
from lmprog.interpreter.executor import TemplateCache, TemplateSource, render_nodes
from lmprog.interpreter.state import ProgramState, RunContext
from lmprog.lang.program import Program, ProgramCall
from lmprog.lang.tracer import Arg, trace_program

_FINISHED = "the program has finished; its state is read-only"


def run_body(state: ProgramState, program: Program, call: ProgramCall) -> BaseException | None:
    """Run the program body on `state` in this thread; return its exception, if any: any
    BaseException (a SystemExit too) is recorded on the state, never lost, and never
    escapes a batch's other items.

    The state is closed afterwards either way, so its worker drains and finishes.
    """
    state._body_thread = threading.get_ident()
    try:
        state.ret_value = program.func(state, *call.args, **call.kwargs)
    except BaseException as e:  # noqa: BLE001 - the program's error, kept on its state
        state._record.fail(e)
        return e
    finally:
        state._close(_FINISHED)
    return None


def start_program(
    program: Program, call: ProgramCall, backend: Backend, *, stream: bool, background: bool
) -> ProgramState:
    """A new state running `program`: here (and synced) or on a background thread."""
    context = RunContext(
        backend,
        TemplateCache(backend, call.template_kwargs),
        call.defaults,
        stream,
        program.num_api_spec_tokens,
        program.allow_special_tokens,
    )
    state = ProgramState(context)
    if background:
        threading.Thread(
            target=run_body,
            args=(state, program, call),
            daemon=True,
            name=f"lmprog-body-{program.name}",
        ).start()
        return state
    error = run_body(state, program, call)
    if error is not None:
        raise error
    state.sync()
    _report(state)
    return state


def _report(state: ProgramState) -> None:
    """SGLang's `global_config.verbosity >= 2`: print a finished run's text."""
    if global_config.verbosity >= 2 and state.error() is None:
        print(state.text())


def run_batch(
    program: Program,
    calls: list[ProgramCall],
    backend: Backend,
    *,
    num_threads: int,
    progress_bar: bool,
) -> list[ProgramState]:
    """Run every call; states in input order, each carrying its own error (none raised)."""
    return list(
        iter_batch(program, calls, backend, num_threads=num_threads, progress_bar=progress_bar)
    )


def iter_batch(
    program: Program,
    calls: list[ProgramCall],
    backend: Backend,
    *,
    num_threads: int,
    progress_bar: bool,
) -> Iterator[ProgramState]:
    """`run_batch` as a generator (SGLang's generator_style): each state in input order,
    once it has finished; every call starts at once (on `num_threads` threads)."""
    # one template for the batch, or one per item where their chat_template_kwargs differ
    shared = all(call.template_kwargs == calls[0].template_kwargs for call in calls)
    template = TemplateCache(backend, calls[0].template_kwargs if calls else None)
    # (under a LoRA adapter the first item caches the prefix for the others: cache_prefix
    # would compute it for the base model)
    if (
        shared
        and len(calls) > 1
        and global_config.enable_precache_with_tracing
        and calls[0].defaults.lora_path is None
    ):
        prefix = batch_prefix(program, calls, template)
        if prefix:
            backend.cache_prefix(prefix)

    def run_one(i: int) -> ProgramState:
        state = ProgramState(
            RunContext(
                backend,
                template if shared else TemplateCache(backend, calls[i].template_kwargs),
                calls[i].defaults,
                num_api_spec_tokens=program.num_api_spec_tokens,
                allow_special_tokens=program.allow_special_tokens,
            )
        )
        run_body(state, program, calls[i])
        state._record.wait_idle()
        _report(state)
        return state

    bar = _progress(len(calls)) if progress_bar else None
    with ThreadPoolExecutor(
        max_workers=num_threads, thread_name_prefix=f"lmprog-batch-{program.name}"
    ) as pool:
        futures = [pool.submit(run_one, i) for i in range(len(calls))]
        if bar is not None:
            for future in futures:
                future.add_done_callback(lambda _: bar.update(1))
        for future in futures:
            yield future.result()  # run_one catches program errors; anything else is a bug
    if bar is not None:
        bar.close()


def auto_threads(n: int) -> int:
    """Threads for a batch of `n`: enough to keep a batching backend busy."""
    return max(1, min(n, max(64, 8 * (os.cpu_count() or 1))))


def program_prefix(program: Program, template: TemplateSource) -> str:
    """The text every run of `program` starts with (its trace with the arguments it has no
    default for unknown; "" when it cannot be traced): what `function.cache()` caches."""
    try:
        graph = program.trace()
        return render_nodes(graph.constant_prefix(), template, program.allow_special_tokens)
    except Exception:  # noqa: BLE001 - no constant prefix: nothing to cache
        return ""


def batch_prefix(program: Program, calls: Sequence[ProgramCall], template: TemplateSource) -> str:
    """The text every call of the batch starts with, from a trace of the program.

    Arguments equal in every call keep their value; the others are `lp.Arg` placeholders.
    Returns "" when the program cannot be traced (its errors will show when it runs).
    """
    if any(call.args for call in calls):
        return ""
    kwargs: dict[str, Any] = {}
    for key in dict.fromkeys(k for call in calls for k in call.kwargs):
        values = [call.kwargs.get(key, Arg) for call in calls]
        kwargs[key] = values[0] if all(_same(values[0], v) for v in values[1:]) else Arg
    try:
        graph = trace_program(program.func, program.name, (), kwargs, calls[0].defaults)
        return render_nodes(graph.constant_prefix(), template, program.allow_special_tokens)
    except Exception:  # noqa: BLE001 - no constant prefix to share: nothing cached
        return ""


def _same(a: object, b: object) -> bool:
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values that cannot be compared differ
        return False


def _progress(total: int) -> Any:
    from tqdm.auto import tqdm  # lazy: ~25 ms of `import lmprog`, for a bar only

    return tqdm(total=total, desc="programs", unit="prog")
