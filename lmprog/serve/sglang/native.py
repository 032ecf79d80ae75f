"""SGLang's native HTTP protocol (/generate, /server_info, /flush_cache, ...) beside the OpenAI API.

SGLang's own frontend (`sgl.RuntimeEndpoint`) and any client of SGLang's native API run
against `lmprog serve`; bodies go through the same parsing, limits, errors and `Generations`
as the OpenAI routes. Every route and meta_info field: docs/design/server.md#sglangs-native-api.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from lmprog.core.errors import BackendError, ConstraintError
from lmprog.core.images import ImageInput
from lmprog.core.protocol import (
    Backend,
    GenerateRequest,
    GenerateResult,
    StreamPiece,
    TokenLogprob,
)
from lmprog.core.sampling import SamplingParams
from lmprog.fsm import Constraint
from lmprog.fsm.compose import special_markers

from ..context import ServeContext
from ..errors import APIError, from_exception
from ..generations import Generations
from ..images import ImageRef, check_vision, load_images
from ..jsonbody import parse_body
from ..prompt_echo import encode_prompt
from ..reasoning import OutputSplit, ReasoningPlan
from ..respond import DONE, arrival, respond, sse
from ..sampling import stop_strings
from ..schemas.native import ConcatBody, FlushBody, GenerateBody, NativeSamplingParams

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default for /generate


# What /concate_and_append_request does: SGLang's frontend prefilled each copy's whole text
# (max_new_tokens 0) before it, and sends the parent's concatenated text with its next
# request; the prefix cache serves that request the parent's text and the first copy's
# segment, and the other copies' segments are computed again at their new positions.
_CONCAT_MESSAGE = (
    "the copies' text was prefilled and cached; the parent's next request reuses the cached "
    "prefix (its text and the first copy's segment)"
)


def install(app: FastAPI, ctx: ServeContext) -> None:
    """Add the native routes to `app` (called by `build_app`)."""

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        # strict: an unknown field of SGLang's protocol is a feature lmprog lacks (lora_path)
        body = await parse_body(request, GenerateBody, ctx, strict=True)
        if body.model is not None:  # sglang-router adds it (null, or the client's)
            ctx.check_model(body.model)
        return await _generate(ctx, body, request)

    @app.get("/get_model_info")
    @app.get("/model_info")  # sglang-router asks for this name first
    async def model_info() -> JSONResponse:
        return JSONResponse(
            {
                "model_path": ctx.model_name,
                "tokenizer_path": ctx.model_name,
                "is_generation": True,
                "preferred_sampling_params": None,
                "has_image_understanding": ctx.backend.image_token is not None,
                "image_token": ctx.backend.image_token,  # lmprog's, for lp.RuntimeEndpoint
                "has_audio_understanding": False,
                # lmprog's own: how the model renders role messages, for lp.RuntimeEndpoint
                "lmprog": {"chat_template": ctx.template.source, "special_tokens": _specials(ctx)},
            }
        )

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(request: Request) -> Response:
        raw = await request.body()
        if raw.strip():
            await parse_body(request, FlushBody, ctx, strict=True)
        if type(ctx.backend).flush_cache is Backend.flush_cache:
            raise APIError(
                400,
                f"the {type(ctx.backend).__name__} backend has no prefix cache to flush",
                code="unsupported",
            )
        if not await ctx.blocking(ctx.backend.flush_cache):
            raise APIError(
                400,
                "the cache was not flushed: requests are running; try again when idle",
                code="busy",
            )
        return Response("Cache flushed.\n", media_type="text/plain")

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> JSONResponse:
        info = await ctx.blocking(ctx.backend.get_server_info)
        return JSONResponse(
            {
                **info,
                "model_path": ctx.model_name,
                "tokenizer_path": ctx.model_name,
                "served_model_name": ctx.model_name,
                "max_new_tokens": ctx.limits.max_tokens,
                "dp_size": 1,  # for routers: --dp replicas are routed inside this server
            }
        )

    @app.post("/concate_and_append_request")
    async def concate_and_append(request: Request) -> JSONResponse:
        await parse_body(request, ConcatBody, ctx, strict=True)
        return JSONResponse({"success": True, "message": _CONCAT_MESSAGE})

    @app.get("/health_generate")
    async def health_generate() -> Response:
        probe = GenerateRequest("\n", SamplingParams(max_tokens=1, temperature=0.0))
        try:
            await ctx.blocking(ctx.backend.generate, probe)
        except Exception as exc:  # noqa: BLE001 - the server is not healthy
            raise APIError(503, f"a one-token generation failed: {exc}", code="unhealthy") from None
        return Response(status_code=200)


# ---- /generate ----------------------------------------------------------------------------


class _Item:
    """One prompt of a request with its settings (a batch has several)."""

    def __init__(self, prompt: str | tuple[int, ...], rid: str, params: SamplingParams) -> None:
        self.prompt = prompt
        self.rid = rid
        self.params = params
        self.constraint: Constraint | None = None
        self.n = 1
        self.logprob_start = -1  # SGLang's default: no prompt logprobs
        self.input_logprobs: list[TokenLogprob | None] = []
        self.input_ids: tuple[int, ...] = ()
        self.reasoning: ReasoningPlan | None = None  # separate_reasoning
        self.images: tuple[ImageInput, ...] = ()  # image_data, one per image token


async def _generate(ctx: ServeContext, body: GenerateBody, request: Request) -> Response:
    started = time.perf_counter()
    prompts, batch = _prompts(body)
    items = [_item(ctx, body, i, p, len(prompts)) for i, p in enumerate(prompts)]
    total = sum(item.n for item in items)
    if total > ctx.limits.max_choices:
        raise APIError(
            400,
            f"{len(items)} prompts with their n make {total} generations; this server allows "
            f"at most {ctx.limits.max_choices} in one request",
            param="sampling_params.n",
        )
    if body.separate_reasoning:
        _reasoning(ctx, items)
    if any(item.logprob_start >= 0 for item in items):
        await ctx.blocking(_score_prompts, ctx, items)
    await _images(ctx, body, items, batch)
    requests = [
        GenerateRequest(item.input_ids or item.prompt, item.params, item.constraint, item.images)
        for item in items
        for _ in range(item.n)
    ]
    group = Generations(
        ctx.backend,
        requests,
        ctx.executor,
        stream=body.stream,
        metrics=ctx.metrics,
        arrival=arrival(request),
    )
    reply = _Reply(ctx, body, items, batch or total > 1, started)
    return await respond(request, group, reply, stream=body.stream, param="text")


async def _images(ctx: ServeContext, body: GenerateBody, items: list[_Item], batch: bool) -> None:
    """SGLang's image_data: each prompt's images read and checked (one image token in its
    text per image, in order)."""
    if body.image_data is None:
        return
    per_prompt: list[list[ImageRef]] = []
    for i in range(len(items)):
        entry: Any = body.image_data
        where = "image_data"
        if batch:
            entry = _per_prompt(body.image_data, i, len(items), "image_data")
            where = f"image_data[{i}]"
        if entry is None:
            per_prompt.append([])
        elif isinstance(entry, str):
            per_prompt.append([ImageRef(entry, where, native=True)])
        elif all(isinstance(e, str) for e in entry):
            per_prompt.append(
                [ImageRef(e, f"{where}[{k}]", native=True) for k, e in enumerate(entry)]
            )
        else:
            raise APIError(400, f"{where}: an image is a string", param=where)
    refs = [ref for refs in per_prompt for ref in refs]
    check_vision(ctx, refs)
    images = iter(await ctx.blocking(load_images, ctx.limits, refs))
    token = ctx.backend.image_token
    for item, refs in zip(items, per_prompt):
        item.images = tuple(next(images) for _ in refs)
        if not refs:
            continue
        if not isinstance(item.prompt, str):
            raise APIError(
                400, "image_data needs a text prompt (not input_ids)", param=refs[0].param
            )
        found = item.prompt.count(token)
        if found != len(refs):
            raise APIError(
                400,
                f"the prompt holds the model's image token {token!r} {found} times for "
                f"{len(refs)} images in image_data: put it once where each image goes",
                param=refs[0].param.partition("[")[0] if not batch else refs[0].param,
            )


def _reasoning(ctx: ServeContext, items: list[_Item]) -> None:
    """separate_reasoning: each item's reasoning plan (its prompt's state of the block) and
    its constraint applied after the thinking; a 400 without a reasoning format."""
    if ctx.reasoning is None:
        raise APIError(
            400,
            "separate_reasoning needs a reasoning model: this server's model has no reasoning "
            "format (start the server with --reasoning-parser NAME if its template hides it)",
            param="separate_reasoning",
        )
    try:
        tokenizer = ctx.backend.tokenizer
    except Exception:  # noqa: BLE001 - no local tokenizer (an endpoint): markers as text
        tokenizer = None
    marked = tokenizer is not None and ctx.reasoning.marked_by_special_tokens(tokenizer)
    specials = special_markers(tokenizer, ctx.reasoning.marker_texts) if marked else {}
    for item in items:
        prompt = item.prompt if isinstance(item.prompt, str) else ""
        state = ctx.reasoning.prompt_state(prompt)
        item.reasoning = ReasoningPlan(ctx.reasoning, state)
        if marked:  # the markers must be in the text to split it
            item.params = replace(item.params, skip_special_tokens=False)
        if state != "closed":
            item.constraint = item.reasoning.constrain(
                item.constraint, "sampling_params", specials=specials
            )


def _prompts(body: GenerateBody) -> tuple[list[str | tuple[int, ...]], bool]:
    """The prompts and whether the request is a batch (a list of them)."""
    if (body.text is None) == (body.input_ids is None):
        raise APIError(400, "give exactly one of text and input_ids", param="text")
    if body.text is not None:
        if isinstance(body.text, str):
            return [body.text], False
        if not body.text:
            raise APIError(400, "text must not be an empty list", param="text")
        return list(body.text), True
    ids = body.input_ids
    if not ids:
        raise APIError(400, "input_ids must not be empty", param="input_ids")
    if isinstance(ids[0], int):
        return [tuple(ids)], False  # type: ignore[arg-type]
    if any(not p for p in ids):  # type: ignore[union-attr]
        raise APIError(400, "a prompt of input_ids must not be empty", param="input_ids")
    return [tuple(p) for p in ids], True  # type: ignore[union-attr]


def _per_prompt(value: Any, i: int, count: int, name: str) -> Any:
    """A field's value for prompt i: the value itself, or entry i of a list of one per prompt."""
    if not isinstance(value, list):
        return value
    if len(value) != count:
        raise APIError(
            400, f"{name} has {len(value)} entries for {count} prompts; give one each", param=name
        )
    return value[i]


