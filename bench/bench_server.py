"""The HTTP layer's cost under load (issue 7): 32 concurrent streamed chat requests to
`lmprog serve` on loopback, against the same 32 requests streamed through the in-process
runtime, on one Runtime (default model, CPU), in the same run.

  in-process      32 threads call rt.generate(GenerateRequest, stream=callback), started
                  one after the other as fast as they start
  lmprog-server   a client process opens 32 HTTP connections at once and reads the SSE
                  streams of /v1/chat/completions (the server renders the same chat prompt)

Every request generates exactly --tokens tokens (greedy, ignore_eos); the radix cache is
flushed before each phase so both sides prefill everything. Throughput = generated tokens /
wall time of the phase; TTFT = time from sending a request to its first text. The phases
alternate for --repeats rounds and the best round of each side counts (a noisy neighbour
hurts both alike). The client is a separate process with a minimal asyncio HTTP reader, so
the server's process pays for the server only. Target: < 10% throughput loss. Last, lone
requests one at a time give the HTTP layer's own latency on an idle engine (TTFT).

    python bench/bench_server.py                       # 32 streams x 64 tokens, 1 torch thread
    python bench/bench_server.py --streams 32 --tokens 64 --repeats 3 --threads 1

Concurrency on the llama.cpp backend (issue 16, item 3), `--backend llamacpp`: one
`lp.LlamaCpp()` (its default threads) serves both sides; each round measures, in process
and through `lmprog serve`, 1 request alone, --concurrent requests at once (time ratio,
target <= 1.6x) and --streams streams at once (tokens/s against the lone request's, target
>= 3x). Every phase uses prompts no earlier phase used (the chat template's system header
is shared, as on a real server). Rounds: all listed, with their range.

    python bench/bench_server.py --backend llamacpp --tokens 64 --repeats 3
    PYTHONPATH=/tmp/old python bench/bench_server.py --backend llamacpp   # another tree
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time

TOPICS = [
    "cats",
    "dogs",
    "rain",
    "the sea",
    "bread",
    "music",
    "trees",
    "snow",
    "stars",
    "trains",
    "bees",
    "tea",
    "rivers",
    "clocks",
    "maps",
    "salt",
    "owls",
    "glass",
    "wind",
    "paper",
    "coffee",
    "bridges",
    "moss",
    "kites",
    "ice",
    "sand",
    "honey",
    "ships",
    "lamps",
    "frogs",
    "wool",
    "caves",
]


def messages(i: int) -> list[dict[str, str]]:
    topic = TOPICS[i % len(TOPICS)] + ("" if i < len(TOPICS) else f" #{i}")
    return [{"role": "user", "content": f"Write a short paragraph about {topic}."}]


def summary(ttfts: list[float], tokens: int, wall: float) -> dict[str, float]:
    ttfts = sorted(ttfts)
    return {
        "tok_s": tokens / wall,
        "wall_s": wall,
        "ttft_mean_ms": 1e3 * statistics.fmean(ttfts),
        "ttft_p50_ms": 1e3 * ttfts[len(ttfts) // 2],
        "ttft_p90_ms": 1e3 * ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))],
    }


# ---- in-process -------------------------------------------------------------------------------
def run_in_process(rt, n: int, tokens: int, first: int = 0) -> dict[str, float]:
    """n concurrent streamed requests (prompts first..first+n-1)."""
    from lmprog.core.protocol import GenerateRequest
    from lmprog.core.sampling import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    prompts = [
        rt.chat_template.render(messages(first + i), add_generation_prompt=True) for i in range(n)
    ]
    ttfts, counts = [0.0] * n, [0] * n

    def one(i: int) -> None:
        seen: list[float] = []

        def on_piece(_: str) -> None:
            if not seen:
                seen.append(time.perf_counter())

        start = time.perf_counter()
        result = rt.generate(GenerateRequest(prompts[i], params), stream=on_piece)
        ttfts[i], counts[i] = seen[0] - start, result.completion_tokens

    # Requests start one after the other as fast as threads start, as the client process
    # opens its connections (a barrier releasing all at once makes one giant first prefill).
    start = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    assert counts == [tokens] * n, counts
    return summary(ttfts, sum(counts), wall)


# ---- the client process -----------------------------------------------------------------------
async def _stream(port: int, body: bytes) -> tuple[float, int]:
    """(seconds to the first text, completion tokens) of one streamed chat request."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.perf_counter()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
        b"application/json\r\nConnection: close\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    first, usage, buffer = None, 0, b""
    while True:  # chunked transfer encoding around the SSE events
        size = int((await reader.readline()).strip(), 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            break
        buffer += chunk[:-2]
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            data = event[len(b"data: ") :]
            if data == b"[DONE]":
                continue
            payload = json.loads(data)
            if payload.get("usage"):
                usage = payload["usage"]["completion_tokens"]
            elif (
                first is None
                and payload["choices"]
                and payload["choices"][0]["delta"].get("content")
            ):
                first = time.perf_counter() - start
    writer.close()
    return first, usage


async def _clients(port: int, model: str, n: int, tokens: int, first: int = 0) -> dict[str, float]:
    bodies = [
        json.dumps(
            {
                "model": model,
                "messages": messages(first + i),
                "max_tokens": tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode()
        for i in range(n)
    ]
    start = time.perf_counter()
    out = await asyncio.gather(*(_stream(port, b) for b in bodies))
    wall = time.perf_counter() - start
    counts = [c for _, c in out]
    assert counts == [tokens] * n, counts
    return summary([t for t, _ in out], sum(counts), wall)


async def _rounds(
    port: int, model: str, n: int, tokens: int, rounds: int, first: int = 0
) -> list[dict[str, float]]:
    return [await _clients(port, model, n, tokens, first=first + r * n) for r in range(rounds)]


def client_main(port: int, model: str, n: int, tokens: int, rounds: int, first: int = 0) -> None:
    print(json.dumps(asyncio.run(_rounds(port, model, n, tokens, rounds, first))), flush=True)


def run_server(
    port: int, model: str, n: int, tokens: int, rounds: int = 1, first: int = 0
) -> list[dict[str, float]]:
    """`rounds` phases, one after the other, of n concurrent streams (one client process;
    prompts first, first+1, ...)."""
    out = subprocess.run(
        [sys.executable, __file__, "--client", str(port), model, str(n), str(tokens), str(rounds)]
        + ([str(first)] if first else []),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- main -------------------------------------------------------------------------------------
def best(rounds: list[dict[str, float]]) -> dict[str, float]:
    return max(rounds, key=lambda r: r["tok_s"])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        port, model, n, tokens, rounds = sys.argv[2:7]
        first = int(sys.argv[7]) if len(sys.argv) > 7 else 0
        client_main(int(port), model, int(n), int(tokens), int(rounds), first)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--backend", choices=("runtime", "llamacpp"), default="runtime")
    ap.add_argument("--streams", type=int, help="concurrent streams (runtime 32, llamacpp 16)")
    ap.add_argument("--concurrent", type=int, default=4, help="llamacpp: requests timed at once")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument(
        "--lone", type=int, default=8, help="lone requests (one at a time) for the unloaded TTFT"
    )
    args = ap.parse_args()
    if args.backend == "llamacpp":
        args.streams = args.streams or 16
        main_llamacpp(args)
        return
    args.streams = args.streams or 32

    import torch

    from lmprog.backends.runtime import Runtime
    from lmprog.serve import Server

    torch.set_num_threads(args.threads)
    rt = Runtime(device="cpu", max_total_tokens=16384, num_threads=args.threads)
    sides = {"in-process": [], "lmprog-server": []}
    with Server(rt).start() as srv:
        run_in_process(rt, 4, 4)  # warm-up both paths
        run_server(srv.port, srv.model_name, 4, 4)
        for _ in range(args.repeats):
            rt.flush_cache()
            sides["in-process"].append(run_in_process(rt, args.streams, args.tokens))
            rt.flush_cache()
            sides["lmprog-server"].extend(
                run_server(srv.port, srv.model_name, args.streams, args.tokens)
            )
        rt.flush_cache()
        lone = {"in-process": [run_in_process(rt, 1, 8, first=i) for i in range(args.lone)]}
        rt.flush_cache()
        lone["lmprog-server"] = run_server(srv.port, srv.model_name, 1, 8, rounds=args.lone)
    rt.shutdown()
    report(sides, lone, args)


def report(
    sides: dict[str, list[dict[str, float]]],
    lone: dict[str, list[dict[str, float]]],
    args: argparse.Namespace,
) -> None:
    base, srv = best(sides["in-process"]), best(sides["lmprog-server"])
    print(
        f"{args.streams} concurrent streams x {args.tokens} tokens (chat, greedy, ignore_eos), "
        f"torch threads {args.threads}, best of {args.repeats} rounds"
    )
    print(f"  {'':16s} {'in-process':>12s} {'lmprog-server':>14s} {'server/in-process':>18s}")
    rows = [
        ("throughput tok/s", "tok_s"),
        ("TTFT mean ms", "ttft_mean_ms"),
        ("TTFT p50 ms", "ttft_p50_ms"),
        ("TTFT p90 ms", "ttft_p90_ms"),
        ("wall s", "wall_s"),
    ]
    for label, key in rows:
        print(f"  {label:16s} {base[key]:12.1f} {srv[key]:14.1f} {srv[key] / base[key]:17.3f}x")
    loss = 1 - srv["tok_s"] / base["tok_s"]
    print(f"throughput loss through HTTP: {100 * loss:.1f}% (target < 10%)")
    print(
        "all rounds tok/s: in-process "
        + ", ".join(f"{r['tok_s']:.1f}" for r in sides["in-process"])
        + "; server "
        + ", ".join(f"{r['tok_s']:.1f}" for r in sides["lmprog-server"])
    )
    ttft = {side: statistics.median(r["ttft_mean_ms"] for r in runs) for side, runs in lone.items()}
    print(
        f"lone request TTFT (median of {args.lone}, one at a time): in-process "
        f"{ttft['in-process']:.1f} ms, lmprog-server {ttft['lmprog-server']:.1f} ms "
        f"({ttft['lmprog-server'] / ttft['in-process']:.3f}x, "
        f"{ttft['lmprog-server'] - ttft['in-process']:+.1f} ms)"
    )


# ---- llama.cpp concurrency ----------------------------------------------------------------------
def main_llamacpp(args: argparse.Namespace) -> None:
    import os

    import torch

    import lmprog
    from lmprog.backends.llamacpp import LlamaCpp
    from lmprog.serve import Server

    torch.set_num_threads(args.threads)
    tree = os.path.dirname(os.path.dirname(lmprog.__file__))
    head = subprocess.run(
        ["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    backend = LlamaCpp()
    print(
        f"lmprog from {tree} (HEAD {head}); LlamaCpp() n_threads={backend.n_threads}, "
        f"n_threads_batch={backend.n_threads_batch}, torch threads {args.threads}"
    )
    phases = (("one", 1), ("concurrent", args.concurrent), ("streams", args.streams))
    width = max(args.streams, args.concurrent)
    rounds: dict[str, list[dict[str, dict[str, float]]]] = {"in-process": [], "lmprog-server": []}
    raw: list[dict[int, float]] = []
    with Server(backend).start() as srv:
        run_in_process(backend, 2, 4, first=10_000)  # warm-up both paths
        run_server(srv.port, srv.model_name, 2, 4, first=10_100)
        first = 0
        for _ in range(args.repeats):
            for side in rounds:
                out = {}
                for name, n in phases:
                    if side == "in-process":
                        out[name] = run_in_process(backend, n, args.tokens, first=first)
                    else:
                        out[name] = run_server(
                            srv.port, srv.model_name, n, args.tokens, first=first
                        )[0]
                    first += width  # prompts no earlier phase used
                rounds[side].append(out)
            raw.append(raw_llama_cpp(backend, (1, args.concurrent, args.streams), args.tokens))
    stats = backend.stats()
    backend.shutdown()
    report_llamacpp(rounds, raw, args, stats)


def raw_llama_cpp(backend, sizes: tuple[int, ...], steps: int) -> dict[int, float]:
    """Seconds per decode step of llama.cpp alone (ctypes, greedy argmax, no sampler or
    server) with n sequences in each llama_decode call, on a context like the backend's:
    the ceiling of batching on this machine. Empty where the tree's NativeContext runs one
    sequence only (before issue 16, item 3)."""
    import inspect

    import numpy as np

    from lmprog.backends.llamacpp_native import NativeContext

    if "n_seq" not in inspect.signature(NativeContext).parameters:
        return {}
    ctx = NativeContext(
        backend._model,
        n_ctx=backend.n_ctx,
        n_batch=512,
        n_seq=max(sizes),
        n_threads=backend.n_threads,
        n_threads_batch=backend.n_threads_batch,
    )
    prompt = backend.tokenizer.encode("Write a short paragraph about the sea.")
    out = {}
    try:
        for n in sizes:
            ctx.clear()
            logits = ctx.decode([(s, prompt, len(prompt) - 1) for s in range(n)], prompt=True)
            tokens = logits.argmax(axis=1)
            start = time.perf_counter()
            for _ in range(steps):
                rows = [(s, [int(t)], 0) for s, t in enumerate(tokens)]
                tokens = np.argmax(ctx.decode(rows, prompt=False), axis=1)
            out[n] = (time.perf_counter() - start) / steps
    finally:
        ctx.close()
    return out


def report_llamacpp(
    rounds: dict[str, list[dict[str, dict[str, float]]]],
    raw: list[dict[int, float]],
    args: argparse.Namespace,
    stats: dict,
) -> None:
    c, n = args.concurrent, args.streams
    print(
        f"1 request vs {c} concurrent (time), 1 stream vs {n} streams (tokens/s); "
        f"{args.tokens} tokens each (chat, greedy, ignore_eos); {args.repeats} rounds, the "
        "best of each phase over the rounds (the machine is shared), then every round"
    )
    for side, runs in rounds.items():
        one = min(r["one"]["wall_s"] for r in runs)
        conc = min(r["concurrent"]["wall_s"] for r in runs)
        tps1 = max(r["one"]["tok_s"] for r in runs)
        tpsn = max(r["streams"]["tok_s"] for r in runs)
        print(
            f"  {side:14s} best: 1 request {one:.2f} s, {c} concurrent {conc:.2f} s -> "
            f"{conc / one:.2f}x (target <= 1.6x); 1 stream {tps1:.1f} tok/s, {n} streams "
            f"{tpsn:.1f} tok/s -> {tpsn / tps1:.2f}x (target >= 3x)"
        )
        for i, r in enumerate(runs):
            print(
                f"    round {i + 1}: {r['one']['wall_s']:.2f} s, {r['concurrent']['wall_s']:.2f} s "
                f"({r['concurrent']['wall_s'] / r['one']['wall_s']:.2f}x); "
                f"{r['one']['tok_s']:.1f} tok/s, {r['streams']['tok_s']:.1f} tok/s "
                f"({r['streams']['tok_s'] / r['one']['tok_s']:.2f}x); "
                f"TTFT mean at {n}: {r['streams']['ttft_mean_ms']:.0f} ms"
            )
    if raw and raw[0]:
        best = {k: min(r[k] for r in raw) for k in raw[0]}
        print(
            f"  {'llama.cpp alone':14s} best: decode step 1 seq {1e3 * best[1]:.1f} ms, {c} seqs "
            f"{1e3 * best[c]:.1f} ms -> {best[c] / best[1]:.2f}x; {n} seqs {1e3 * best[n]:.1f} ms "
            f"-> {n * best[1] / best[n]:.2f}x the tokens/s of 1"
        )
        for i, r in enumerate(raw):
            print(
                "    round "
                + f"{i + 1}: "
                + ", ".join(f"{k} seqs {1e3 * v:.1f} ms" for k, v in r.items())
            )
    print(
        "backend: "
        + ", ".join(f"{k}={stats[k]}" for k in ("requests", "prompt_tokens", "cached_tokens"))
    )


if __name__ == "__main__":
    main()
