"""Parity with PEFT itself: a tiny random transformers Llama, a LoRA adapter made and saved
by PEFT (random A and B, several ranks through rank_pattern, alpha_pattern, rslora), the
base saved as an HF folder and loaded by lmprog; lmprog's logits under the adapter equal
PEFT's unmerged model's and its merged model's."""

from __future__ import annotations

import copy

import pytest
import torch

peft = pytest.importorskip("peft", reason="peft is not installed (pip install peft)")
transformers = pytest.importorskip("transformers")

from lmprog.runtime.config import LoraConfig  # noqa: E402
from lmprog.runtime.lora import LoraManager, read_adapter  # noqa: E402
from lmprog.runtime.lora.ops import LoraBatch  # noqa: E402
from lmprog.runtime.models import load_model  # noqa: E402

CASES = {
    "all7-r8": dict(
        r=8,
        lora_alpha=16,
        target_modules=[
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ],
    ),  # fmt: skip
    "qv-r4-rslora": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_rslora=True),
    "patterns": dict(
        r=6,
        lora_alpha=12,
        target_modules=["q_proj", "o_proj", "down_proj"],
        rank_pattern={"down_proj": 2},
        alpha_pattern={"o_proj": 3.0},
        layers_to_transform=[1],
    ),  # fmt: skip
}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).float().eval()
    folder = tmp_path_factory.mktemp("base")
    hf.save_pretrained(folder)
    return hf, load_model(str(folder), device="cpu", dtype="float32")


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_equal_peft(base, tmp_path, case):
    hf, ours = base
    torch.manual_seed(1)
    lora_cfg = peft.LoraConfig(init_lora_weights=False, lora_dropout=0.0, **CASES[case])
    model = peft.get_peft_model(copy.deepcopy(hf), lora_cfg).eval()
    model.save_pretrained(tmp_path)
    ids = torch.randint(0, 128, (1, 30))
    with torch.inference_mode():
        want = model(ids).logits[0].float()
        merged = model.merge_and_unload()(ids).logits[0].float()
        plain = hf(ids).logits[0].float()
    net = copy.deepcopy(ours)
    adapter = read_adapter(tmp_path, net.config, name=case)
    manager = LoraManager(net, LoraConfig(max_loras_per_batch=2), [adapter])
    plan = manager.prepare([adapter.uid], [ids.shape[1]])
    got = _prefill(
        net, ids[0].tolist(), manager, LoraBatch.from_plan(plan, torch.device("cpu"), False)
    )
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, atol=1e-4 * scale, rtol=0)
    torch.testing.assert_close(got, merged, atol=1e-4 * scale, rtol=0)
    assert (want - plain).abs().max().item() > 1e-2 * scale  # the adapter matters


def _prefill(net, ids, manager, lora_batch):
    from lmprog.runtime.executor.forward_batch import ForwardBatch
    from lmprog.runtime.executor.kv_pool import KVPool

    kv = KVPool.for_model(net.config, 128, torch.float32, torch.device("cpu"))
    table = torch.zeros(1, 64, dtype=torch.int32)
    table[0, : len(ids)] = torch.arange(1, len(ids) + 1)
    fb = ForwardBatch.build(
        input_ids=ids,
        out_cache_loc=list(range(1, len(ids) + 1)),
        req_pool_indices=[0],
        seq_lens=[len(ids)],
        extend_lens=[len(ids)],
        req_to_token=table,
        logits_indices=range(len(ids)),
    )
    manager.context.batch = lora_batch
    try:
        with torch.inference_mode():
            return net(fb, kv)
    finally:
        manager.context.batch = None