def _item(ctx: ServeContext, body: GenerateBody, i: int, prompt: Any, count: int) -> _Item:
    sp = _per_prompt(body.sampling_params, i, count, "sampling_params") or NativeSamplingParams()
    rid = _per_prompt(body.rid, i, count, "rid") or uuid.uuid4().hex
    return_logprob = bool(_per_prompt(body.return_logprob, i, count, "return_logprob"))
    top = _per_prompt(body.top_logprobs_num, i, count, "top_logprobs_num") or 0
    start = _per_prompt(body.logprob_start_len, i, count, "logprob_start_len")
    if top < 0 or top > ctx.limits.max_logprobs:
        raise APIError(
            400,
            f"top_logprobs_num must be in [0, {ctx.limits.max_logprobs}], got {top}",
            param="top_logprobs_num",
        )
    if start is not None and start < -1:
        raise APIError(
            400, f"logprob_start_len must be >= -1, got {start}", param="logprob_start_len"
        )
    item = _Item(prompt, str(rid), _sampling(ctx, sp, return_logprob, top))
    lora = _per_prompt(body.lora_path, i, count, "lora_path")
    if lora is not None:  # SGLang's lora_path: an adapter's name
        item.params = replace(item.params, lora_path=ctx.adapter(lora, "lora_path"))
    item.constraint = _constraint(sp)
    item.n = 1 if sp.n is None else sp.n
    if item.n > ctx.limits.max_n:
        raise APIError(
            400, f"n is {item.n}; this server allows at most {ctx.limits.max_n}", param="n"
        )
    if return_logprob and start is not None:
        item.logprob_start = start
    return item


