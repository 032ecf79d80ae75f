"""Few-shot question answering: a constant header of examples, then the question.

The header is identical for every question, so the backend computes it once and reuses
its KV (run_batch sends the constant prefix first, found by tracing the program).
"""

import lmprog as lp

SHOTS = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Italy?", "Rome"),
    ("What is the capital of Canada?", "Ottawa"),
    ("What is the capital of Egypt?", "Cairo"),
]


@lp.function
def few_shot_qa(s, question):
    s += "Answer each question with the name of a city.\n\n"
    for q, a in SHOTS:
        s += f"Q: {q}\nA: {a}\n\n"
    s += f"Q: {question}\nA:" + lp.gen("answer", max_tokens=8, stop="\n")


if __name__ == "__main__":
    questions = [
        "What is the capital of Germany?",
        "What is the capital of Spain?",
        "What is the capital of Russia?",
    ]
    states = few_shot_qa.run_batch([{"question": q} for q in questions], temperature=0)
    for q, st in zip(questions, states):
        meta = st.get_meta_info("answer")
        print(
            f"{q} -> {st['answer'].strip()!r}  (cached prompt tokens: {meta['cached_tokens']}/{meta['prompt_tokens']})"
        )
