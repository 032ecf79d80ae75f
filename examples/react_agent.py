"""A ReAct-style tool loop: the model thinks, picks an action with select, the program runs the
tool and feeds the observation back, until the model picks finish. Each step is printed as it
happens.

The system prompt carries one worked example (a small model follows a demonstration far better
than a description), and the first step must use a tool (finish is offered from the second).
"""

import lmprog as lp

FACTS = {
    "paris": "Paris has about 2.1 million inhabitants.",
    "tokyo": "Tokyo has about 14 million inhabitants.",
}
EXAMPLE = (
    "Example:\n"
    "Question: How many people live in Rome?\n"
    "Thought 1: I should search for Rome.\n"
    "Action 1: search[Rome]\n"
    "Observation 1: Rome has about 2.8 million inhabitants.\n"
    "Thought 2: I know the answer now.\n"
    "Action 2: finish[About 2.8 million people live in Rome.]\n"
)


def search(query: str) -> str:
    for key, fact in FACTS.items():
        if key in query.lower():
            return fact
    return "No result."


def calculator(expression: str) -> str:
    allowed = set("0123456789+-*/(). ")
    if not expression or set(expression) - allowed:
        return "invalid expression"
    return str(eval(expression, {"__builtins__": {}}))  # digits and operators only, checked above


TOOLS = {"search": search, "calculator": calculator}


@lp.function
def react(s, question, max_steps=3):
    s += lp.system(
        "Answer the question with tools: search[query], calculator[expression] and "
        "finish[answer].\n\n" + EXAMPLE
    )
    s += lp.user("Question: " + question)
    for step in range(1, max_steps + 1):
        actions = [*TOOLS, "finish"] if step > 1 else [*TOOLS]
        with s.assistant():
            s += f"Thought {step}:" + lp.gen(f"thought_{step}", max_tokens=32, stop="\n") + "\n"
            s += f"Action {step}: " + lp.select(f"action_{step}", actions) + "["
            s += lp.gen(f"arg_{step}", max_tokens=24, stop="]") + "]"
        action, arg = s[f"action_{step}"], s[f"arg_{step}"]  # reading waits for the model
        print(f"  Thought {step}: {s[f'thought_{step}'].strip()}")
        print(f"  Action {step}: {action}[{arg}]")
        if action == "finish":
            s["answer"] = arg
            return
        observation = TOOLS[action](arg)
        print(f"  Observation {step}: {observation}")
        s += lp.user(f"Observation {step}: {observation}")


if __name__ == "__main__":
    for question in ("How many people live in Paris?", "How many people live in Tokyo?"):
        print(question)
        state = react.run(question=question, temperature=0)
        state.sync()  # the program has run to its end (or raised)
        print("  answer:", state["answer"] if "answer" in state else "(no answer)")
