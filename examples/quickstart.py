"""The main demo: a tour of lmprog on the bundled SmolLM2-135M-Instruct model.

Run:  bash scripts/setup.sh && .venv/bin/python examples/quickstart.py
With no backend named, lmprog picks its in-process runtime on a GPU and the llama.cpp
backend on a CPU-only machine; pass --backend runtime|llamacpp to choose.
"""

import argparse
import time

import lmprog as lp


@lp.function
def capital_qa(s, country):
    s += lp.system("You are a geography expert. Answer with one word.")
    s += lp.user(f"What is the capital of {country}?")
    s += lp.assistant(lp.gen("answer", max_tokens=8, stop=["\n", "."]))


@lp.function
def classify(s, review):
    s += lp.user(f"Is this review positive or negative?\nReview: {review}")
    s += lp.assistant("The review is " + lp.select("label", ["positive", "negative", "neutral"]))


@lp.function
def facts(s, topic):
    s += lp.user(f"Give me one short fact about {topic}.")
    forks = s.fork(2)
    forks += lambda i: lp.assistant(
        lp.gen("fact", max_tokens=32, stop="\n", temperature=0.5, seed=i)
    )
    forks.join()


@lp.function
def person(s, text):
    s += lp.user(f"Extract the person's name and age as JSON.\nText: {text}")
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    s += lp.assistant(lp.gen("json", max_tokens=48, json_schema=schema))


@lp.function
def legs(s, animal):
    s += lp.user(f"How many legs does a {animal} have?")
    s += lp.assistant("The answer is " + lp.gen("n", dtype=int, max_tokens=4))  # its text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=["auto", "runtime", "llamacpp"], default="auto")
    args = parser.parse_args()
    if args.backend == "runtime":
        lp.set_default_backend(lp.Runtime())
    elif args.backend == "llamacpp":
        lp.set_default_backend(lp.LlamaCpp())

    t0 = time.perf_counter()
    state = capital_qa.run(country="France", temperature=0)
    print("Q&A:", repr(state["answer"]), state.get_meta_info("answer"))

    state = classify.run(review="I loved every minute of this film.", temperature=0)
    print("select:", state["label"])

    state = facts.run(topic="the Moon")
    for i, fact in enumerate(state["fact"]):
        print(f"fork {i}:", fact)

    state = person.run(text="Ada Lovelace was 36 years old.", temperature=0)
    print("json:", state["json"], "->", state.parsed("json"))

    state = legs.run(animal="spider", temperature=0)
    print("int:", repr(state["n"]), state.parsed("n"))  # the text, and the int

    print("streaming: ", end="", flush=True)
    state = capital_qa.run(country="Japan", temperature=0, stream=True)
    for piece in state.text_iter("answer"):
        print(piece, end="", flush=True)
    print()

    states = capital_qa.run_batch(
        [{"country": c} for c in ["Italy", "Spain", "Germany", "Egypt"]],
        temperature=0,
        progress_bar=True,
    )
    print("batch:", [st["answer"] for st in states])
    print(f"done in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
