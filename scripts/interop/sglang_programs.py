"""SGLang's own frontend test programs (`sglang/test/test_programs.py`) run unchanged with
`import lmprog as sgl` on an lmprog backend, each printed PASS / FAIL with the error.

SGLang is not a dependency of lmprog; only the one source file is read, from a wheel or from
the sglang that `scripts/setup.sh --test` installs (no argument):

    pip download sglang --no-deps -d /tmp/sglw
    .venv/bin/python scripts/interop/sglang_programs.py [/tmp/sglw/sglang-*.whl] [--backend runtime]

Only imports change: `import sglang as sgl` becomes `import lmprog as sgl`, `from
sglang.lang.ir import` (the REGEX_* constants) becomes `from lmprog import`, and `is_hip` (a
ROCm probe) is defined as False. `test_gen_min_new_tokens` imports SGLang's server utilities
(`sglang.srt...get_tokenizer`) and `test_image_qa` reads an image file the suite does not ship:
both fail here for that reason. SGLang runs `test_completion_speculative` only on its OpenAI
backend (API speculative execution is an endpoint feature; lmprog uses it where
`Backend.api_speculation` is set): on a local backend it compares two sampled runs. Programs that take
`check_answer` are run with it False, as SGLang's suite runs them on small models; SGLang's
tests are written for 7B-class models, so a wrong answer from the 135M default model is
reported as FAIL like any other.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import pathlib
import time
import traceback
import types
import zipfile

import lmprog as lp

MEMBER = "sglang/test/test_programs.py"


def lmprog_source(wheel: str | None = None) -> str:
    """SGLang's test_programs.py with lmprog's imports, from `wheel` or the installed sglang."""
    if wheel is None:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(
                "sglang is not installed: pass a wheel (pip download sglang --no-deps)"
            )
        path = pathlib.Path(spec.submodule_search_locations[0]).parent / MEMBER
        source = path.read_text()
    else:
        with zipfile.ZipFile(wheel) as z:
            source = z.read(MEMBER).decode()
    source = source.replace("import sglang as sgl", "import lmprog as sgl")
    source = source.replace("from sglang.lang.ir import", "from lmprog import")
    return source.replace("from sglang.srt.utils import is_hip", "is_hip = lambda: False")


def load_programs(wheel: str | None = None) -> types.ModuleType:
    """SGLang's test programs as a module, with lmprog's imports (see `lmprog_source`)."""
    module = types.ModuleType("sglang_test_programs")
    exec(compile(lmprog_source(wheel), MEMBER, "exec"), module.__dict__)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "wheel",
        nargs="?",
        help="an sglang wheel (pip download sglang --no-deps); default: installed",
    )
    parser.add_argument("--backend", choices=["llamacpp", "runtime"], default="llamacpp")
    parser.add_argument("-k", help="run only tests whose name contains this")
    args = parser.parse_args()
    backend = lp.LlamaCpp() if args.backend == "llamacpp" else lp.Runtime(device="cpu")
    lp.set_default_backend(backend)
    programs = load_programs(args.wheel)
    tests = [(n, f) for n, f in vars(programs).items() if n.startswith("test_") and callable(f)]
    tests = [(n, f) for n, f in tests if not args.k or args.k in n]
    passed = 0
    for name, test in tests:
        kwargs = (
            {"check_answer": False} if "check_answer" in inspect.signature(test).parameters else {}
        )
        start = time.perf_counter()
        try:
            test(**kwargs)
        except Exception as exc:  # noqa: BLE001 - a report of each program's outcome
            where = traceback.extract_tb(exc.__traceback__)[-1]
            print(
                f"FAIL {name} ({time.perf_counter() - start:.1f} s): {type(exc).__name__}: "
                f"{str(exc)[:300]!r} at {where.filename}:{where.lineno}"
            )
        else:
            passed += 1
            print(f"PASS {name} ({time.perf_counter() - start:.1f} s)")
    print(f"{passed}/{len(tests)} passed on {args.backend}")


if __name__ == "__main__":
    main()
