"""Select-based classification: the backend scores every label from prompt logprobs."""

import lmprog as lp

LABELS = ["sports", "politics", "technology", "food"]


@lp.function
def classify(s, headline, method=lp.token_length_normalized):
    s += lp.user(f"Which topic is this headline about: {', '.join(LABELS)}?\nHeadline: {headline}")
    s += lp.assistant("Topic: " + lp.select("topic", LABELS, choices_method=method))


if __name__ == "__main__":
    headlines = [
        "Local team wins the championship after a dramatic final",
        "New smartphone chip doubles battery life",
        "Chef shares a recipe for the perfect tomato soup",
    ]
    for method in (
        lp.token_length_normalized,
        lp.greedy_token_selection,
        lp.unconditional_likelihood_normalized,
    ):
        states = classify.run_batch([{"headline": h, "method": method} for h in headlines])
        print(type(method).__name__, [st["topic"] for st in states])
