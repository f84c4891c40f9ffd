#!/usr/bin/env python3
"""How far apart equally accurate bf16 trainings of qwen2 land on its q/k biases, measured with
test_families_gpu.py's own statistic: weights after 8 steps, each tensor's distance to a float64
run over transformers' eager bf16 run's distance, bound 1.25 + 4 / sqrt(k) (bench/engine/
RESULTS.md, "qwen2's q/k biases").

Per seed, a tiny Qwen2 (test_families_gpu.py's dims: hidden 128, 4 layers, 4/2 heads, head_dim
32, 1-D parameters perturbed as families_testlib does), synthetic pretokenized rows (64 tokens,
the first 20 masked), 8 steps of batch 4 x 2 micro-batches, lr 1e-3, cosine, clipping at 1.0,
trained by
  truth      transformers in float64 (torch.optim.AdamW, clip_grad_norm_);
  eager      transformers in bf16, eager attention, fp32 master (families_testlib.run_reference_low:
             the test's yardstick);
  gemm       the same run through other GEMM reductions (CPU: ATen's kernels, oneDNN off; CUDA:
             no reduced-precision bf16 reductions in cuBLAS): transformers against itself;
  sdpa       transformers with attn_implementation="sdpa" (fused kernels, not centred);
  centred    (--centred, CPU) transformers with the engine's attention (k and v centred, ATen's
             CPU flash kernel), and centred_d the same with D = rowsum(dO * out) in fp32;
  engine     offloadd-train --dtype=bf16 on --device;
and prints each bias tensor's ratio (and every tensor over its bound) for each run against eager,
with the participation ratio (sum e^2)^2 / sum e^4 of eager's error: how many elements carry it.

    python3 bench/engine/qk_bias_parity.py --build build [--seeds 0-3] [--tied] [--centred]
    python3 bench/engine/qk_bias_parity.py --build /tmp/gpu-build --device cuda --seeds 0-3
"""
import argparse
import json
import math
import pathlib
import random
import sys
import tempfile

import torch
import transformers

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python" / "engine"))
sys.path.insert(0, str(ROOT / "tests" / "python" / "trainer"))
from families_testlib import load_checkpoint, run_reference, run_reference_low  # noqa: E402
from pipeline_testlib import build_tokenizer, run_train  # noqa: E402

STEPS, BATCH, ACCUM, SEQ, VOCAB = 8, 4, 2, 64, 300  # VOCAB: build_tokenizer's
OPTIM = dict(lr=1e-3, weight_decay=0.1, max_grad_norm=1.0, scheduler="cosine", warmup_steps=2)


def build(out: pathlib.Path, seed: int, tied: bool) -> None:
    cfg = transformers.Qwen2Config(
        vocab_size=VOCAB, bos_token_id=0, eos_token_id=1, pad_token_id=VOCAB - 1, hidden_size=128,
        intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=128, tie_word_embeddings=tied, use_sliding_window=False,
        attention_dropout=0.0)
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1 or n.endswith("_norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out, safe_serialization=True)
    build_tokenizer(out / "tokenizer.json")  # offloadd-train reads one; the rows are token ids
    rng = random.Random(seed)
    rows = []
    for _ in range(BATCH * ACCUM * STEPS):
        ids = [rng.randrange(2, VOCAB - 1) for _ in range(SEQ)]
        rows.append(json.dumps({"input_ids": ids, "labels": [-100] * 20 + ids[20:]}))
    (out / "data.jsonl").write_text("\n".join(rows) + "\n")


def reference(model_dir, batches, dtype, attn="eager", device="cpu", other_gemm=False):
    """other_gemm: the same bf16 arithmetic through other GEMM reductions (the CPU: ATen's own
    kernels instead of oneDNN's; CUDA: cuBLAS without reduced-precision bf16 reductions)."""
    torch.backends.mkldnn.enabled = not other_gemm
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = not other_gemm
    load = lambda dt: transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=dt, attn_implementation=attn).to(device)
    if dtype == torch.float64:
        m = load(torch.float64)
        run_reference(m, batches, **OPTIM)
    else:
        m, low = load(torch.float32), load(dtype)
        run_reference_low(m, low, batches, **OPTIM)
    return {n: p.detach().double().cpu() for n, p in m.named_parameters()}


