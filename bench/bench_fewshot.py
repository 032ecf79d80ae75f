"""Few-shot batch benchmark (issue 2): prefix reuse on llama.cpp vs plain llama-cpp-python.

32 questions behind one shared 5-shot header (~600 tokens), 16 new tokens each, greedy,
the default model, one thread. Both sides run in the same process, one after the other:

  plain    llama_cpp.Llama(...)(header + question, max_tokens=16, temperature=0), with
           llm.reset() before every call, so nothing is reused between prompts;
  lmprog   the LlamaCpp backend: the header is evaluated once (cache_prefix, as run_batch
           does before fanning out) and every question reuses it.

    python bench/bench_fewshot.py                 # through the backend API
    python bench/bench_fewshot.py --via dsl       # through lp.function + run_batch
    python bench/bench_fewshot.py --questions 8   # a quicker run
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

SHOTS = [
    (
        "The Amazon River flows through Peru, Colombia and Brazil before it reaches the Atlantic "
        "Ocean. It carries more water than any other river on Earth, about a fifth of all the fresh "
        "water that rivers deliver to the oceans. Its basin covers roughly seven million square "
        "kilometres, much of it tropical rainforest, and it is home to thousands of species of fish, "
        "including the piranha and the arapaima, one of the largest freshwater fish in the world.",
        "Which ocean does the Amazon River flow into?",
        "The Atlantic Ocean.",
    ),
    (
        "Marie Curie was born in Warsaw in 1867 and moved to Paris to study physics and mathematics "
        "at the Sorbonne. Together with her husband Pierre she discovered two new elements, polonium "
        "and radium, and she coined the word radioactivity. She received the Nobel Prize in Physics "
        "in 1903 and the Nobel Prize in Chemistry in 1911, and she remains the only person to have "
        "won Nobel Prizes in two different sciences.",
        "Which two elements did Marie Curie discover?",
        "Polonium and radium.",
    ),
    (
        "The Great Wall of China is a series of fortifications built over many centuries to protect "
        "Chinese states from raids by nomadic groups from the north. The best known sections were "
        "built during the Ming dynasty, between the fourteenth and seventeenth centuries, using brick "
        "and stone. Including all of its branches, the wall stretches for more than twenty thousand "
        "kilometres across deserts, grasslands and mountains in northern China.",
        "During which dynasty were the best known sections of the Great Wall built?",
        "The Ming dynasty.",
    ),
    (
        "Photosynthesis is the process by which green plants, algae and some bacteria turn light "
        "energy into chemical energy. Inside the chloroplasts, the pigment chlorophyll absorbs "
        "sunlight, which is used to split water molecules and release oxygen. The energy captured "
        "is then used to combine carbon dioxide from the air into sugars such as glucose, which the "
        "plant uses for growth and stores as starch.",
        "Which gas is released when water molecules are split during photosynthesis?",
        "Oxygen.",
    ),
    (
        "The Eiffel Tower was designed by the engineering company of Gustave Eiffel and built for the "
        "1889 World's Fair in Paris, which marked the centenary of the French Revolution. At 330 "
        "metres it was the tallest man-made structure in the world until 1930. Many artists first "
        "criticised its design, but it became a global symbol of France and now receives millions "
        "of visitors every year.",
        "For which event was the Eiffel Tower built?",
        "The 1889 World's Fair in Paris.",
    ),
]

QUESTIONS = [
    "What is the capital city of Japan?",
    "How many legs does a spider have?",
    "Which planet is known as the Red Planet?",
    "Who wrote the play Romeo and Juliet?",
    "What is the boiling point of water at sea level in degrees Celsius?",
    "What is the largest ocean on Earth?",
    "Which gas do humans need to breathe to survive?",
    "What is the chemical symbol for gold?",
    "How many continents are there on Earth?",
    "Which animal is known as the king of the jungle?",
    "What is the tallest mountain in the world?",
    "In which country are the pyramids of Giza?",
    "What is the freezing point of water in degrees Celsius?",
    "Who painted the Mona Lisa?",
    "What is the largest planet in the solar system?",
    "Which language is spoken in Brazil?",
    "How many days are there in a leap year?",
    "What do bees make?",
    "What is the main ingredient of guacamole?",
    "Which instrument has black and white keys?",
    "What is the square root of sixty-four?",
    "Which bird is a symbol of peace?",
    "What is the capital city of Italy?",
    "Which organ pumps blood through the body?",
    "What is the hardest natural substance?",
    "How many hours are there in a day?",
    "Which country is famous for the maple leaf flag?",
    "What is the longest river in Africa?",
    "Who was the first person to walk on the Moon?",
    "What is the currency of the United Kingdom?",
    "Which season comes after winter?",
    "What color do you get by mixing blue and yellow?",
]

MAX_TOKENS = 16


def header() -> str:
    shots = "".join(f"Context: {c}\nQuestion: {q}\nAnswer: {a}\n\n" for c, q, a in SHOTS)
    intro = (
        "Read each context and answer the question that follows it in a few words. "
        "Answers are short, factual and end with a full stop; when the context does not "
        "contain the answer, use general knowledge instead.\n\n"
    )
    return intro + shots


def prompt(question: str) -> str:
    return f"{header()}Question: {question}\nAnswer:"


def run_plain(model_path: str, questions: list[str], n_ctx: int) -> list[str]:
    import llama_cpp

    llm = llama_cpp.Llama(model_path, n_ctx=n_ctx, n_threads=1, flash_attn=True, verbose=False)
    out = []
    for q in questions:
        llm.reset()  # forget the previous prompt: every call evaluates its whole prompt
        out.append(llm(prompt(q), max_tokens=MAX_TOKENS, temperature=0.0)["choices"][0]["text"])
    llm.close()
    return out


def run_backend(backend, questions: list[str]) -> list[str]:
    from lmprog.core.protocol import GenerateRequest
    from lmprog.core.sampling import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    backend.cache_prefix(header())
    return [backend.generate(GenerateRequest(prompt(q), params)).text for q in questions]


def run_dsl(backend, questions: list[str]) -> list[str]:
    import lmprog as lp

    @lp.function
    def fewshot(s, question):
        s += header()  # constant: run_batch finds it by tracing and caches it once
        s += f"Question: {question}\nAnswer:"
        s += lp.gen("answer", max_tokens=MAX_TOKENS)

    states = fewshot.run_batch(
        [{"question": q} for q in questions], backend=backend, temperature=0.0
    )
    return [st["answer"] for st in states]


def timed(fn: Callable[[], list[str]]) -> tuple[list[str], float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--via", choices=("backend", "dsl"), default="backend")
    ap.add_argument("--questions", type=int, default=len(QUESTIONS))
    ap.add_argument("--n-ctx", type=int, default=2048)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from lmprog.backends import LlamaCpp
    from lmprog.core.models import resolve_model

    questions = (QUESTIONS * (1 + args.questions // len(QUESTIONS)))[: args.questions]
    backend = LlamaCpp(n_ctx=args.n_ctx, n_threads=1)
    header_tokens = len(backend.tokenizer.encode(header(), add_special_tokens=False))
    print(
        f"header: {header_tokens} tokens, {len(SHOTS)} shots; {len(questions)} questions x {MAX_TOKENS} new tokens;"
        f" n_threads=1; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )

    lmprog_run = run_dsl if args.via == "dsl" else run_backend
    ours, t_ours = timed(lambda: lmprog_run(backend, questions))
    stats = backend.stats()
    backend.shutdown()
    theirs, t_plain = timed(lambda: run_plain(str(resolve_model().path), questions, args.n_ctx))

    n = len(questions)
    print(f"plain llama-cpp-python : {t_plain:7.2f} s  {n / t_plain:6.3f} questions/s")
    print(f"lmprog LlamaCpp ({args.via:7s}): {t_ours:7.2f} s  {n / t_ours:6.3f} questions/s")
    print(f"speed-up: {t_plain / t_ours:.2f}x   (target >= 3x)")
    same = sum(a == b for a, b in zip(ours, theirs))
    print(
        f"identical answers: {same}/{n}; cached prompt tokens {stats['cached_tokens']} of {stats['prompt_tokens']};"
        f" evaluated {stats['evaluated_tokens']}; load average {os.getloadavg()[0]:.1f}"
    )
    for q, a in list(zip(questions, ours))[:3]:
        print(f"  {q} ->{a.splitlines()[0] if a.strip() else a!r}")
    sys.exit(0)


if __name__ == "__main__":
    main()
