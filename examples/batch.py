"""Batch processing with a progress bar: results come back in input order."""

import lmprog as lp


@lp.function
def summarize(s, text):
    s += lp.system("Summarize the text in five words or fewer.")
    s += lp.user(text)
    s += lp.assistant(lp.gen("summary", max_tokens=16, stop="\n"))


if __name__ == "__main__":
    texts = [
        f"Item {i}: the weather on day {i} was {'sunny' if i % 2 else 'rainy'} and warm."
        for i in range(16)
    ]
    states = summarize.run_batch(
        [{"text": t} for t in texts], temperature=0, progress_bar=True, num_threads="auto"
    )
    for t, st in zip(texts, states):
        print(f"{t[:40]!r} -> {st['summary'].strip()!r}")
