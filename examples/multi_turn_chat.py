"""Multi-turn chat: each turn appends to the same state, so history is reused from the cache.

The later questions ("And of Italy?") make sense only with the earlier turns in the prompt."""

import lmprog as lp


@lp.function
def chat(s, turns):
    s += lp.system("You are a helpful assistant. Answer in one sentence.")
    for i, turn in enumerate(turns):
        s += lp.user(turn)
        s += lp.assistant(lp.gen(f"reply_{i}", max_tokens=48, stop="\n"))


if __name__ == "__main__":
    turns = ["What is the capital of France?", "And of Italy?", "And of Spain?"]
    state = chat.run(turns=turns, temperature=0)
    for message in state.messages():
        print(f"[{message['role']}] {message['content']}")
    for i in range(len(turns)):
        print(
            f"turn {i}: cached {state.get_meta_info(f'reply_{i}')['cached_tokens']} prompt tokens"
        )
