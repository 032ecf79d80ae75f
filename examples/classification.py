"""Select-based classification: the backend scores every label from prompt logprobs.

The three choice methods read the same logprobs differently. On the bundled 135M model the
label it favours whatever the headline ("sports") often wins the first two; the unconditional
normalization (each label's score relative to its score without the headline) mostly corrects
that. The scores are close, so a run may differ in one label.
"""

import lmprog as lp

LABELS = ["sports", "politics", "technology", "food"]
HEADLINES = {
    "Local team wins the championship after a dramatic final": "sports",
    "New smartphone chip doubles battery life": "technology",
    "Chef shares a recipe for the perfect tomato soup": "food",
    "Parliament passes the new budget after a long debate": "politics",
}


@lp.function
def classify(s, headline, method=lp.token_length_normalized):
    s += lp.user(f"Which topic is this headline about: {', '.join(LABELS)}?\nHeadline: {headline}")
    s += lp.assistant("Topic: " + lp.select("topic", LABELS, choices_method=method))


if __name__ == "__main__":
    print("expected:", list(HEADLINES.values()))
    for method in (
        lp.token_length_normalized,
        lp.greedy_token_selection,
        lp.unconditional_likelihood_normalized,
    ):
        states = classify.run_batch([{"headline": h, "method": method} for h in HEADLINES])
        topics = [st["topic"] for st in states]
        right = sum(t == want for t, want in zip(topics, HEADLINES.values()))
        print(f"{type(method).__name__}: {topics} ({right}/{len(topics)} right)")
