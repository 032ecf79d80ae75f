"""Tree-of-thought style search with fork/join: propose ideas in parallel, then judge them."""

import lmprog as lp


@lp.function
def tree_of_thought(s, problem, width=3):
    s += lp.user(f"Problem: {problem}\nPropose one idea to solve it, in one sentence.")
    ideas = s.fork(width)
    ideas += lambda i: lp.assistant(
        lp.gen("idea", max_tokens=32, stop="\n", temperature=0.9, seed=100 + i)
    )
    ideas.join()  # s["idea"] is now the list of the children's ideas
    for i, idea in enumerate(s["idea"]):
        s += lp.user(f"Idea {i + 1}: {idea}\nIs this idea practical?")
        s += lp.assistant(lp.select(f"verdict_{i}", ["yes", "no"]))


if __name__ == "__main__":
    state = tree_of_thought.run(problem="My plants keep dying while I am on holiday.")
    for i, idea in enumerate(state["idea"]):
        print(f"{i + 1}. {idea.strip()}  -> practical: {state[f'verdict_{i}']}")
