"""/v1/chat/completions: the chat pipeline (chat template, n choices, streaming,
response_format, tools, logprobs).

Tool calls are constrained in the model's own call format (tools/); streamed, each choice's
text goes through a CallReader, which streams an answer as content and calls as OpenAI's
tool-call deltas. Design: docs/design/server.md#chat-completions-the-chat-pipeline.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from lmprog.core.protocol import GenerateRequest, GenerateResult
from lmprog.fsm.compose import special_markers

from ..compile import build_index, compiled
from ..constraints import body_constraint, constraint_field
from ..context import ServeContext
from ..errors import APIError
from ..generations import Generations
from ..images import chat_image_refs, check_vision, load_images
from ..logprobs import chat_logprobs, visible_logprobs
from ..prompts import render_chat, template_kwargs
from ..reasoning import OutputSplit, ReasoningPlan, reasoning_plan, reasoning_tokens
from ..respond import ReplyBase, arrival, finish_reason, respond, sse, usage
from ..sampling import choice_params, choices_of, sampling_params
from ..schemas.chat import ChatCompletionRequest
from ..tools.formats import CallReader, tool_format
from ..tools.plan import ToolPlan, plan_tools


async def create_chat_completion(
    ctx: ServeContext, body: ChatCompletionRequest, request: Request
) -> Response:
    group, reply = await start_chat_completion(ctx, body, request)
    return await respond(request, group, reply, stream=bool(body.stream), param="messages")


async def start_chat_completion(
    ctx: ServeContext, body: ChatCompletionRequest, request: Request
) -> tuple[Generations, ReplyBase]:
    """The request's running choices and the reply that writes their chat.completion bodies
    (`response_body`) or chunks (`stream`). /v1/responses runs through here too (responses.py
    converts its request to `body` and the reply's output back)."""
    lora = ctx.check_model(body.model)
    n = choices_of(body, ctx.limits)
    params = sampling_params(body, ctx.limits, max_tokens=_max_tokens(body), logprobs=_top(body))
    if lora is not None:  # `model` names a LoRA adapter
        params = replace(params, lora_path=lora)
    if body.tools and len(body.tools) > ctx.limits.max_tools:
        raise APIError(
            400,
            f"{len(body.tools)} tools is more than this server's limit of {ctx.limits.max_tools} "
            "(max_tools, lmprog serve --max-tools)",
            param="tools",
            code="too_many_tools",
        )
    refs = chat_image_refs(body.messages)
    check_vision(ctx, refs)
    images = await ctx.blocking(load_images, ctx.limits, refs) if refs else ()
    field = constraint_field(body)
    if body.tools or field is not None:  # compiling schemas may take a while
        param = "tools" if body.tools else field
        plan, prompt, thinking = await compiled(ctx, request, param, _prepare, ctx, body, True)
    else:
        plan, prompt, thinking = await ctx.blocking(_prepare, ctx, body)
    headed = plan.headed
    constraint = (
        plan.constraint
        if thinking is None
        else thinking.constrain(plan.constraint, headed=headed, specials=plan.specials)
    )
    tokenizer = _tokenizer(ctx)
    if (thinking is not None and thinking.fmt.marked_by_special_tokens(tokenizer)) or (
        (plan.calls is not None or plan.headed) and plan.format.marked_by_special_tokens(tokenizer)
    ):
        params = replace(params, skip_special_tokens=False)  # the markers must be in the text
    requests = [GenerateRequest(prompt, p, constraint, images) for p in choice_params(params, n)]
    backend = (
        ctx.backend
        if thinking is None
        else thinking.backend(ctx.backend, plan.constraint, headed=headed, specials=plan.specials)
    )
    group = Generations(
        backend,
        requests,
        ctx.executor,
        stream=bool(body.stream),
        metrics=ctx.metrics,
        arrival=arrival(request),
    )
    return group, _Reply(ctx, body, plan, thinking)


def _max_tokens(body: ChatCompletionRequest) -> int | None:
    if body.max_completion_tokens is not None:
        return body.max_completion_tokens
    return body.max_tokens


def _top(body: ChatCompletionRequest) -> int | None:
    if not body.logprobs:
        if body.top_logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return None
    return body.top_logprobs or 0


def _prepare(
    ctx: ServeContext, body: ChatCompletionRequest, index: bool = False
) -> tuple[ToolPlan, str, ReasoningPlan | None]:
    """The tools plan, the prompt and the reasoning plan (`index`: also build the
    constraint's token index)."""
    text = body_constraint(body)
    if (
        text is not None
        and text.lark is not None
        and body.tools
        and body.tool_choice
        in (
            None,
            "auto",
        )
    ):
        raise APIError(
            400,
            f"a grammar ({constraint_field(body)}) cannot be combined with tools under "
            "tool_choice auto; give tool_choice 'none' or leave the tools out",
            param=constraint_field(body),
        )
    fmt = tool_format(ctx.template)
    parallel = body.parallel_tool_calls is not False
    tokenizer = _tokenizer(ctx)
    markers = (*fmt.fixed_texts, *(ctx.reasoning.marker_texts if ctx.reasoning else ()))
    specials = special_markers(tokenizer, markers)
    plan = plan_tools(body.tools, body.tool_choice, text, fmt, parallel=parallel, specials=specials)
    prompt = render_chat(
        ctx.template,
        body.messages,
        plan.prompt,
        max_json_depth=ctx.limits.max_json_depth,
        tools=body.tools,
        tokenizer=None if ctx.limits.allow_special_tokens else tokenizer,
        tool_format=fmt,
        variables=template_kwargs(body.chat_template_kwargs, body.reasoning_effort),
        image_token=ctx.backend.image_token,
    )
    thinking = reasoning_plan(
        ctx.reasoning, prompt, separate=body.separate_reasoning, budget=body.thinking_budget
    )
    if index:
        param = "tools" if body.tools else (constraint_field(body) or "messages")
        answer = plan.constraint
        if thinking is not None:
            answer = thinking.constrain(answer, param, headed=plan.headed, specials=specials)
        build_index(ctx, answer)
    return plan, prompt, thinking


def prepare_prompt(ctx: ServeContext, body: ChatCompletionRequest) -> str:
    """The prompt `body` renders to (its tools and template variables included)."""
    return _prepare(ctx, body)[1]


def _tokenizer(ctx: ServeContext) -> Any:
    """The backend's tokenizer (whose special tokens message contents must not produce), or
    None for a backend without one (an endpoint: the text goes on as it is)."""
    try:
        return ctx.backend.tokenizer
    except Exception:  # noqa: BLE001 - no local tokenizer
        return None


class _Reply(ReplyBase):
    """Builds the response bodies of one request."""

    def __init__(
        self,
        ctx: ServeContext,
        body: ChatCompletionRequest,
        plan: ToolPlan,
        thinking: ReasoningPlan | None = None,
    ) -> None:
        super().__init__(ctx, "chatcmpl")
        self.body, self.plan, self.thinking = body, plan, thinking
        self._readers: dict[int, CallReader] = {}  # streamed choices with tools on
        self._splits: dict[int, OutputSplit] = {}  # streamed choices of a reasoning model
        self._reasoning_tokens = 0

    def _parts(self, result: GenerateResult) -> tuple[str | None, str]:
        """(reasoning or None, answer) of a finished choice's text."""
        if self.thinking is None or not self.thinking.separate:
            return None, result.text
        reasoning, answer = self.thinking.split(result.text)
        self._reasoning_tokens += reasoning_tokens(_tokenizer(self.ctx), reasoning)
        return reasoning, answer

    def _message(self, result: GenerateResult) -> tuple[dict[str, Any], str]:
        """(message, finish_reason) of a finished choice."""
        reasoning, text = self._parts(result)
        if self.plan.calls is None:
            message = {"role": "assistant", "content": text, "refusal": None}
            reason = finish_reason(result)
        else:
            message, reason = _read_message(self.plan.parse(text), result)
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        return message, reason

    def _logprobs(self, result: GenerateResult) -> Any:
        return chat_logprobs(visible_logprobs(result)) if self.body.logprobs else None

    def _usage(self, results: list[GenerateResult]) -> dict[str, Any]:
        u = usage(results[0].prompt_tokens, results, results[0].cached_tokens)
        self.ctx.metrics.on_usage(
            u["prompt_tokens"],
            u["completion_tokens"],
            u["prompt_tokens_details"]["cached_tokens"],
            reasoning_tokens=self._reasoning_tokens,
        )
        if self.thinking is not None:
            u["completion_tokens_details"] = {"reasoning_tokens": self._reasoning_tokens}
        return u

    def response_body(self, results: list[GenerateResult]) -> dict[str, Any]:
        choices = []
        for i, r in enumerate(results):
            message, reason = self._message(r)
            choices.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": self._logprobs(r),
                    "finish_reason": reason,
                }
            )
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.ctx.model_name,
            "choices": choices,
            "usage": self._usage(results),
        }

    def _chunk(self, choices: list[dict[str, Any]]) -> bytes:
        return sse(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.ctx.model_name,
                "choices": choices,
            }
        )

    def _reader(self, index: int) -> CallReader:
        if index not in self._readers:
            self._readers[index] = self.plan.reader()
        return self._readers[index]

    def _deltas(self, index: int, deltas: list[dict[str, Any]]) -> bytes:
        return b"".join(
            self._chunk([{"index": index, "delta": d, "logprobs": None, "finish_reason": None}])
            for d in deltas
        )

    # -- the SSE stream (ReplyBase.stream) ---------------------------------------------------
    def _opening(self, size: int) -> list[bytes]:
        return [
            self._chunk(
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                    for i in range(size)
                ]
            )
        ]

    def _split(self, index: int) -> OutputSplit:
        if index not in self._splits:
            self._splits[index] = OutputSplit(self.thinking)
        return self._splits[index]

    def _piece(self, index: int, text: str) -> bytes | None:
        reasoning, text = self._split(index).feed(text)
        return self._answer_piece(index, reasoning, text) or None

    def _answer_piece(self, index: int, reasoning: str, text: str) -> bytes:
        out = self._deltas(index, [{"reasoning_content": reasoning}]) if reasoning else b""
        if not text:
            return out
        if self.plan.calls is None:
            return out + self._deltas(index, [{"content": text}])
        return out + self._deltas(index, self._reader(index).feed(text))

    def _closing(self, index: int, result: GenerateResult) -> bytes:
        rest, reason = (
            self._answer_piece(index, *self._split(index).finish()),
            finish_reason(result),
        )
        if self.thinking is not None and self.thinking.separate:
            self._reasoning_tokens += reasoning_tokens(
                _tokenizer(self.ctx), self.thinking.split(result.text)[0]
            )
        if self.plan.calls is not None:
            reader = self._reader(index)
            rest += self._deltas(index, reader.finish())
            reason = _read_message(reader, result)[1]
        last = {
            "index": index,
            "delta": {},
            "logprobs": self._logprobs(result),
            "finish_reason": reason,
        }
        return rest + self._chunk([last])

    def _usage_chunk(self, u: dict[str, Any]) -> bytes:
        return sse(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.ctx.model_name,
                "choices": [],
                "usage": u,
            }
        )


def _read_message(reader: CallReader, result: GenerateResult) -> tuple[dict[str, Any], str]:
    """(message, finish_reason) of a choice whose text `reader` read whole. Whole calls are
    `tool_calls`; a call cut short (max_tokens inside its name or arguments) is not a call but
    `content`, its text as written (CallReader.content); finish_reason is "tool_calls" when the
    calls ended, else the result's ("length" for max_tokens)."""
    message: dict[str, Any] = {"role": "assistant", "content": reader.content, "refusal": None}
    calls = reader.tool_calls
    if calls:
        message["tool_calls"] = calls
    if reader.content is not None:
        return message, finish_reason(result)
    if reader.cut or result.finish_reason == "length":
        return message, finish_reason(result)
    return message, "tool_calls"
