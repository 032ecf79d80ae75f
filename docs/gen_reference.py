"""Generate docs/reference.md from the public API's docstrings.

python docs/gen_reference.py          # rewrite docs/reference.md
python docs/gen_reference.py --check  # exit 1 if docs/reference.md is stale (tests run this)
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

OUT = Path(__file__).with_name("reference.md")

SECTIONS: list[tuple[str, list[str]]] = [
    ("Programs", ["function", "set_default_backend", "Arg", "set_limits", "get_limits"]),
    ("Primitives", ["gen", "gen_int", "gen_string", "select", "separate_reasoning", "image"]),
    (
        "Choice methods",
        [
            "token_length_normalized",
            "greedy_token_selection",
            "unconditional_likelihood_normalized",
        ],
    ),
    (
        "Roles",
        [
            "system",
            "user",
            "assistant",
            "system_begin",
            "system_end",
            "user_begin",
            "user_end",
            "assistant_begin",
            "assistant_end",
        ],
    ),
    ("Constraints", ["Constraint"]),
    ("Sampling", ["SamplingParams"]),
    ("Errors", ["ConstraintError", "ContextLengthError", "LoraError", "BackendError"]),
]
CLASS_MEMBERS = {
    "function": ["run", "run_batch", "run_async", "trace", "bind"],
    "Constraint": [
        "from_regex",
        "from_json_schema",
        "from_choices",
        "from_dtype",
        "matches",
        "parse",
    ],
}
STATE_MEMBERS = [
    "__getitem__",
    "__iadd__",
    "text",
    "messages",
    "get_meta_info",
    "get_var",
    "set_var",
    "sync",
    "error",
    "parsed",
    "text_iter",
    "text_async_iter",
    "partial_iter",
    "partial_async_iter",
    "fork",
    "var_scope",
    "system",
    "user",
    "assistant",
]


# The backends' options: one runnable example each, then the table of their config's fields.
BACKEND_EXAMPLES = {
    "Runtime": """\
import lmprog as lp
from lmprog.backends.runtime_config import RuntimeConfig

# lmprog serve --backend runtime --device cpu --max-total-tokens 8192 --max-running-requests 8
options = dict(device="cpu", max_total_tokens=8192, max_running_requests=8, speculative="ngram")
rt = lp.Runtime(model_path="smollm2-135m-instruct", **options)
assert rt.config == RuntimeConfig(model="smollm2-135m-instruct", **options)  # or config=...
print(rt.generate_offline("The capital of France is", {"max_tokens": 8, "temperature": 0}).text)
rt.shutdown()""",
    "LlamaCpp": """\
import lmprog as lp

# lmprog serve --backend llamacpp --device cpu --max-total-tokens 8192 --max-running-requests 4
llm = lp.LlamaCpp("smollm2-135m-instruct", n_ctx=8192, n_parallel=4, n_gpu_layers=0)
print(llm.config.n_ctx, llm.n_parallel)
llm.shutdown()""",
}


def _backend_options() -> list[str]:
    from lmprog.backends.config import LlamaCppConfig
    from lmprog.backends.runtime_config import RuntimeConfig

    lines = [
        "## Backend options",
        "",
        "Each backend takes its options by name (`lp.Runtime(max_running_requests=8)`) or as "
        "one config value (`lp.Runtime(config=RuntimeConfig(...))`); an unknown name is a "
        "TypeError naming it, a bad value an error naming the option, before any weight "
        "loads. `lmprog serve` builds its backend flags from the same fields.",
        "",
    ]
    for name, config in (("Runtime", RuntimeConfig), ("LlamaCpp", LlamaCppConfig)):
        lines += [f"### `lp.{name}`: `{config.__module__}.{config.__name__}`", ""]
        lines += [_doc(config), "", "```python", BACKEND_EXAMPLES[name], "```", ""]
        lines += [config.table(), ""]
    return lines


def _doc(obj: object) -> str:
    return inspect.cleandoc(inspect.getdoc(obj) or "(undocumented)")


def _signature(name: str, obj: object) -> str:
    try:
        return f"{name}{inspect.signature(obj)}"
    except (TypeError, ValueError):
        return name


def _entry(name: str, obj: object, level: str = "###") -> list[str]:
    target = type(obj) if not (inspect.isclass(obj) or callable(obj)) else obj
    return [f"{level} `{_signature(name, target)}`", "", _doc(target), ""]


def render() -> str:
    import lmprog as lp
    from lmprog.interpreter import ProgramState
    from lmprog.interpreter.function import Function
    from lmprog.lang.fork import ForkGroup

    lines = [
        "# lmprog language reference",
        "",
        "Generated from the docstrings by `python docs/gen_reference.py`; do not edit by hand.",
        "",
    ]
    for title, names in SECTIONS:
        lines += [f"## {title}", ""]
        for name in names:
            obj = getattr(lp, name)
            lines += _entry(f"lp.{name}", obj)
            for member in CLASS_MEMBERS.get(name, []):
                owner = Function if name == "function" else obj
                lines += _entry(f"{member}", getattr(owner, member), "####")
    lines += ["## Program state", "", _doc(ProgramState), ""]
    for member in STATE_MEMBERS:
        lines += _entry(f"s.{member}", getattr(ProgramState, member), "###")
    lines += ["## Fork groups", "", _doc(ForkGroup), ""]
    lines += _entry("group.join", ForkGroup.join, "###")
    lines += _backend_options()
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python docs/gen_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
