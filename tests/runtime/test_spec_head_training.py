"""scripts/train_draft_head.py trains what drafting runs: its unrolled training-time test at
step j and position i equals the head's own forward through a KV pool over the target's
features up to i - j and then j steps on its own states (as the EAGLE proposer drafts), and
a padded batch gives every sequence the logits it has alone."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from engine_testing import random_llama
from spec_testing import HEAD_TARGET

from lmprog.runtime.executor.forward_batch import ForwardBatch
from lmprog.runtime.executor.kv_pool import KVPool
from lmprog.runtime.speculative.head_build import dummy_eagle3_config
from lmprog.runtime.speculative.head_files import build_eagle3

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_draft_head.py"
_spec = importlib.util.spec_from_file_location("train_draft_head", SCRIPT)
assert _spec is not None and _spec.loader is not None
train = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train)

SEQS = [
    [5, 17, 3, 99, 42, 7, 120, 8, 8, 61, 2, 33],
    [1, 2, 3, 4, 200, 10, 10],
    [77, 5, 19, 140, 3, 3, 58, 9, 100, 12, 6, 44, 7, 150],
]


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = random_llama(HEAD_TARGET, 0.3)
    config = dummy_eagle3_config(HEAD_TARGET, 48)
    head = build_eagle3(config, model, dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(0.0, 0.3, generator=g)
        head.d2t.copy_(torch.arange(48) * 3)  # draft id d is target id 4 d
    data = train.teacher(model, SEQS, config.capture_layers(HEAD_TARGET.num_layers))
    return head, data


def drafted(head, feats, ids, i, j):
    """Step j's logits at position i as drafting computes them: the target's features of
    positions 0..i - j into the head's KV, then j one-token steps on the head's own state."""
    c = head.config.layer
    kv = KVPool(i + 2, 1, c.num_kv_heads, c.head_dim, torch.float32, "cpu")
    table = torch.arange(1, i + 2, dtype=torch.int32)[None, :]
    n0 = i - j + 1
    batch = ForwardBatch.build(
        input_ids=ids[:n0].tolist(),
        out_cache_loc=range(1, n0 + 1),
        req_pool_indices=[0],
        seq_lens=[n0],
        extend_lens=[n0],
        req_to_token=table,
    )
    with torch.no_grad():
        logits, hidden = head(batch, kv, feats[:n0].float(), project=True)
        for pos in range(n0, i + 1):
            batch = ForwardBatch.build(
                input_ids=[int(ids[pos])],
                out_cache_loc=[pos + 1],
                req_pool_indices=[0],
                seq_lens=[pos + 1],
                extend_lens=[1],
                req_to_token=table,
            )
            logits, hidden = head(batch, kv, hidden, project=False)
    return logits[0]


def test_training_unroll_is_what_drafting_computes(setup):
    head, data = setup
    feats, ids, _ = data[0]
    with torch.no_grad():
        steps = list(train.unrolled_logits(head, feats[None], ids[None], 3))
    t = ids.shape[0]
    for j in range(3):
        for i in range(j, t):
            want = drafted(head, feats, ids, i, j)
            torch.testing.assert_close(steps[j][0, i], want, atol=1e-4, rtol=1e-4)


def test_padding_changes_no_row_and_the_batched_loss_is_the_per_sequence_one(setup):
    head, data = setup
    to_draft = torch.full((HEAD_TARGET.vocab_size,), -100, dtype=torch.int64)
    to_draft[::4][:48] = torch.arange(48)  # the ids d2t reaches; the rest out of the vocabulary
    feats, ids, labels = train.collate(data, to_draft)
    assert feats.shape[:2] == ids.shape == labels.shape == (3, max(len(s) for s in SEQS) - 2)
    with torch.no_grad():
        batched = list(train.unrolled_logits(head, feats, ids, 3))
        for row, (f, i, g) in enumerate(data):
            alone = list(train.unrolled_logits(head, f[None], i[None], 3))
            for j in range(3):
                torch.testing.assert_close(batched[j][row, : len(i)], alone[j][0])
            assert (labels[row, len(i) :] == -100).all()
            assert torch.equal(labels[row, : len(i)], to_draft[g])
    # two sequences of one length, every label in the vocabulary: the batch's loss is the
    # mean of theirs (each step's cross-entropy averages over as many positions in each)
    every = torch.arange(HEAD_TARGET.vocab_size) % 48
    pair = [tuple(x[:10] for x in data[0]), tuple(x[:10] for x in data[2])]
    with torch.no_grad():
        both, _ = train.unrolled_loss(head, *train.collate(pair, every), 3)
        each = [
            train.unrolled_loss(head, f[None], i[None], every[g][None], 3)[0] for f, i, g in pair
        ]
    torch.testing.assert_close(both, (each[0] + each[1]) / 2)