def _sampling(
    ctx: ServeContext, sp: NativeSamplingParams, return_logprob: bool, top: int
) -> SamplingParams:
    name = sp.unsupported()
    if name is not None:
        raise APIError(
            400,
            f"sampling_params.{name}={getattr(sp, name)!r} is not supported by this server",
            param=f"sampling_params.{name}",
            code="unsupported_parameter",
        )
    tokens = DEFAULT_MAX_NEW_TOKENS if sp.max_new_tokens is None else sp.max_new_tokens
    tokens = min(tokens, ctx.limits.max_tokens) if sp.max_new_tokens is None else tokens
    if tokens > ctx.limits.max_tokens:
        raise APIError(
            400,
            f"max_new_tokens is {tokens}; this server allows at most {ctx.limits.max_tokens}",
            param="sampling_params.max_new_tokens",
            code="max_tokens_too_large",
        )
    fields = {
        "max_tokens": tokens,
        "min_tokens": sp.min_new_tokens,
        "stop": stop_strings(sp.stop, ctx.limits),
        "stop_regex": stop_strings(sp.stop_regex, ctx.limits),
        "stop_token_ids": tuple(sp.stop_token_ids or ()),
        "temperature": sp.temperature,
        "top_p": sp.top_p,
        "top_k": sp.top_k,
        "min_p": sp.min_p,
        "frequency_penalty": sp.frequency_penalty,
        "presence_penalty": sp.presence_penalty,
        "repetition_penalty": sp.repetition_penalty,
        "ignore_eos": sp.ignore_eos,
        "skip_special_tokens": sp.skip_special_tokens,
        "seed": sp.sampling_seed,
        "return_logprob": return_logprob,
        "top_logprobs_num": top if return_logprob else 0,
    }
    try:
        return SamplingParams().merged({k: v for k, v in fields.items() if v is not None})
    except (TypeError, ValueError) as exc:
        raise APIError(400, f"sampling_params: {exc}", param="sampling_params") from None


