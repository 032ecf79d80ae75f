"""A ReAct-style tool loop: the model picks an action with select, the program runs the tool."""

import lmprog as lp

FACTS = {
    "paris": "Paris has about 2.1 million inhabitants.",
    "tokyo": "Tokyo has about 14 million inhabitants.",
}


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
        "Answer the question. Use tools: search[query] or calculator[expression], then finish[answer]."
    )
    s += lp.user(question)
    for step in range(max_steps):
        with s.assistant():
            s += f"Thought {step + 1}:" + lp.gen(f"thought_{step}", max_tokens=32, stop="\n") + "\n"
            s += "Action: " + lp.select(f"action_{step}", ["search", "calculator", "finish"]) + "["
            s += lp.gen(f"arg_{step}", max_tokens=16, stop="]") + "]"
        action, arg = s[f"action_{step}"], s[f"arg_{step}"]
        if action == "finish":
            return
        s += lp.user(f"Observation: {TOOLS[action](arg)}")


if __name__ == "__main__":
    state = react.run(question="How many people live in Paris?", temperature=0)
    print(state.text())
