"""An agent of the OpenAI Agents SDK (`openai-agents`) with two function tools, run to its
end on the default model through lmprog's /v1/responses over loopback (OpenAIResponsesModel
pointed at the server), streamed and not.

A 135M model's answers are weak, so the protocol is checked, not the wisdom: the SDK's
requests are accepted, the model's calls reach the tools with arguments their schemas accept,
the results go back as function_call_output items, and the run ends with a final output.
Each tool may be used once per run (`is_enabled`), so the run cannot loop: with no tool left,
the model answers in text.
"""

from __future__ import annotations

import asyncio

import agents  # openai-agents, in the test extra
import jsonschema
import openai
import pytest

from lmprog.serve import Server

pytestmark = pytest.mark.e2e


def _agent(server: Server, calls: list[tuple[str, dict]]) -> agents.Agent:
    used: set[str] = set()

    def unused(name: str):
        return lambda ctx, agent: name not in used

    @agents.function_tool(is_enabled=unused("get_weather"))
    def get_weather(city: str) -> str:
        """The current temperature of a city, in degrees Celsius."""
        used.add("get_weather")
        calls.append(("get_weather", {"city": city}))
        return f"It is 21 degrees Celsius in {city}."

    @agents.function_tool(is_enabled=unused("convert_temperature"))
    def convert_temperature(celsius: float) -> str:
        """Converts a temperature in degrees Celsius to degrees Fahrenheit."""
        used.add("convert_temperature")
        calls.append(("convert_temperature", {"celsius": celsius}))
        return f"{celsius * 9 / 5 + 32:.1f} degrees Fahrenheit"

    client = openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120
    )
    return agents.Agent(
        name="weather",
        instructions="Answer with the tools: find the weather, then convert it to Fahrenheit.",
        tools=[get_weather, convert_temperature],
        model=agents.OpenAIResponsesModel(server.model_name, client),
        model_settings=agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=200),
    )


def _schemas(agent: agents.Agent) -> dict[str, dict]:
    return {t.name: t.params_json_schema for t in agent.tools}


def _check_run(agent: agents.Agent, result, calls: list[tuple[str, dict]]) -> None:
    assert calls, "the model called no tool"
    schemas = _schemas(agent)
    for name, arguments in calls:
        jsonschema.validate(arguments, schemas[name])
    kinds = [item.type for item in result.new_items]
    assert "tool_call_item" in kinds and "tool_call_output_item" in kinds, kinds
    assert kinds[-1] == "message_output_item", kinds  # the run ended with the model's answer
    assert isinstance(result.final_output, str) and result.final_output.strip()
    # every model turn went through /v1/responses and reported its tokens
    assert len(result.raw_responses) >= 2
    for response in result.raw_responses:
        assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0


def test_agent_with_two_tools_runs_to_the_end(server):
    agents.set_tracing_disabled(True)
    calls: list[tuple[str, dict]] = []
    agent = _agent(server, calls)
    question = "What is the weather in Paris, in Fahrenheit?"
    result = asyncio.run(agents.Runner.run(agent, question, max_turns=4))
    _check_run(agent, result, calls)


def test_agent_streamed_runs_to_the_end(server):
    agents.set_tracing_disabled(True)
    calls: list[tuple[str, dict]] = []
    agent = _agent(server, calls)

    async def run():
        result = agents.Runner.run_streamed(agent, "Weather in Rome, in Fahrenheit?", max_turns=4)
        events = [e async for e in result.stream_events()]
        return result, events

    result, events = asyncio.run(run())
    _check_run(agent, result, calls)
    raw = [e.data.type for e in events if e.type == "raw_response_event"]
    assert raw.count("response.created") == len(result.raw_responses)
    assert raw.count("response.completed") == len(result.raw_responses)
    assert "response.function_call_arguments.delta" in raw
    assert "response.output_text.delta" in raw


def test_agent_on_a_reasoning_model_stand_in(rt):
    """The bundled model under a template that opens a think block, with reasoning effort
    and a thinking budget (extra_body): the model's turn starts with a reasoning item the
    SDK keeps, its call (made after the thinking, under the tool constraint) reaches the
    tool with arguments its schema accepts. The run ends with the tool's result
    (stop_on_first_tool): after thinking, the 135M model's free-text answers ramble to
    max_tokens, which the SDK reports as an error."""
    from pathlib import Path

    from test_tools_e2e import Templated

    template = Path(__file__).parent.parent / "data" / "chat_templates" / "chatml-think.jinja"
    backend = Templated(rt, template.read_text(), {"eos_token": "<|im_end|>"})
    agents.set_tracing_disabled(True)
    calls: list[tuple[str, dict]] = []
    with Server(backend, model_name="think").start() as srv:
        agent = _agent(srv, calls)
        agent.model_settings = agents.ModelSettings(
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=0,
            max_tokens=200,
            reasoning=openai.types.shared.Reasoning(effort="low"),
            extra_body={"thinking_budget": 16},
        )
        agent.tool_use_behavior = "stop_on_first_tool"
        result = asyncio.run(agents.Runner.run(agent, "Weather in Paris?", max_turns=2))
    assert calls and calls[0][0] == "get_weather"
    jsonschema.validate(calls[0][1], _schemas(agent)["get_weather"])
    kinds = [item.type for item in result.new_items]
    assert kinds[0] == "reasoning_item" and "tool_call_item" in kinds, kinds
    assert result.raw_responses[0].output[0].type == "reasoning"
    assert result.raw_responses[0].usage.output_tokens_details.reasoning_tokens > 0
    assert "21 degrees" in str(result.final_output)
