"""Tree-of-thought style search with fork/join: propose ideas in parallel, then judge them."""

import lmprog as lp


@lp.function
def tree_of_thought(s, problem, width=3):
    s += lp.system("You are a helpful assistant. Answer in one sentence.")
    s += lp.user(f"{problem} Give one tip.")
    ideas = s.fork(width)  # the copies share the prompt so far (computed once)
    ideas += lambda i: lp.assistant(
        lp.gen("idea", max_tokens=40, stop="\n", temperature=0.7, seed=100 + i)
    )
    ideas.join()  # s["idea"] is now the list of the children's ideas
    for i, idea in enumerate(s["idea"]):
        s += lp.user(f"Tip {i + 1}: {idea}\nIs this a good tip? Answer yes or no.")
        s += lp.assistant(lp.select(f"verdict_{i}", ["yes", "no"]))


if __name__ == "__main__":
    state = tree_of_thought.run(problem="How can I save money on groceries?")
    for i, idea in enumerate(state["idea"]):
        print(f"{i + 1}. {idea.strip()}  -> good tip: {state[f'verdict_{i}']}")
