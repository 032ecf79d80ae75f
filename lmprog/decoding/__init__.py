"""Decoding shared by every backend that samples in lmprog (the runtime, llama.cpp): from one
step's next-token logits to the request's text, tokens and finish reason.

    state.py          DecodeState: one request's output side (finish rules, stop strings,
                      constraint guide, jump-forward, logprobs, streaming, the result)
    batch_sampler.py  BatchSampler: one token per request of a step from its DecodeState
    sampler.py        the batched torch sampler (penalties, min_tokens, masks, temperature,
                      top-k/p, min-p, seeds, logprobs)
    rng.py            seeded generators: uniform i of a seed is a hash of (seed, i)
    rejection.py      the speculative acceptance rule over the sampler's distributions
    detok.py          incremental detokenizing and stop strings
    result.py         EngineResult, what the runtime hands back

Imports core and fsm only, never runtime or backends: both backends import it.
"""
