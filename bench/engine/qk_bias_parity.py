#!/usr/bin/env python3
"""How far apart equally accurate bf16 trainings of qwen2 land on its q/k biases, measured with
test_families_gpu.py's own statistic: weights after 8 steps, each tensor's distance to a float64
run over transformers' eager bf16 run's distance, against the bound 1.25 + 4 / sqrt(k_eff) with
k_eff the effective element count of the error predicted from the float64 run's gradients
(adamw_noise_testlib; docs/parity_bounds.md), and the former 1.25 + 4 / sqrt(k) (bench/engine/
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
and prints each bias tensor's ratio over its bound (and every tensor over either bound) for each
run against eager, with k_eff and the participation ratio (sum e^2)^2 / sum e^4 of eager's error
(one draw: for k_eff equal Gaussian elements it is ~k_eff / 3). --no-engine leaves the engine out
and makes the batches here (the rows in order), for the controls without a build.

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
from adamw_noise_testlib import GradientRecorder, bound, effective_count  # noqa: E402
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


def python_batches(model_dir):
    """The dumped batches' layout built from data.jsonl in row order (--no-engine)."""
    rows = [json.loads(r) for r in (model_dir / "data.jsonl").read_text().splitlines()]
    steps = []
    for s in range(STEPS):
        micro = []
        for a in range(ACCUM):
            ids, targets = [], []
            for r in rows[(s * ACCUM + a) * BATCH:(s * ACCUM + a + 1) * BATCH]:
                ids += r["input_ids"]
                targets += r["labels"][1:] + [-100]
            micro.append(dict(batch=BATCH, seq=SEQ, input_ids=ids, targets=targets,
                              position_ids=list(range(SEQ)) * BATCH))
        steps.append(micro)
    return steps


def reference(model_dir, batches, dtype, attn="eager", device="cpu", other_gemm=False,
              record=None):
    """other_gemm: the same bf16 arithmetic through other GEMM reductions (the CPU: ATen's own
    kernels instead of oneDNN's; CUDA: cuBLAS without reduced-precision bf16 reductions).
    record: a GradientRecorder for the optimizer."""
    torch.backends.mkldnn.enabled = not other_gemm
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = not other_gemm
    load = lambda dt: transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=dt, attn_implementation=attn).to(device)
    if dtype == torch.float64:
        m = load(torch.float64)
        run_reference(m, batches, **OPTIM, record=record)
    else:
        m, low = load(torch.float32), load(dtype)
        run_reference_low(m, low, batches, **OPTIM, record=record)
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


def train_engine(build_dir, model_dir, out, device):
    """offloadd-train on the variant; returns the batches it dumped."""
    out.mkdir()
    args = [f"--model={model_dir}", f"--data={model_dir / 'data.jsonl'}", "--format=pretokenized",
            f"--max-seq-length={SEQ}", "--dtype=bf16", f"--device={device}",
            f"--batch-size={BATCH}", f"--grad-accum={ACCUM}", f"--max-steps={STEPS}",
            f"--lr={OPTIM['lr']}", f"--weight-decay={OPTIM['weight_decay']}",
            f"--max-grad-norm={OPTIM['max_grad_norm']}", f"--scheduler={OPTIM['scheduler']}",
            f"--warmup-steps={OPTIM['warmup_steps']}", "--seed=5", "--workers=1x2",
            "--speculate=never", "--device-optimizer-blocks=0", f"--output-dir={out}",
            f"--dump-batches={out}/batches.json"]
    run_train(pathlib.Path(build_dir), args)
    return json.loads((out / "batches.json").read_text())


SIDES = ("engine", "sdpa", "gemm", "centred", "centred_d")


def report(seed, truth, runs, rec64, rec_eager, over):
    """Per tensor: each run's ratio against eager over the k_eff bound (and the former k bound);
    bias tensors always, others when over either bound. Counts tensors over into `over`."""
    for name, t64 in truth.items():
        if name not in runs["eager"]:
            continue
        e_ref = (runs["eager"][name] - t64).norm().item()
        ratios = {side: (runs[side][name] - t64).norm().item() / max(e_ref, 1e-30)
                  for side in SIDES if side in runs and name in runs[side]}
        b_old = bound(t64.numel())
        if not name.endswith("bias") and max(ratios.values()) <= b_old:
            continue  # within the k bound, so within the k_eff one (k_eff <= k): not printed
        k_eff = effective_count(rec64, rec_eager, name)
        b_new = bound(k_eff)
        cells = []
        for side, r in ratios.items():
            over[side][0] += r > b_new
            over[side][1] += r > b_old
            cells.append(f"{side} {r:.2f} = {r / b_new:.2f}x{' OVER' if r > b_new else ''}"
                         f"{' (over k bound)' if r > b_old else ''}")
        e = (runs["eager"][name] - t64) ** 2
        cells.append(f"eager's error PR {(e.sum() ** 2 / (e ** 2).sum()).item():.1f}")
        if name.endswith("bias") or any("over" in c.lower() for c in cells):
            print(f"seed {seed} {name:38s} k {t64.numel():5d} k_eff {k_eff:5.1f} bound "
                  f"{b_new:.2f} (k: {b_old:.2f})  " + "  ".join(cells), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--seeds", default="0-3")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--centred", action="store_true",
                    help="also transformers with the engine's centred flash attention (CPU)")
    ap.add_argument("--no-engine", action="store_true",
                    help="transformers' runs only, on batches made here (no build needed)")
    a = ap.parse_args()
    if a.centred and a.device != "cpu":
        ap.error("--centred runs ATen's CPU flash kernel: --device cpu only")
    register_centred()
    lo, _, hi = a.seeds.partition("-")
    seeds = range(int(lo), int(hi or lo) + 1)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    over = {k: [0, 0] for k in SIDES}
    for seed in seeds:
        with tempfile.TemporaryDirectory() as tmp:
            d = pathlib.Path(tmp)
            build(d / "model", seed, a.tied)
            out = d / "out"
            batches = (python_batches(d / "model") if a.no_engine
                       else train_engine(a.build, d / "model", out, a.device))
            rec64 = GradientRecorder()
            truth = reference(d / "model", batches, torch.float64, device=a.device, record=rec64)
            rec_eager = GradientRecorder(against=rec64)
            runs = {"eager": reference(d / "model", batches, torch.bfloat16, "eager", a.device,
                                       record=rec_eager),
                    "sdpa": reference(d / "model", batches, torch.bfloat16, "sdpa", a.device)}
            if a.centred:  # the engine's attention inside transformers' model, D as is / fp32
                runs["centred"] = reference(d / "model", batches, torch.bfloat16, "centred")
                runs["centred_d"] = reference(d / "model", batches, torch.bfloat16, "centred_d")
            runs["gemm"] = reference(d / "model", batches, torch.bfloat16, "eager", a.device,
                                     other_gemm=True)
            reference_gemm_defaults()
            if not a.no_engine:
                runs["engine"] = {k: v.double() for k, v in load_checkpoint(out).items()}
            report(seed, truth, runs, rec64, rec_eager, over)
    print(f"tensors over their bound in {len(seeds)} seeds ({'tied' if a.tied else 'untied'}), "
          "k_eff bound (former k bound): "
          + ", ".join(f"{k}/eager {v[0]} ({v[1]})" for k, v in over.items() if k in runs))


if __name__ == "__main__":
    main()