class CentredFlash(torch.autograd.Function):
    """The engine's plain-row attention (engine/ops.cc Attention / AttentionBackward) on the CPU:
    ATen's flash kernel on k and v less their sequence means (fp32, rounded once), the values'
    mean added back, the means constants of the backward. d_fp32: the backward's D = rowsum(dO *
    out) taken from an fp32 forward's output instead of the bf16 one (dS += P * delta, delta the
    two D's difference: dq += scale * delta * attention(q, k, k), dk += scale * P^T (delta * q))."""

    @staticmethod
    def forward(ctx, q, k, v, scale, rep, d_fp32):
        km, vm = k.float().mean(2, keepdim=True), v.float().mean(2, keepdim=True)
        kc = (k.float() - km).to(k.dtype).repeat_interleave(rep, 1)
        vc = (v.float() - vm).to(v.dtype).repeat_interleave(rep, 1)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, kc, vc, 0.0, True, attn_mask=None, scale=scale)
        ctx.save_for_backward(q, kc, vc, out, lse)
        ctx.scale, ctx.rep, ctx.d_fp32 = scale, rep, d_fp32
        return (out.float() + vm.repeat_interleave(rep, 1)).to(q.dtype)

    @staticmethod
    def backward(ctx, do):
        q, kc, vc, out, lse = ctx.saved_tensors
        s, rep = ctx.scale, ctx.rep
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        flash_bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
        dq, dk, dv = flash_bwd(do.contiguous(), q, kc, vc, out, lse, 0.0, True, attn_mask=None,
                               scale=s)
        if ctx.d_fp32:
            q32, k32, v32, do32 = q.float(), kc.float(), vc.float(), do.float()
            o32, l32 = flash(q32, k32, v32, 0.0, True, attn_mask=None, scale=s)
            delta = (do32 * (out.float() - o32)).sum(-1, keepdim=True)  # D_kernel - D_fp32
            mean_key = flash(q32, k32, k32, 0.0, True, attn_mask=None, scale=s)[0]
            pt = flash_bwd((delta * q32).contiguous(), q32, k32, v32, o32, l32, 0.0, True,
                           attn_mask=None, scale=s)[2]  # P^T (delta * q)
            dq = (dq.float() + s * delta * mean_key).to(q.dtype)
            dk = (dk.float() + s * pt).to(q.dtype)
        b, h, t, d = dk.shape
        dk = dk.view(b, h // rep, rep, t, d).sum(2)
        dv = dv.view(b, h // rep, rep, t, d).sum(2)
        return dq, dk, dv, None, None, None


def register_centred():
    from transformers import AttentionInterface

    def attn(d_fp32):
        def fn(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
            out = CentredFlash.apply(query, key, value, scaling, module.num_key_value_groups, d_fp32)
            return out.transpose(1, 2).contiguous(), None
        return fn
    AttentionInterface.register("centred", attn(False))
    AttentionInterface.register("centred_d", attn(True))


def reference_gemm_defaults():
    torch.backends.mkldnn.enabled = True
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--seeds", default="0-3")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--centred", action="store_true",
                    help="also transformers with the engine's centred flash attention (CPU)")
    a = ap.parse_args()
    if a.centred and a.device != "cpu":
        ap.error("--centred runs ATen's CPU flash kernel: --device cpu only")
    register_centred()
    lo, _, hi = a.seeds.partition("-")
    seeds = range(int(lo), int(hi or lo) + 1)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    over = {k: 0 for k in ("engine", "sdpa", "gemm", "centred", "centred_d")}
    for seed in seeds:
        with tempfile.TemporaryDirectory() as tmp:
            d = pathlib.Path(tmp)
            build(d / "model", seed, a.tied)
            out = d / "out"
            out.mkdir()
            args = [f"--model={d / 'model'}", f"--data={d / 'model' / 'data.jsonl'}",
                    "--format=pretokenized", f"--max-seq-length={SEQ}", "--dtype=bf16",
                    f"--device={a.device}", f"--batch-size={BATCH}", f"--grad-accum={ACCUM}",
                    f"--max-steps={STEPS}", f"--lr={OPTIM['lr']}",
                    f"--weight-decay={OPTIM['weight_decay']}",
                    f"--max-grad-norm={OPTIM['max_grad_norm']}", f"--scheduler={OPTIM['scheduler']}",
                    f"--warmup-steps={OPTIM['warmup_steps']}", "--seed=5", "--workers=1x2",
                    "--speculate=never", "--device-optimizer-blocks=0", f"--output-dir={out}",
                    f"--dump-batches={out}/batches.json"]
            run_train(pathlib.Path(a.build), args)
            batches = json.loads((out / "batches.json").read_text())
            truth = reference(d / "model", batches, torch.float64, device=a.device)
            runs = {"eager": reference(d / "model", batches, torch.bfloat16, "eager", a.device),
                    "sdpa": reference(d / "model", batches, torch.bfloat16, "sdpa", a.device)}
            if a.centred:  # the engine's attention inside transformers' model, D as is / fp32
                runs["centred"] = reference(d / "model", batches, torch.bfloat16, "centred")
                runs["centred_d"] = reference(d / "model", batches, torch.bfloat16, "centred_d")
            runs["gemm"] = reference(d / "model", batches, torch.bfloat16, "eager", a.device,
                                     other_gemm=True)
            reference_gemm_defaults()
            runs["engine"] = {k: v.double() for k, v in load_checkpoint(out).items()}
            for name, t64 in truth.items():
                if name not in runs["eager"]:
                    continue
                e_ref = (runs["eager"][name] - t64).norm().item()
                bound = 1.25 + 4 / math.sqrt(t64.numel())
                cells = []
                for side in ("engine", "sdpa", "gemm", "centred", "centred_d"):
                    if side not in runs or name not in runs[side]:
                        continue
                    r = (runs[side][name] - t64).norm().item() / max(e_ref, 1e-30)
                    over[side] += r > bound
                    cells.append(f"{side}/eager {r:.2f}{' OVER' if r > bound else ''}")
                # The error's effective number of elements (participation ratio
                # (sum e^2)^2 / sum e^4): the bound's 4 / sqrt(k) assumes all k contribute.
                e = (runs["eager"][name] - t64) ** 2
                cells.append(f"k_eff eager {(e.sum() ** 2 / (e ** 2).sum()).item():.1f} of {e.numel()}")
                if name.endswith("bias") or any("OVER" in c for c in cells):
                    print(f"seed {seed} {name:38s} bound {bound:.2f}  " + "  ".join(cells), flush=True)
    print(f"tensors over their bound in {len(seeds)} seeds ({'tied' if a.tied else 'untied'}): "
          + ", ".join(f"{k}/eager {v}" for k, v in over.items()))


if __name__ == "__main__":
    main()
