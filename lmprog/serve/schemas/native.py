"""The request bodies of SGLang's native API (/generate, /flush_cache,
/concate_and_append_request) as pydantic models; the routes are in sglang/native.py."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .completions import MAX_SEED, Strict
from .router import RouterFields


class NativeSamplingParams(Strict):
    """`sampling_params` of SGLang's /generate. Every field may be null (SGLang's frontend
    sends each one); settings lmprog cannot honour are refused when set."""

    max_new_tokens: int | None = Field(default=None, ge=0)
    min_new_tokens: int | None = Field(default=None, ge=0)
    n: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1, le=2**31 - 1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    ignore_eos: bool | None = None
    sampling_seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    regex: str | None = None
    json_schema: str | dict[str, Any] | None = None
    ebnf: str | None = None
    stop_regex: str | list[str] | None = None
    skip_special_tokens: bool | None = None
    # accepted at the values lmprog always uses; anything else is refused
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = None

    def unsupported(self) -> str | None:
        """The first field set to a value lmprog cannot honour, or None."""
        for name, ok in (
            ("spaces_between_special_tokens", self.spaces_between_special_tokens in (None, True)),
            ("no_stop_trim", self.no_stop_trim in (None, False)),
        ):
            if not ok:
                return name
        return None


class GenerateBody(RouterFields):
    """SGLang's GenerateReqInput: the fields lmprog serves (and those sglang-router adds)."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: NativeSamplingParams | list[NativeSamplingParams] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    lora_path: str | list[str | None] | None = None  # a loaded LoRA adapter's name (per prompt)
    # SGLang's: an image (a data URL, an http(s) URL, a path, base64 data) or a list of them
    # for one prompt; for a batch, one such entry per prompt
    image_data: str | list[str | list[str] | None] | None = None
    separate_reasoning: bool = False  # the output as "text" (answer) and "reasoning_content"


class FlushBody(Strict):
    empty_cache: bool | None = None  # SGLang's client sends it; the cache is emptied either way


class ConcatBody(Strict):
    """SGLang's frontend at `join(mode="concate_and_append")`: its fork copies' request ids
    and the parent's (ids of its own, which no /generate named)."""

    src_rids: list[str]
    dst_rid: str
