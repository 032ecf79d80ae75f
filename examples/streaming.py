"""Streaming: print text as it is generated, synchronously and with asyncio."""

import asyncio

import lmprog as lp


@lp.function
def story(s, topic):
    s += lp.user(f"Write two sentences about {topic}.")
    s += lp.assistant(lp.gen("story", max_tokens=64))


def sync_stream() -> None:
    state = story.run(topic="a lighthouse", temperature=0, stream=True)
    for piece in state.text_iter("story"):
        print(piece, end="", flush=True)
    print()


async def async_stream() -> None:
    state = story.run(topic="a small robot", temperature=0, stream=True)
    async for piece in state.text_async_iter("story"):
        print(piece, end="", flush=True)
    print()
    state = await story.run_async(topic="the sea", temperature=0)
    print("run_async:", state["story"])


if __name__ == "__main__":
    sync_stream()
    asyncio.run(async_stream())
