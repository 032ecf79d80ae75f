"""The primitives a program appends: `gen`, `select`, roles, `image`.

Each validates its arguments when called (so a bad argument raises at the line that wrote
it) and returns an IR expression; nothing runs until the expression is appended to a state.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lmprog.core.errors import BackendError, ConstraintError
from lmprog.core.images import ImageInput
from lmprog.core.limits import check_stop_limits, get_limits, over_limit
from lmprog.core.sampling import SamplingParams, canonical_sampling_names
from lmprog.lang.choices import ChoicesMethod, token_length_normalized
from lmprog.lang.ir import (
    ArgRef,
    Concat,
    Expr,
    Gen,
    Image,
    RoleBegin,
    RoleEnd,
    Select,
    TraceStop,
    flatten,
)

if TYPE_CHECKING:
    from lmprog.fsm import Constraint

_DTYPES = (int, float, bool, str)


# SGLang's regular expressions for typed values, as its programs import them.
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | Sequence[str] | None = None,
    stop_token_ids: int | Sequence[int] | None = None,
    stop_regex: str | Sequence[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: type | None = None,
    choices: Sequence[str] | None = None,
    choices_method: ChoicesMethod | None = None,
    regex: str | None = None,
    json_schema: object = None,
    *,
    seed: int | None = None,
    ebnf: str | None = None,
    lora_path: str | None = None,
) -> Expr:
    """Generate a continuation and store it in variable `name`.

    The arguments may be given by position in SGLang's order, `name, max_tokens,
    min_tokens, n, stop, stop_token_ids, stop_regex, temperature, top_p, top_k, min_p,
    frequency_penalty, presence_penalty, ignore_eos, return_logprob, logprob_start_len,
    top_logprobs_num, return_text_in_logprobs, dtype, choices, choices_method, regex,
    json_schema` (`lp.gen("tip", 64, stop="\\n")`); lmprog's `seed` and `ebnf` and the
    LoRA adapter `lora_path` (SGLang's name; a run's default too) are keyword-only.

    Sampling arguments left as None inherit the defaults given to `run(...)` /
    `run_batch(...)`, then `lp.SamplingParams`' defaults (max_tokens=128, temperature=1.0,
    ...). `stop` strings are removed from the result; generation also ends at any of
    `stop_token_ids`, and once the output matches one of the `stop_regex` patterns (Python
    `re.search`, as SGLang's; the match stays in the text). With `return_logprob=True`
    (and `top_logprobs_num=k`), the variable's meta info holds per-token logprobs
    (`return_text_in_logprobs` is accepted: lmprog's logprobs always carry the token text;
    `logprob_start_len` may only be None or -1, SGLang's "no prompt logprobs"). With `n=k`
    (k > 1) the gen draws k continuations: the variable is the list of their texts (its
    meta info a list too) and the text goes on with the first, as SGLang's OpenAI backend
    has it.

    At most one constraint:
      - `regex="..."`: the output matches the regular expression exactly (SGLang's
        `lp.REGEX_INT`, `lp.REGEX_FLOAT`, `lp.REGEX_BOOL` and `lp.REGEX_STR` are provided);
      - `json_schema=`: a dict, a JSON string, a pydantic model class, a Python type
        (`Literal[...]`, `list[int]`, `dict[str, int]`, a TypedDict, a dataclass, an Enum,
        unions of them) or an `lp.Constraint.from_json_schema(...)`; the output is JSON valid
        under it, objects holding only the keys the schema lists unless it allows others
        (`strict`, see `lp.Constraint.from_json_schema`; pass a Constraint built with
        `strict=False` for the spec's open objects); the variable holds the text,
        `state.parsed(name)` the value as the type given (a model, dataclass or Enum member;
        a dict for a schema);
      - `dtype=int | float | bool | str`: the output matches SGLang's pattern for that type
        (`REGEX_INT`, `REGEX_FLOAT`, `REGEX_BOOL`, `REGEX_STR`: a string keeps its quotes);
        the variable holds the text, as in SGLang, and `state.parsed(name)` the int, float,
        bool or str; as in SGLang, a number ends at a space or newline, and here also at
        `,;)]}` (and `.` after an int), the rest of that token free: stop strings, so not
        in the text.
        A constrained gen cut short at max_tokens holds its partial text instead (finish
        reason "length" in its meta info), as in SGLang; `state.parsed(name)` then raises;
      - `ebnf="root ::= ..."`: the output is in the language of the grammar (the GBNF dialect
        of llama.cpp grammars and SGLang's `ebnf`; recursion at any depth);
      - `choices=[...]`: behaves exactly like `lp.select(name, choices, temperature,
        choices_method)`.

    Raises TypeError/ValueError for a bad argument (e.g. `max_tokens < min_tokens`) and
    `lp.ConstraintError` for an invalid regex, schema or grammar, here at the call.
    """
    _check_name(name, "gen")
    constraints = {
        "regex": regex,
        "json_schema": json_schema,
        "choices": choices,
        "dtype": dtype,
        "ebnf": ebnf,
    }
    given = [k for k, v in constraints.items() if v is not None]
    if len(given) > 1:
        raise ValueError(
            f"gen() takes at most one of regex/json_schema/choices/dtype/ebnf, got {given}"
        )
    if choices is not None:
        method = token_length_normalized if choices_method is None else choices_method
        return select(name, choices, 0.0 if temperature is None else temperature, method)
    if choices_method is not None:
        raise TypeError("gen(choices_method=...) applies only with choices=[...]")
    if dtype is not None:
        stop = _with_terminators(stop, dtype)
    sampling = {
        "max_tokens": max_tokens,
        "min_tokens": min_tokens,
        "n": n,
        "stop": stop,
        "stop_token_ids": stop_token_ids,
        "stop_regex": stop_regex,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
        "frequency_penalty": frequency_penalty,
        "presence_penalty": presence_penalty,
        "ignore_eos": ignore_eos,
        "seed": seed,
        "lora_path": lora_path,
        "return_logprob": return_logprob,
        "logprob_start_len": logprob_start_len,
        "top_logprobs_num": top_logprobs_num,
        "return_text_in_logprobs": return_text_in_logprobs,
    }
    overrides = _checked_overrides({k: v for k, v in sampling.items() if v is not None})
    constraint, spec = _build_constraint(regex, json_schema, dtype, ebnf)
    return Gen(name, overrides, constraint, spec, _python_type(json_schema))


def gen_int(
    name: str | None = None,
    max_tokens: int | None = None,
    n: int | None = None,
    stop: str | Sequence[str] | None = None,
    stop_token_ids: int | Sequence[int] | None = None,
    stop_regex: str | Sequence[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    *,
    seed: int | None = None,
) -> Expr:
    """`lp.gen(name, ..., dtype=int)`, as SGLang's `gen_int`: the variable holds the
    number's text, `state.parsed(name)` the int.

    Positional arguments follow SGLang's `gen_int` (`n` third; no min_tokens).
    """
    return gen(**_typed_gen_args(locals()), dtype=int)


def gen_string(
    name: str | None = None,
    max_tokens: int | None = None,
    n: int | None = None,
    stop: str | Sequence[str] | None = None,
    stop_token_ids: int | Sequence[int] | None = None,
    stop_regex: str | Sequence[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    *,
    seed: int | None = None,
) -> Expr:
    """`lp.gen(name, ..., dtype=str)`, as SGLang's `gen_string`: a double-quoted string of
    letters, digits, `_` and spaces; the variable holds it with its quotes, as in SGLang,
    `state.parsed(name)` the str between them.

    Positional arguments follow SGLang's `gen_string` (`n` third; no min_tokens).
    """
    return gen(**_typed_gen_args(locals()), dtype=str)


def _typed_gen_args(args: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in args.items() if v is not None}


def select(
    name: str | None = None,
    choices: Sequence[str] | None = None,
    temperature: float = 0.0,
    choices_method: ChoicesMethod = token_length_normalized,
) -> Select:
    """Append the most likely of `choices` and store it in variable `name`.

    Arguments in SGLang's order, `name, choices, temperature, choices_method`. The backend
    scores each choice as a continuation of the text so far (with token healing);
    `choices_method` picks the winner: `lp.token_length_normalized` (default),
    `lp.greedy_token_selection` or `lp.unconditional_likelihood_normalized`. Scoring is
    deterministic: `temperature` must be 0 (SGLang's runtime backend asserts the same).
    The variable's meta info holds SGLang's keys (`normalized_prompt_logprobs`,
    `input_token_logprobs`, `output_token_logprobs`, and the method's own) and lmprog's
    (`normalized_scores`, ...).

    Raises TypeError unless `choices` is a list of str, ValueError for an empty list, an
    empty string, a duplicate choice or a temperature above 0.
    """
    _check_name(name, "select")
    if choices is None:
        raise TypeError("select() needs choices=[...], a non-empty list of strings")
    _reject_placeholder(choices, "choices")
    if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence):
        raise TypeError(
            f"choices must be a list of strings, got {type(choices).__name__} {choices!r}"
        )
    for c in choices:
        _reject_placeholder(c, "a choice")
        if not isinstance(c, str):
            raise TypeError(f"every choice must be a str, got {type(c).__name__} {c!r}")
    if not choices:
        raise ValueError("select() needs at least one choice, got an empty list")
    if len(choices) > get_limits().max_choices:
        raise over_limit("select() has too many choices", len(choices), "max_choices")
    if "" in choices:
        raise ValueError("choices must be non-empty strings, got ''")
    duplicates = sorted(c for c, n in Counter(choices).items() if n > 1)
    if duplicates:
        raise ValueError(f"choices must be distinct; repeated: {duplicates}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"select() temperature must be a number, got {temperature!r}")
    if temperature > 1e-5:
        raise ValueError(
            f"select() scores its choices deterministically: temperature must be 0, got "
            f"{temperature} (SGLang's runtime backend asserts the same)"
        )
    if not isinstance(choices_method, ChoicesMethod):
        raise TypeError(
            "choices_method must be lp.token_length_normalized, lp.greedy_token_selection or "
            f"lp.unconditional_likelihood_normalized, got {choices_method!r}"
        )
    return Select(name, tuple(choices), choices_method)


def image(source: Any) -> Image:
    """An image for a vision-language model, as SGLang's `sgl.image`: a path to an image
    file, its encoded bytes (PNG, JPEG, WebP, ...), a PIL image or a base64 data URL
    (`data:image/png;base64,...`). Several may go in one prompt, inside roles.

    When the program reaches it, the backend's image token (`Backend.image_token`) is
    appended in its place and every later gen/select sends the image with its prompt; a
    backend whose model takes no images raises `lp.BackendError` there. A path is read
    then (as SGLang reads it); the other forms are encoded here. An http(s) URL is not
    fetched: download it and pass the bytes.
    """
    _reject_placeholder(source, "image()")
    if isinstance(source, str) and source.startswith(("http://", "https://")):
        raise ValueError(
            f"image() does not fetch URLs ({source[:60]!r}): download the image and pass its "
            "bytes or a file path"
        )
    if isinstance(source, os.PathLike) or (
        isinstance(source, str) and not source.startswith("data:")
    ):
        path = os.fspath(source)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"image() file not found: {path!r}")
        return Image(path)
    if isinstance(source, (bytes, bytearray, memoryview)) and not source:
        raise ValueError("image() got empty bytes")
    try:  # bytes, a data URL, a PIL image: the encoded bytes (a PIL image as PNG)
        return Image(ImageInput.from_source(source).data)
    except TypeError:
        raise TypeError(
            "image() takes a file path, encoded bytes, a PIL image or a data URL, got "
            f"{type(source).__name__}"
        ) from None


def video(path: str | os.PathLike[str], num_frames: int) -> Expr:
    """SGLang's `sgl.video(path, num_frames)`, frames of a video for a multimodal model.

    No lmprog backend takes video input yet: it raises `lp.BackendError` at the call.
    """
    raise BackendError(
        f"lp.video({path!r}, {num_frames!r}): no lmprog backend takes video input "
        "(none has a vision model); describe the video in text instead"
    )


def _role(role: str, expr: object) -> Expr:
    if expr is None:
        return Concat((RoleBegin(role), RoleEnd(role)))
    return Concat((RoleBegin(role), *flatten(expr), RoleEnd(role)))


def system(expr: object = None) -> Expr:
    """A whole system message: `s += lp.system("Be terse.")` (content may hold gens)."""
    return _role("system", expr)


def user(expr: object = None) -> Expr:
    """A whole user message: `s += lp.user(question)`."""
    return _role("user", expr)


def assistant(expr: object = None) -> Expr:
    """A whole assistant message: `s += lp.assistant(lp.gen("answer"))`."""
    return _role("assistant", expr)


def system_begin() -> RoleBegin:
    """Open a system message; close it with `lp.system_end()`."""
    return RoleBegin("system")


def system_end() -> RoleEnd:
    """Close the open system message."""
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    """Open a user message; close it with `lp.user_end()`."""
    return RoleBegin("user")


def user_end() -> RoleEnd:
    """Close the open user message."""
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    """Open an assistant message; close it with `lp.assistant_end()`."""
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    """Close the open assistant message."""
    return RoleEnd("assistant")


def _check_name(name: object, where: str) -> None:
    _reject_placeholder(name, f"the name of {where}()")
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"{where}() name must be a non-empty str or None, got {name!r}")


def _checked_overrides(overrides: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Validate a gen's own sampling arguments; return them normalised and sorted.

    Cross-field checks (min_tokens <= max_tokens) apply only when the call set both: the
    other may come from run()'s defaults, and the append re-checks the merged result.
    """
    for key, value in overrides.items():
        _reject_placeholder(value, f"gen({key}=...)")
    overrides = canonical_sampling_names(overrides)  # checks and drops SGLang's no-op names
    base = SamplingParams()
    if "max_tokens" not in overrides and isinstance(overrides.get("min_tokens"), int):
        base = SamplingParams(max_tokens=max(base.max_tokens, overrides["min_tokens"]))
    checked = base.merged(overrides)
    check_stop_limits(checked.stop, "gen")
    return tuple(sorted((k, getattr(checked, k)) for k in overrides))


def _with_terminators(stop: Any, dtype: Any) -> Any:
    """`stop` plus the strings that end a typed value (a number's space, newline or
    punctuation: `DType.terminators`); an unusable `stop` or dtype is left for the checks to
    report."""
    from lmprog.fsm.dtypes import DTYPES  # lazy: lmprog.fsm adds ~150 ms to `import lmprog`

    d = DTYPES.get(getattr(dtype, "__name__", ""))
    if d is None or not d.terminators:
        return stop
    if stop is None:
        given: list[Any] = []
    elif isinstance(stop, str):
        given = [stop]
    elif isinstance(stop, (list, tuple)):
        given = list(stop)
    else:
        return stop
    return tuple(given + [t for t in d.terminators if t not in given])


def _build_constraint(
    regex: object, json_schema: object, dtype: object, ebnf: object = None
) -> tuple[Constraint | None, str | None]:
    if regex is None and json_schema is None and dtype is None and ebnf is None:
        return None, None
    _reject_placeholder(regex, "gen(regex=...)")
    _reject_placeholder(json_schema, "gen(json_schema=...)")
    _reject_placeholder(ebnf, "gen(ebnf=...)")
    if ebnf is not None:
        if not isinstance(ebnf, str):
            raise TypeError(f"ebnf must be a str, got {type(ebnf).__name__}")
        return _constraint_class().from_ebnf(ebnf), "ebnf"
    if regex is not None:
        if not isinstance(regex, str):
            raise TypeError(f"regex must be a str, got {type(regex).__name__}")
        return _constraint_class().from_regex(regex), f"regex={regex!r}"
    if json_schema is not None:
        constraint_class = _constraint_class()
        if isinstance(json_schema, constraint_class):
            if json_schema.kind != "json_schema":
                raise TypeError(
                    f"gen(json_schema=...) takes a json_schema Constraint, got a {json_schema.kind} "
                    "one: pass it as regex=/ebnf=/dtype= instead, or build it with "
                    "Constraint.from_json_schema"
                )
            return json_schema, "json_schema"
        return constraint_class.from_json_schema(json_schema), "json_schema"
    if dtype not in _DTYPES:
        raise TypeError(f"dtype must be one of int, float, bool, str; got {dtype!r}")
    return _constraint_class().from_dtype(dtype), f"dtype={dtype.__name__}"


def _python_type(json_schema: object) -> object:
    """The Python type a json_schema was given as (what `state.parsed` builds), or None."""
    if json_schema is None or isinstance(json_schema, (dict, str, bool)):
        return None
    from lmprog.fsm.json_schema import (
        python_type,
    )  # lazy: lmprog.fsm adds ~150 ms to `import lmprog`

    return python_type(json_schema)


def _constraint_class() -> type[Constraint]:
    # Imported here so that `import lmprog.lang` stays light.
    try:
        from lmprog.fsm import Constraint
    except ImportError as e:
        raise ConstraintError(
            f"constrained generation (regex/json_schema/dtype) needs lmprog.fsm.Constraint, which is not available: {e}"
        ) from e
    return Constraint


def _reject_placeholder(value: object, where: str) -> None:
    if isinstance(value, ArgRef):
        raise TraceStop(f"argument {value.name!r} is used as {where}, which needs its value")