def _constraint(sp: NativeSamplingParams) -> Constraint | None:
    given = [
        (k, v)
        for k, v in (("regex", sp.regex), ("json_schema", sp.json_schema), ("ebnf", sp.ebnf))
        if v is not None
    ]
    if not given:
        return None
    if len(given) > 1:
        raise APIError(
            400,
            f"give at most one of regex, json_schema and ebnf, got {[k for k, _ in given]}",
            param=f"sampling_params.{given[1][0]}",
        )
    kind, value = given[0]
    try:
        if kind == "regex":
            return Constraint.from_regex(value)
        if kind == "ebnf":
            return Constraint.from_ebnf(value)
        return Constraint.from_json_schema(value)
    except ConstraintError as exc:
        raise APIError(
            400, f"invalid {kind}: {exc}", param=f"sampling_params.{kind}", code=f"invalid_{kind}"
        ) from None


def _score_prompts(ctx: ServeContext, items: list[_Item]) -> None:
    """Prompt token logprobs of the items that ask for them (a worker thread: blocking):
    `backend.prompt_logprobs` over the prompt's token ids; the generation that follows starts
    from the same ids, its prefix already cached."""
    backend = ctx.backend
    for item in items:
        if item.logprob_start < 0:
            continue
        ids = (
            item.prompt
            if isinstance(item.prompt, tuple)
            else encode_prompt(backend.tokenizer, item.prompt)
        )
        if not ids:
            raise APIError(400, "prompt logprobs need a non-empty prompt", param="text")
        item.input_ids = tuple(ids)
        start = item.logprob_start
        if start >= len(ids):
            continue
        try:
            scored = backend.prompt_logprobs(ids, max(start, 1), item.params.top_logprobs_num)
        except BackendError as exc:
            raise APIError(
                400,
                f"prompt logprobs (return_logprob with logprob_start_len >= 0): {exc}",
                param="logprob_start_len",
            ) from None
        except Exception as exc:  # noqa: BLE001 - mapped to an HTTP error
            raise from_exception(exc, param="text") from None
        item.input_logprobs = ([None] if start == 0 else []) + list(scored)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0  # JSON has no -inf (as in the OpenAI routes)


