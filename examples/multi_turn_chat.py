"""Multi-turn chat: each turn appends to the same state, so history is reused from the cache."""

import lmprog as lp


@lp.function
def chat(s, turns):
    s += lp.system("You are a friendly assistant. Keep answers to one sentence.")
    for i, turn in enumerate(turns):
        s += lp.user(turn)
        s += lp.assistant(lp.gen(f"reply_{i}", max_tokens=48, stop="\n"))


if __name__ == "__main__":
    turns = ["Hi! What is a good name for a cat?", "Why that name?", "Suggest one more."]
    state = chat.run(turns=turns, temperature=0)
    for message in state.messages():
        print(f"[{message['role']}] {message['content']}")
    for i in range(len(turns)):
        print(
            f"turn {i}: cached {state.get_meta_info(f'reply_{i}')['cached_tokens']} prompt tokens"
        )
