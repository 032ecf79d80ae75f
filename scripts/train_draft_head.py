"""Train an EAGLE-3 draft head for the bundled SmolLM2-135M-Instruct by self-distillation.

    PYTHONPATH=. python scripts/train_draft_head.py --out /tmp/head --minutes 12   # CPU
    PYTHONPATH=. python scripts/train_draft_head.py --device cuda --synth 4000 --gen-tokens 256 \
        --batch 16 --steps 3000 --minutes 5

1. prompts assembled here (chat questions, JSON extraction, code; no dataset download),
   split by a seeded shuffle into training and held-out prompts; with --synth N, N more
   written by the model itself (Magpie, arXiv 2406.08464: the chat template up to the user's
   text, sampled, gives the user turns the model expects), for variety past the templates;
2. the model answers the training prompts greedily (lp.Runtime, batched);
3. one forward per sequence captures the target's hidden states at the head's three layers;
   the labels are the sequence's next tokens (in the answers the model's own greedy choices);
4. the draft vocabulary is the labels' most frequent tokens (d2t / t2d); lm_head starts as
   the target's output embedding of those tokens, the token embedding is the target's;
5. training unrolls the head over its own states for --ttt-steps steps (EAGLE-3's
   training-time test: step j of position i sees the target's features up to i - j and its
   own states after), loss weights 0.8^j, --batch sequences a step (padded);
6. the head is written in the published layout (config.json + model.safetensors, fp16), and
   its mean accepted length on the held-out prompts measured through lp.Runtime against
   n-gram drafting and no speculation.
Everything is drawn from --seed: the same arguments give the same head on one machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

TOPICS = [
    "photosynthesis", "black holes", "the French Revolution", "compound interest", "vaccines",
    "the water cycle", "machine learning", "volcanoes", "the stock market", "climate change",
    "the immune system", "quantum computers", "the Roman Empire", "electric cars", "honey bees",
    "the internet", "sleep", "coffee", "earthquakes", "the moon landing", "democracy",
    "recycling", "the human heart", "jazz music", "chess", "rainbows", "inflation", "DNA",
    "solar panels", "the Great Wall of China", "penguins", "gravity", "the printing press",
    "meditation", "tides", "antibiotics", "the Olympic Games", "batteries", "deserts", "bread",
]  # fmt: skip
CHAT = [
    "Explain {t} in simple terms.", "What are three interesting facts about {t}?",
    "Write a short paragraph about {t} for a ten-year-old.", "Why is {t} important?",
    "Give me a brief history of {t}.", "What are the pros and cons of {t}?",
    "Summarize what you know about {t} in two sentences.", "Write a haiku about {t}.",
]  # fmt: skip
NAMES = ["Alice", "Bob", "Carmen", "Dmitri", "Emeka", "Fatima", "Gustav", "Hana", "Ivan", "Jun"]
CITIES = ["Paris", "Lagos", "Tokyo", "Lima", "Oslo", "Cairo", "Austin", "Delhi", "Rome", "Seoul"]
JOBS = ["teacher", "engineer", "nurse", "farmer", "pilot", "chef", "lawyer", "painter"]
CODE = [
    "Write a Python function that returns the {n}th Fibonacci number.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that sorts a list of {n} numbers with bubble sort.",
    "Write a JavaScript function that reverses an array.",
    "Write a Python class for a bank account with deposit and withdraw methods.",
    "Write a SQL query that selects all users older than {n}.",
    "Write a Python function that counts the vowels in a string.",
    "Write a Python function that returns the largest of {n} numbers in a list.",
]


def assemble_prompts(seed: int) -> list[str]:
    """Chat, extraction and code prompts, in a seeded order."""
    rng = random.Random(seed)
    out = [c.format(t=t) for t in TOPICS for c in CHAT]
    for _ in range(160):
        name, city, job = rng.choice(NAMES), rng.choice(CITIES), rng.choice(JOBS)
        age = rng.randint(19, 80)
        text = f"{name} is a {age}-year-old {job} who lives in {city}."
        out.append(
            f"Extract the name, age, job and city from this text as JSON with keys "
            f'"name", "age", "job", "city": {text}'
        )
    out += [c.format(n=rng.randint(3, 12)) for c in CODE for _ in range(6)]
    rng.shuffle(out)
    return out


def generate(rt, prompts: list[str], max_tokens: int) -> list[list[int]]:
    """prompt + greedy answer token ids of each chat-formatted prompt."""
    from lmprog.core.sampling import SamplingParams

    ids = chat_ids(rt, prompts)
    results = rt.generate(ids, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    return [p + list(r.token_ids) for p, r in zip(ids, results)]


def synthesize_prompts(rt, n: int, seed: int, max_tokens: int = 72) -> list[str]:
    """n user turns written by the model (Magpie): the chat template rendered up to where a
    user's text would start, sampled at temperature 1 (a seed per request), kept when they
    end their turn, are not too short and are new."""
    from lmprog.core.sampling import SamplingParams

    cut = "\x00user text\x00"
    rendered = rt.chat_template.render(
        [{"role": "user", "content": cut}], add_generation_prompt=True
    )
    prefix = rt._prompt_ids(rendered[: rendered.index(cut)])
    params = [
        SamplingParams(
            max_tokens=max_tokens, temperature=1.0, top_p=0.95, seed=seed * 1_000_003 + i
        )
        for i in range(n)
    ]
    results = rt.generate([prefix] * n, params)
    out, seen = [], set()
    for r in results:
        text = r.text.strip()
        if r.finish_reason == "stop" and len(text) >= 12 and text not in seen:
            seen.add(text)
            out.append(text)
    return out


def chat_ids(rt, prompts: list[str]) -> list[list[int]]:
    """Each prompt as one user turn of the model's chat template, tokenized as the runtime
    tokenizes a string prompt."""
    return [
        rt._prompt_ids(
            rt.chat_template.render([{"role": "user", "content": p}], add_generation_prompt=True)
        )
        for p in prompts
    ]


def teacher(model, seqs: list[list[int]], layers: tuple[int, ...]):
    """Per sequence (features [T, 3H] of tokens 0..T-1, tokens 1..T, tokens 2..T+1),
    T = len(seq) - 2: draft position i feeds features i and token i + 1 and learns token
    i + 2, the model's own greedy choice in its answer (the prompt's text before it)."""
    from lmprog.runtime.executor.forward_batch import ForwardBatch
    from lmprog.runtime.executor.kv_pool import KVPool
    from lmprog.runtime.models.llama import HiddenCapture

    param = next(model.parameters())
    out = []
    for seq in seqs:
        n = len(seq)
        kv = KVPool.for_model(model.config, n, param.dtype, param.device)
        table = torch.arange(1, n + 1, dtype=torch.int32, device=param.device)[None, :]
        batch = ForwardBatch.build(
            input_ids=seq,
            out_cache_loc=range(1, n + 1),
            req_pool_indices=[0],
            seq_lens=[n],
            extend_lens=[n],
            req_to_token=table,
        )
        with torch.inference_mode():
            _, feats = model.forward_capture(batch, kv, HiddenCapture(layers))
        out.append((feats[: n - 2].clone(), torch.tensor(seq[1:-1]), torch.tensor(seq[2:])))
    return out  # features stay on the target's device, in its dtype


def ttt_attention(head, q, ks, vs, j):
    """Step j's attention over a batch [B, T, heads, d]: query i sees step 0's keys at
    positions <= i - j (the target's features) and step m's key at position i - j + m
    (m = 1..j: its own drafted states)."""
    c = head.config.layer
    g = c.num_heads // c.num_kv_heads
    t = q.shape[1]
    scale = c.head_dim**-0.5
    k0, v0 = ks[0].repeat_interleave(g, 2), vs[0].repeat_interleave(g, 2)
    scores = torch.einsum("bihd,bkhd->bhik", q, k0) * scale
    i = torch.arange(t, device=q.device)
    allowed = i[None, :] <= (i[:, None] - j).clamp(min=0)  # rows i < j: not in the loss
    scores = scores.masked_fill(~allowed, float("-inf"))
    extra_k, extra_v = [], []
    for m in range(1, j + 1):
        idx = (i - (j - m)).clamp(min=0)
        extra_k.append(ks[m][:, idx].repeat_interleave(g, 2))
        extra_v.append(vs[m][:, idx].repeat_interleave(g, 2))
    if extra_k:
        ek = torch.stack(extra_k, 3)  # [B, T, heads, j, d]
        es = torch.einsum("bihd,bihmd->bhim", q, ek) * scale  # [B, heads, T, j]
        p = torch.cat([scores, es], -1).softmax(-1)
        ev = torch.stack(extra_v, 3)
        return torch.einsum("bhik,bkhd->bihd", p[..., :t], v0) + torch.einsum(
            "bhim,bihmd->bihd", p[..., t:], ev
        )
    return torch.einsum("bhik,bkhd->bihd", scores.softmax(-1), v0)


def unrolled_logits(head, feats, ids, steps: int):
    """The head's logits [B, T, draft vocab] at each step j < steps, unrolled over its own
    states (EAGLE-3's training-time test). Step j at position i is what drafting computes j
    tokens past the target's last feature i - j: the target's features at positions <= i - j
    in the head's KV, its own states after, token ids[i] fed with its state at i - 1.
    feats [B, T, 3H], ids [B, T]."""
    layer, c = head.midlayer, head.config.layer
    b, t = ids.shape
    hq, hkv = c.num_heads, c.num_kv_heads
    cos, sin = head.rotary.cos_sin(torch.arange(t, device=ids.device), torch.float32)
    emb = head.embed(ids).detach().float()  # the target's embedding, not trained
    hidden = head.fc(feats.float())
    ks: list[torch.Tensor] = []
    vs: list[torch.Tensor] = []
    for j in range(steps):
        x = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(hidden)], -1)
        qkv = layer.self_attn.qkv_proj(x).view(b, t, hq + 2 * hkv, c.head_dim)
        qk = head.rotary.rotate(qkv[:, :, : hq + hkv], cos, sin)
        ks.append(qk[:, :, hq:])
        vs.append(qkv[:, :, hq + hkv :])
        o = ttt_attention(head, qk[:, :, :hq], ks, vs, j)
        h, residual = layer.post_attention_layernorm(layer.self_attn.o_proj(o.flatten(-2)), hidden)
        normed, total = head.norm(layer.mlp(h), residual)
        yield head.lm_head(normed)
        hidden = torch.cat([total[:, :1] * 0, total[:, :-1]], 1)  # position i: its own i - 1


def unrolled_loss(head, feats, ids, labels, steps: int):
    """Sum over steps j of 0.8^j x cross-entropy (positions i >= j, labels >= 0); top-1
    accuracy per step. labels [B, T] in the draft vocabulary (padding: -100)."""
    loss, accs = 0.0, []
    for j, logits in enumerate(unrolled_logits(head, feats, ids, steps)):
        valid = labels >= 0
        valid[:, :j] = False
        if valid.any():
            loss = loss + 0.8**j * F.cross_entropy(logits[valid], labels[valid])
            accs.append((logits[valid].argmax(-1) == labels[valid]).float().mean().item())
    return loss, accs


def collate(items, to_draft):
    """Pad a batch of (features, ids, greedy labels) to its longest; padded labels -100."""
    t = max(f.shape[0] for f, _, _ in items)
    feats = items[0][0].new_zeros(len(items), t, items[0][0].shape[1])
    ids = torch.zeros(len(items), t, dtype=torch.int64)
    labels = torch.full((len(items), t), -100, dtype=torch.int64)
    for row, (f, i, g) in enumerate(items):
        feats[row, : len(f)] = f
        ids[row, : len(i)] = i
        labels[row, : len(g)] = to_draft[g]
    return feats, ids.to(feats.device), labels.to(feats.device)


def train(args) -> list[str]:
    """Train and write the head; the held-out prompts."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    import lmprog as lp
    from lmprog.runtime.speculative.head_build import dummy_eagle3_config
    from lmprog.runtime.speculative.head_files import build_eagle3, save_eagle3
    from lmprog.runtime.speculative.heads import Eagle3Config

    t0 = time.perf_counter()
    prompts = assemble_prompts(args.seed)
    held_out, train_prompts = prompts[: args.eval_prompts], prompts[args.eval_prompts :]
    train_prompts = train_prompts[: args.prompts]
    rt = lp.Runtime(
        device=args.device,
        num_threads=args.threads if args.device == "cpu" else None,
        max_total_tokens=args.kv_tokens,
    )
    target = rt.engine.runner.model
    tc = target.config
    base = dummy_eagle3_config(tc)
    layers = base.capture_layers(tc.num_layers)
    if args.synth:
        written = synthesize_prompts(rt, args.synth, args.seed)
        kept = sorted(set(written) - set(held_out))
        random.Random(args.seed).shuffle(kept)
        print(f"the model wrote {len(kept)} usable prompts of {args.synth} sampled")
        train_prompts += kept
    seqs = generate(rt, train_prompts, args.gen_tokens)
    ntok = sum(map(len, seqs))
    print(f"generated {len(seqs)} sequences, {ntok} tokens in {time.perf_counter() - t0:.0f} s")
    data = rt.engine.call(lambda: teacher(target, seqs, layers))  # on the engine's thread
    data = [tuple(x.clone() for x in d) for d in data]  # not inference tensors: trainable inputs
    data.sort(key=lambda d: len(d[1]))  # batches of like lengths pad little
    print(f"teacher features at layers {layers} in {time.perf_counter() - t0:.0f} s")

    counts = torch.bincount(torch.cat([g for _, _, g in data]), minlength=tc.vocab_size)
    hot = counts.topk(args.draft_vocab).indices.sort().values
    t2d = torch.zeros(tc.vocab_size, dtype=torch.bool)
    t2d[hot] = True
    to_draft = torch.full((tc.vocab_size,), -100, dtype=torch.int64)
    to_draft[hot] = torch.arange(len(hot))
    covered = counts[hot].sum().item() / counts.sum().item()
    print(f"draft vocabulary {len(hot)} tokens covers {covered:.1%} of the labels")

    layer = dataclasses.replace(base.layer, intermediate_size=args.intermediate)
    config = Eagle3Config(layer, tc.hidden_size, len(hot), None, has_embedding=False)
    head = build_eagle3(config, target, dtype=torch.float32)
    out_embed = target.model.embed_tokens.weight if tc.tie_word_embeddings else None
    with torch.no_grad():
        head.d2t.copy_(hot - torch.arange(len(hot)))
        head.t2d.copy_(t2d)
        if out_embed is not None:  # tied: the output embedding is the token embedding
            head.lm_head.weight.copy_(out_embed[hot.to(out_embed.device)].float())
    head.train()
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    budget = args.minutes * 60  # a cap: the schedule follows steps, so a seed fixes the head
    start, step = time.perf_counter(), 0
    rng = random.Random(args.seed)
    batches = [
        list(range(i, min(i + args.batch, len(data)))) for i in range(0, len(data), args.batch)
    ]
    order: list[list[int]] = []
    while step < args.steps and time.perf_counter() - start < budget:
        if not order:
            order = list(batches)
            rng.shuffle(order)
        feats, ids, labels = collate([data[i] for i in order.pop()], to_draft)
        frac = step / args.steps
        for g in opt.param_groups:  # warm-up, then cosine to 10%
            g["lr"] = args.lr * min(1.0, (step + 1) / 50) * (0.55 + 0.45 * math.cos(math.pi * frac))
        loss, accs = unrolled_loss(head, feats, ids, labels, args.ttt_steps)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 25 == 0:
            acc = " ".join(f"{a:.2f}" for a in accs)
            print(
                f"step {step} ({time.perf_counter() - start:.0f} s) loss {loss.item():.3f} acc {acc}"
            )
        step += 1
    if step < args.steps:
        print(f"time cap of {args.minutes} min reached: {step} of {args.steps} steps")
    print(f"trained {step} steps of {args.batch} sequences in {time.perf_counter() - start:.0f} s")
    rt.shutdown()
    head.eval()
    save_eagle3(head.half(), args.out, lmprog_training={
        "script": "scripts/train_draft_head.py", "seed": args.seed, "device": args.device,
        "prompts": len(train_prompts), "synth": args.synth, "gen_tokens": args.gen_tokens,
        "batch": args.batch, "steps": step,
        "ttt_steps": args.ttt_steps, "minutes": args.minutes, "argv": sys.argv[1:],
    })  # fmt: skip
    size = sum(f.stat().st_size for f in Path(args.out).iterdir())
    print(f"wrote {args.out} ({size / 1e6:.1f} MB) after {time.perf_counter() - t0:.0f} s")
    return held_out


def release_memory() -> None:
    """Drop what finished runtimes and the training left on the device before the next
    runtime sizes its KV pool from the free memory."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def evaluate(args, prompts: list[str]) -> dict:
    """Mean accepted length (tokens per verify: accepted drafts + 1) and tokens/s of the
    head, n-gram drafting and no speculation on held-out prompts, greedy."""
    import lmprog as lp
    from lmprog.core.sampling import SamplingParams

    out = {}
    reference = None
    for name, spec in (
        ("none", None),
        ("ngram", "ngram"),
        ("eagle", {"method": "eagle", "draft_model": str(args.out)}),
    ):
        threads = args.threads if args.device == "cpu" else None
        rt = lp.Runtime(device=args.device, num_threads=threads, speculative=spec)
        texts = chat_ids(rt, prompts)
        params = SamplingParams(max_tokens=args.eval_tokens, temperature=0.0, ignore_eos=True)
        rt.generate(texts[:1], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
        before = rt.stats()
        t = time.perf_counter()
        ids = [r.token_ids for r in (rt.generate([x], params)[0] for x in texts)]  # batch 1
        seconds = time.perf_counter() - t
        stats = rt.stats()
        rt.shutdown()
        del rt
        release_memory()
        reference = reference or ids
        verifies = stats.get("spec_verify_steps", 0) - before.get("spec_verify_steps", 0)
        accepted = stats.get("spec_accepted_tokens", 0) - before.get("spec_accepted_tokens", 0)
        out[name] = {
            "tokens_per_s": sum(map(len, ids)) / seconds,
            "mean_accepted_length": (accepted + verifies) / verifies if verifies else 1.0,
            "acceptance_rate": stats.get("spec_acceptance_rate", 0.0),
            "identical_to_plain": ids == reference,
        }
        print(name, json.dumps(out[name]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_out = (
        Path(__file__).resolve().parents[1]
        / "lmprog/runtime/speculative/heads_data/eagle3-smollm2-135m-instruct"
    )
    ap.add_argument("--out", type=Path, default=default_out)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    ap.add_argument("--prompts", type=int, default=160, help="training prompts")
    ap.add_argument("--gen-tokens", type=int, default=160, help="answer tokens per prompt")
    ap.add_argument("--eval-prompts", type=int, default=8, help="held-out prompts (0: no eval)")
    ap.add_argument("--eval-tokens", type=int, default=96)
    ap.add_argument("--draft-vocab", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=1024, help="the head's MLP width")
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--synth", type=int, default=0, help="prompts the model writes (Magpie)")
    ap.add_argument("--batch", type=int, default=1, help="sequences per training step")
    ap.add_argument("--kv-tokens", type=int, default=65536, help="the runtime's KV pool")
    ap.add_argument("--steps", type=int, default=800, help="training steps")
    ap.add_argument("--minutes", type=float, default=60.0, help="cap on the training time")
    ap.add_argument("--eval-only", action="store_true", help="measure the head at --out")
    args = ap.parse_args()
    if args.eval_only:
        evaluate(args, assemble_prompts(args.seed)[: args.eval_prompts])
        return
    held_out = train(args)  # its tensors freed on return
    release_memory()
    if args.eval_prompts:
        evaluate(args, held_out)


if __name__ == "__main__":
    main()
