"""The engine's fp16 forward/backward is as accurate as transformers' own fp16 computation: both
against an fp64 truth of the same model and inputs, with the loss scaled as fp16 training scales it
(so that small gradients do not underflow). This is what bounds the fp16 training comparison in
tests/python/trainer/test_pipeline_fp16.py: the two pipelines' gradients differ by fp16 rounding,
not by a precision defect in either.

Measured (AVX2 CPU, 2-layer Llama, 4 x 40 tokens): relative gradient errors 5.7e-4 to 1.3e-3 for
both; engine/transformers error ratio 0.90 to 1.08 per tensor. Bound: each tensor's engine error
<= 1.25 x transformers' error, the two being sums of many independent roundings of computations of
the same depth, whose norms concentrate near their expectation (here within 10%); and <= 16 u16
absolutely (u16 = 2**-11), a few roundings per layer on a 2-layer model."""

import pytest
import torch
import transformers

from engine_testlib import run_check, write_inputs

U16 = 2.0 ** -11
SCALE = 2.0 ** 16


def grads_hf(model_dir, dtype, ids, labels, scale):
    m = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager")
    m.eval()  # no dropout (the model has none; train() would change nothing else)
    out = m(input_ids=ids, labels=labels)
    (out.loss.float() * scale).backward()
    return {n: p.grad.double() / scale for n, p in m.named_parameters()}


@pytest.mark.parametrize("tied", [False, True])
def test_fp16_gradients_are_as_accurate_as_transformers(tmp_path, tied):
    torch.manual_seed(5)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=tied)
    d = tmp_path / "model"
    transformers.LlamaForCausalLM(cfg).save_pretrained(d)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 128, (4, 40), generator=g)
    labels = ids.clone()
    labels[:, :5] = -100
    write_inputs(tmp_path / "in.safetensors", ids, labels)
    truth = grads_hf(d, torch.float64, ids, labels, 1.0)
    ref16 = grads_hf(d, torch.float16, ids, labels, SCALE)
    ours16 = run_check(d, tmp_path / "in.safetensors", tmp_path / "o16.safetensors", "--dtype", "fp16",
                       "--loss-scale", SCALE)
    ours32 = run_check(d, tmp_path / "in.safetensors", tmp_path / "o32.safetensors")
    report = []
    for name, t in truth.items():
        norm = t.norm().item()
        e_ref = (ref16[name] - t).norm().item() / norm
        e_ours = (ours16["grad/" + name].double() - t).norm().item() / norm
        e_32 = (ours32["grad/" + name].double() - t).norm().item() / norm
        report.append(f"{name}: transformers fp16 {e_ref:.2e}, engine fp16 {e_ours:.2e}, engine fp32 {e_32:.1e}")
        assert e_32 < 1e-5, report[-1]  # the comparison itself is exact
        assert e_ours <= 1.25 * e_ref and e_ours <= 16 * U16, report[-1]
    print("\n".join(report))
