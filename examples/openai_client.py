"""The official `openai` Python client against lmprog's OpenAI-compatible server.

Run:  bash scripts/setup.sh && .venv/bin/python examples/openai_client.py
Starts the server in this process on a free loopback port over the bundled
SmolLM2-135M-Instruct model (the same server `lmprog serve` runs); pass --base-url (and
--api-key) to talk to a server started elsewhere, e.g. `lmprog serve --port 8000`.
"""

import argparse
import contextlib
import json

import openai

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def demo(client: openai.OpenAI, model: str) -> None:
    r = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    print("completion:", repr(r.choices[0].text), r.usage.completion_tokens, "tokens")

    messages = [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name three primary colors."},
    ]
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0)
    print("chat:", r.choices[0].message.content)

    print("stream: ", end="")
    for chunk in client.chat.completions.create(
        model=model, messages=messages, max_tokens=24, temperature=0, stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
    print()

    r = client.chat.completions.create(
        model=model,
        max_tokens=40,
        temperature=0,
        messages=[{"role": "user", "content": "Invent a person. Answer in JSON."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON},
        },
    )
    print("json schema:", json.loads(r.choices[0].message.content))

    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say yes or no."}],
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    for t in r.choices[0].logprobs.content:
        print(
            f"logprob: {t.token!r} {t.logprob:.3f}  alternatives:",
            [(a.token, round(a.logprob, 3)) for a in t.top_logprobs],
        )

    r = client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=8, n=3, temperature=0.9, seed=7
    )
    print("n=3, seed=7:", [c.text for c in r.choices])

    r = client.completions.create(
        model=model,
        prompt="A year: ",
        max_tokens=6,
        temperature=0,
        extra_body={"regex": r"(19|20)\d\d"},
    )  # lmprog/SGLang extension
    print("regex:", r.choices[0].text)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--base-url", help="an OpenAI-compatible /v1 URL (default: start a local server)"
    )
    ap.add_argument("--api-key", default="unused")
    ap.add_argument("--model", help="model name (default: the server's first model)")
    args = ap.parse_args()
    with contextlib.ExitStack() as stack:
        base_url = args.base_url
        if base_url is None:
            import lmprog as lp
            from lmprog.serve import Server

            rt = stack.enter_context(lp.Runtime())
            base_url = stack.enter_context(Server(rt).start()).url + "/v1"
        client = openai.OpenAI(base_url=base_url, api_key=args.api_key)
        demo(client, args.model or client.models.list().data[0].id)


if __name__ == "__main__":
    main()
