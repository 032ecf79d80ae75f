"""lmprog programs on an OpenAI-compatible endpoint (`lp.OpenAI`), here a local lmprog server.

Run:  bash scripts/setup.sh && .venv/bin/python examples/openai_endpoint.py
Starts `lmprog serve`'s server in this process on a free loopback port over the bundled
SmolLM2-135M-Instruct model, then drives it over HTTP exactly as it would drive OpenAI,
vLLM or SGLang (pass --base-url/--model/--api-key to use another server instead).
"""

import argparse
import contextlib

import lmprog as lp

FEW_SHOT = (
    "Name: Ada Lovelace\nBorn: 1815\nJob: mathematician\n\n"
    "Name: Alan Turing\nBorn: 1912\nJob: computer scientist\n\n"
    "Name: Marie Curie\nBorn: 1867\nJob: physicist\n\n"
)


@lp.function
def qa(s, question):
    s += lp.system("You are a terse assistant.")
    s += lp.user(question)
    s += lp.assistant(lp.gen("answer", max_tokens=24, stop="\n"))


@lp.function
def extract(s, text):
    s += lp.user(f"Extract the person's name and age as JSON.\nText: {text}")
    s += lp.assistant(
        lp.gen(
            "json",
            max_tokens=40,
            json_schema={
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 20},
                    "age": {"type": "integer"},
                },
                "required": ["name", "age"],
                "additionalProperties": False,
            },
        )
    )


@lp.function
def classify(s, review):
    s += f"Review: {review}\nSentiment (positive or negative):" + lp.select(
        "label", [" positive", " negative"]
    )


def card(s):
    s += FEW_SHOT + "Name:" + lp.gen("name", stop="\n", max_tokens=12)
    s += "\nBorn:" + lp.gen("born", stop="\n", max_tokens=8)
    s += "\nJob:" + lp.gen("job", stop="\n", max_tokens=12)


def speculation(base_url, model, api_key):
    """The same program with and without API speculative execution: calls and prompt tokens."""
    for n in (None, 32):
        with lp.OpenAI(model, base_url, api_key, chat=False, chat_template="chatml") as backend:
            state = lp.function(num_api_spec_tokens=n)(card).run(backend=backend, temperature=0)
            stats = backend.stats()
            print(
                f"num_api_spec_tokens={n}: {[state['name'], state['born'], state['job']]} "
                f"-> {stats['api_calls']} API call(s), {stats['prompt_tokens']} prompt tokens"
            )


def main(base_url, model, api_key):
    chat = lp.OpenAI(model, base_url, api_key)  # roles -> /v1/chat/completions
    print(qa.run(question="What is the capital of France?", backend=chat, temperature=0)["answer"])
    print(
        extract.run(text="Grace Hopper was 85 when she retired.", backend=chat, temperature=0)[
            "json"
        ]
    )
    text = lp.OpenAI(
        model, base_url, api_key, chat=False, chat_template="chatml"
    )  # /v1/completions
    print(classify.run(review="A wonderful, moving film.", backend=text)["label"])
    print("chat backend:", chat.stats())
    speculation(base_url, model, api_key)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base-url", help="an OpenAI-compatible server (default: start a local one)"
    )
    parser.add_argument("--model", help="the served model (default: the first of /v1/models)")
    parser.add_argument("--api-key")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        base_url = args.base_url
        if base_url is None:
            from lmprog.serve.server import Server

            runtime = stack.enter_context(lp.Runtime())
            base_url = stack.enter_context(Server(runtime, port=0)).url
            print(f"serving the default model at {base_url}")
        main(base_url, args.model, args.api_key)
