"""An agent loop with tool calls against lmprog's OpenAI-compatible server.

Run:  bash scripts/setup.sh && .venv/bin/python examples/agent_tools.py
      .venv/bin/python examples/agent_tools.py --langchain    # the same loop in LangChain
                                    # (.venv/bin/pip install -e ".[agents]" adds langchain-openai)
The model asks for tools, the program runs them and sends the results back, until the model
answers. The server constrains each call's arguments to the tool's JSON schema, so even the
135M default model always produces calls that parse and validate. The loop makes the first
step a tool call (tool_choice="required"), lets the model choose afterwards ("auto") and asks
for the answer on the last step (tool_choice="none" and a nudge), one call at a time
(parallel_tool_calls=False: the small model otherwise adds calls it was not asked for), a
common pattern for small models. The 135M model picks the right tool and arguments; its final
sentence often does not use the result well (a larger model's does).
Starts a server in this process unless --base-url is given.
"""

import argparse
import contextlib
import json

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "additionalProperties": False,
                "required": ["city"],
                "properties": {"city": {"type": "string", "maxLength": 30}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "additionalProperties": False,
                "required": ["a", "b"],
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            },
        },
    },
]
FINAL = "Using the tool results above, answer my question in one sentence."
WEATHER = {"paris": "18 C, light rain", "tokyo": "24 C, sunny", "oslo": "3 C, snow"}


def run_tool(name: str, arguments: dict) -> str:
    if name == "get_weather":
        return WEATHER.get(arguments["city"].strip().lower(), "unknown city")
    if name == "add":
        return str(arguments["a"] + arguments["b"])
    return f"no tool named {name}"


def tool_choice(step: int, max_steps: int) -> str:
    return "required" if step == 0 else "none" if step == max_steps - 1 else "auto"


def openai_agent(base_url: str, api_key: str, model: str, question: str, max_steps: int) -> str:
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=api_key)
    messages = [
        {"role": "system", "content": "You are a helpful assistant. Use the tools."},
        {"role": "user", "content": question},
    ]
    for step in range(max_steps):
        if step == max_steps - 1:
            messages.append({"role": "user", "content": FINAL})
        r = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=TOOLS,
            temperature=0,
            tool_choice=tool_choice(step, max_steps),
            parallel_tool_calls=False,
            max_tokens=60,
        )
        message = r.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = run_tool(call.function.name, json.loads(call.function.arguments))
            print(f"  step {step}: {call.function.name}({call.function.arguments}) -> {result}")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return "(no answer)"


def langchain_agent(base_url: str, api_key: str, model: str, question: str, max_steps: int) -> str:
    try:
        from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
        from langchain_openai import ChatOpenAI
    except ImportError:
        raise SystemExit(
            "--langchain needs langchain-openai: pip install langchain-openai"
        ) from None

    llm = ChatOpenAI(model=model, base_url=base_url, api_key=api_key, temperature=0, max_tokens=60)
    messages = [
        SystemMessage("You are a helpful assistant. Use the tools."),
        HumanMessage(question),
    ]
    for step in range(max_steps):
        if step == max_steps - 1:
            messages.append(HumanMessage(FINAL))
        bound = llm.bind_tools(
            TOOLS, tool_choice=tool_choice(step, max_steps), parallel_tool_calls=False
        )
        reply = bound.invoke(messages)
        if not reply.tool_calls:
            return reply.content
        messages.append(reply)
        for call in reply.tool_calls:
            result = run_tool(call["name"], call["args"])
            print(f"  step {step}: {call['name']}({json.dumps(call['args'])}) -> {result}")
            messages.append(ToolMessage(result, tool_call_id=call["id"]))
    return "(no answer)"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--base-url", help="an OpenAI-compatible /v1 URL (default: start a local server)"
    )
    ap.add_argument("--api-key", default="unused")
    ap.add_argument("--model", help="model name (default: the server's first model)")
    ap.add_argument(
        "--langchain", action="store_true", help="run the loop with LangChain's ChatOpenAI"
    )
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    agent = langchain_agent if args.langchain else openai_agent
    with contextlib.ExitStack() as stack:
        base_url = args.base_url
        if base_url is None:
            import lmprog as lp
            from lmprog.serve import Server

            rt = stack.enter_context(lp.Runtime())
            base_url = stack.enter_context(Server(rt).start()).url + "/v1"
        model = args.model
        if model is None:
            import openai

            model = openai.OpenAI(base_url=base_url, api_key=args.api_key).models.list().data[0].id
        for question in ("What is the weather in Paris?", "What is 17 plus 25?"):
            print(question)
            print("  answer:", agent(base_url, args.api_key, model, question, args.steps))


if __name__ == "__main__":
    main()