class _Reply:
    """The response bodies of one /generate request (generation index = prompt's first
    index + sample)."""

    def __init__(
        self, ctx: ServeContext, body: GenerateBody, items: list[_Item], batch: bool, started: float
    ) -> None:
        self.ctx = ctx
        self.body = body
        self.items = [item for item in items for _ in range(item.n)]
        self.batch = batch
        self.started = started
        self._tokenizer: Any = None

    def _text_of(self, token_id: int) -> str | None:
        if not self.body.return_text_in_logprobs:
            return None
        if self._tokenizer is None:
            self._tokenizer = self.ctx.backend.tokenizer
        return self._tokenizer.decode([token_id])

    def _entry(self, logprob: float | None, token_id: int, token: str | None) -> list[Any]:
        text = token if self.body.return_text_in_logprobs else None
        return [None if logprob is None else _finite(logprob), token_id, text]

    def _top(self, t: TokenLogprob | None) -> list[list[Any]] | None:
        if t is None:
            return None
        return [self._entry(a.logprob, a.token_id, a.token) for a in t.top]

    def _input_logprobs(self, item: _Item) -> tuple[list[Any], list[Any]]:
        if item.logprob_start < 0:
            return [], []
        ids = item.input_ids[item.logprob_start :]
        entries, tops = [], []
        for token_id, t in zip(ids, item.input_logprobs):
            if t is None:
                entries.append(self._entry(None, token_id, self._text_of(token_id)))
            else:
                entries.append(self._entry(t.logprob, t.token_id, t.token))
            tops.append(self._top(t))
        return entries, tops

    def meta_info(self, index: int, result: GenerateResult) -> dict[str, Any]:
        item = self.items[index]
        meta: dict[str, Any] = {
            "id": item.rid,
            "finish_reason": result.finish_info(),
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "cached_tokens": result.cached_tokens,
            "e2e_latency": time.perf_counter() - self.started,
        }
        if result.message:
            meta["message"] = result.message
        if item.params.return_logprob:
            inputs, input_tops = self._input_logprobs(item)
            outputs = list(result.logprobs or ())
            meta["input_token_logprobs"] = inputs
            meta["output_token_logprobs"] = [
                self._entry(t.logprob, t.token_id, t.token) for t in outputs
            ]
            if item.params.top_logprobs_num:
                meta["input_top_logprobs"] = input_tops
                meta["output_top_logprobs"] = [self._top(t) for t in outputs]
        return meta

    def _output(self, index: int, result: GenerateResult) -> dict[str, Any]:
        out = {
            "text": result.text,
            "output_ids": list(result.token_ids),
            "meta_info": self.meta_info(index, result),
        }
        plan = self._item_of(index).reasoning
        if plan is not None:
            reasoning, out["text"] = plan.split(result.text)
            out["reasoning_content"] = reasoning
        return out

    def _item_of(self, index: int) -> _Item:
        return self.items[index]

    def response_body(self, results: list[GenerateResult]) -> Any:
        self.ctx.metrics.on_usage(
            sum(r.prompt_tokens for r in results),
            sum(r.completion_tokens for r in results),
            sum(r.cached_tokens for r in results),
        )
        outputs = [self._output(i, r) for i, r in enumerate(results)]
        return outputs if self.batch else outputs[0]

    async def stream(self, group: Generations) -> Any:
        """SSE events: the text so far of a generation at each new piece, its whole output
        when it ends, then [DONE]; a failure once the stream began is an {"error": {...}}
        event before [DONE]. As SGLang streams them, each event's meta_info has
        `completion_tokens` so far and, with return_logprob, the logprobs of its own tokens
        (`output_token_logprobs`, `output_top_logprobs`; those not sent yet in the last) and
        `output_token_logprobs_length`, the count so far."""
        texts = [""] * group.size
        thoughts: list[str | None] = [None] * group.size
        sent = [0] * group.size  # logprobs sent so far
        splits = [OutputSplit(self._item_of(i).reasoning) for i in range(group.size)]
        try:
            async for index, event in group.events():
                item = self._item_of(index)
                if isinstance(event, str):
                    reasoning, answer = splits[index].feed(event)
                    texts[index] += answer
                    out: dict[str, Any] = {
                        "text": texts[index],
                        "meta_info": {"id": item.rid, "finish_reason": None},
                    }
                    self._piece_meta(out["meta_info"], event, item, sent, index)
                    if item.reasoning is not None:
                        thoughts[index] = (thoughts[index] or "") + reasoning
                        out["reasoning_content"] = thoughts[index]
                else:
                    self.ctx.metrics.on_usage(
                        event.prompt_tokens, event.completion_tokens, event.cached_tokens
                    )
                    out = self._output(index, event)
                    self._last_meta(out["meta_info"], sent[index])
                if self.batch:
                    out["index"] = index
                yield sse(out)
        except Exception as exc:  # noqa: BLE001 - a generation failed after the stream began
            yield sse(from_exception(exc).body())
        yield DONE

    def _piece_meta(
        self, meta: dict[str, Any], piece: str, item: _Item, sent: list[int], index: int
    ) -> None:
        """A streamed piece's progress (a StreamPiece from the decoder: other backends'
        pieces carry none)."""
        if not isinstance(piece, StreamPiece):
            return
        meta["completion_tokens"] = piece.completion_tokens
        if item.params.return_logprob:
            logprobs = list(piece.logprobs or ())
            meta["output_token_logprobs"] = [
                self._entry(t.logprob, t.token_id, t.token) for t in logprobs
            ]
            if item.params.top_logprobs_num:
                meta["output_top_logprobs"] = [self._top(t) for t in logprobs]
            sent[index] += len(logprobs)
            meta["output_token_logprobs_length"] = sent[index]

    @staticmethod
    def _last_meta(meta: dict[str, Any], sent: int) -> None:
        """The last event's logprobs: those its pieces did not send."""
        if "output_token_logprobs" in meta:
            meta["output_token_logprobs_length"] = len(meta["output_token_logprobs"])
            for key in ("output_token_logprobs", "output_top_logprobs"):
                if key in meta:
                    meta[key] = meta[key][sent:]


def _specials(ctx: ServeContext) -> dict[str, str]:
    try:
        special = getattr(ctx.backend.tokenizer, "special_tokens_map", None) or {}
    except Exception:  # noqa: BLE001 - a backend without a tokenizer: the template has none
        return {}
    return {k: v for k, v in special.items() if isinstance(v, str)}


__all__ = ["install"]
