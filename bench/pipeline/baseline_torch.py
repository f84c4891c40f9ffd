#!/usr/bin/env python3
"""PyTorch eager baseline for full fine-tuning on one GPU: a transformers Llama with fp32
master weights, fused AdamW, gradient and optimizer states all in GPU memory, gradient
checkpointing and bf16 autocast. The offloaded pipeline is compared against these figures.

    # GPU machine (llama2-7b needs ~16 bytes/parameter = ~108 GB: an H200, not an H100):
    ~/.cache/offloadd/venv/bin/python bench/pipeline/baseline_torch.py --shape tinyllama-1.1b --batch 1,2,4,8
    # CPU smoke run:
    ~/.cache/offloadd/venv/bin/python bench/pipeline/baseline_torch.py --shape tiny --device cpu --steps 2

One step = --grad-accum micro-batches of [batch, seq] random tokens (seeded), forward under
torch.autocast(bf16) with labels = inputs, backward, clip_grad_norm_(1.0), AdamW step. Model
random-initialised from the shape's config (weights do not change the speed). Times are means over
--steps after --warmup steps, with device syncs around each step. Each batch size runs in turn in
one process; a batch that runs out of memory is reported as "oom" and the next one still runs.
Prints a Markdown table; --json also writes all rows.

Model FLOPs follow offloadd's engine (Block::EstimateCost): per token and layer
2*h*(2*q_dim + 2*kv_dim + 3*ffn) plus causal attention 2*heads*seq*head_dim, plus the LM head
2*h*vocab; times 3 for forward + backward; recomputation is not counted (model FLOPs, as in MFU).
A mixture-of-experts layer counts its active FLOPs: the router 2*h*experts plus top_k experts of
2*h*3*expert_ffn per token (olmoe-1b-7b, qwen3-30b-a3b; MoePart::Flops).

Several GPUs (--parallel ddp|fsdp2, one rank per GPU; --nproc N spawns the N ranks
itself with torch.multiprocessing, rendezvous through a file, no port to pick):

    # DistributedDataParallel: every GPU holds the whole model, its gradients and fp32 AdamW states
    # (16 bytes/parameter: llama2-7b fits only on 141 GB cards):
    python3 bench/pipeline/baseline_torch.py --parallel ddp --nproc 2 --shape llama2-7b --batch 4
    # FSDP2 (fully_shard per decoder layer, then the root; fp32 master parameters, bf16 compute
    # through MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)):
    python3 bench/pipeline/baseline_torch.py --parallel fsdp2 --nproc 2 --shape llama2-7b --batch 4
    # the same under torchrun (then --nproc is ignored; torchrun's environment gives the ranks):
    torchrun --standalone --nproc_per_node=2 bench/pipeline/baseline_torch.py --parallel fsdp2 --batch 4
    # CPU smoke runs (gloo; FSDP2 and DDP both run on CPU in torch 2.11):
    ~/.cache/offloadd/venv/bin/python bench/pipeline/baseline_torch.py --device cpu --shape tiny \
        --parallel ddp --nproc 2 --steps 2
    ~/.cache/offloadd/venv/bin/python bench/pipeline/baseline_torch.py --device cpu --shape tiny \
        --parallel fsdp2 --nproc 2 --steps 2

With --parallel, --batch is the micro-batch per GPU: the global batch is batch x world. Every rank
draws the same global [batch x world, seq] tokens from the seeded generator and trains on its rows,
so N ranks at batch B see the data of one GPU at batch N x B. DDP: the model built on each GPU from
the same seed, DistributedDataParallel(gradient_as_bucket_view=True), bf16 autocast as on one GPU,
no_sync() on all but the last micro-batch of a step, fused AdamW, clip_grad_norm_(1.0). FSDP2: the
model built on each GPU from the same seed and then sharded (the full fp32 copy is freed by the
sharding), bf16 autocast around the forward as on one GPU, the gradient norm of the DTensor
gradients made whole (get_total_norm + full_tensor) and clip_grads_with_norm_(1.0), fused AdamW on
the fp32 shards. Gradient checkpointing as on one GPU. Each step is timed on rank 0 between two
barriers (device sync + a one-element all-reduce), so a step ends when the slowest rank ends.
Reported: tokens/s of the whole group (batch x world x seq x grad-accum per step) and per GPU,
model TFLOP/s and MFU per GPU, the peak memory of every rank (torch.cuda.max_memory_allocated,
reset once the model is built and sharded) and the loss averaged over the ranks. A batch that
runs out of memory on any rank is reported as "oom" (the ranks agree through an all-reduce) and
the next batch runs. NCCL_NVLS_ENABLE defaults to 0 (NVLink SHARP multicast stays off).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import platform
import sys
import tempfile
import time

# NVLink SHARP (NVLS) multicast stays off unless the caller says otherwise; set before NCCL starts.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import transformers  # noqa: E402

SHAPES = {
    "llama2-7b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, intermediate_size=11008, vocab_size=32000),
    # Issue #31: Meta-Llama-3-8B's shape (GQA 32/8, vocab 128,256; RoPE base as the Llama shapes).
    "llama3-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, intermediate_size=14336, vocab_size=128256),
    # LLaMA-30B's shape (60 x 6656, ffn 17920, 52 heads, vocab 32,000: 32.5B parameters).
    "llama-30b": dict(hidden_size=6656, num_hidden_layers=60, num_attention_heads=52,
                      num_key_value_heads=52, intermediate_size=17920, vocab_size=32000),
    "tinyllama-1.1b": dict(hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
                           num_key_value_heads=4, intermediate_size=5632, vocab_size=32000),
    # Issue #30: the shapes of Qwen3-4B, Qwen3-8B and Gemma 3 4B's language model (the text_config
    # of google/gemma-3-4b-it; the 0.4B SigLIP tower is not trained). FAMILIES below holds the rest
    # of their config.json.
    "qwen3-4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, intermediate_size=9728, vocab_size=151936),
    "qwen3-8b": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, intermediate_size=12288, vocab_size=151936),
    "gemma3-4b": dict(hidden_size=2560, num_hidden_layers=34, num_attention_heads=8,
                      num_key_value_heads=4, head_dim=256, intermediate_size=10240, vocab_size=262208),
    # Mixtures of experts: allenai/OLMoE-1B-7B-0924 (6.9B total, 1.3B active) and Qwen/Qwen3-30B-A3B
    # (30.5B total, 3.3B active); FAMILIES below holds their expert and router fields.
    "olmoe-1b-7b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=16,
                        num_key_value_heads=16, intermediate_size=1024, vocab_size=50304),
    "qwen3-30b-a3b": dict(hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, intermediate_size=6144,
                          vocab_size=151936),
    # A Qwen3-MoE of 4 experts (top-2) at the tiny shape: CPU smoke runs of the MoE paths only.
    "tiny-moe": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=32, intermediate_size=344, vocab_size=2048),
    # About 1M parameters (4 MB in fp32): for CPU smoke runs only.
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=344, vocab_size=2048),
}
# Issue #31: Llama-3-8B's shape with more layers (llama3-36l ... llama3-48l), for the largest model
# that RAM plus disk hold (218 M parameters per layer; 40 layers: 9.77 B).
SHAPES.update({f"llama3-{n}l": dict(SHAPES["llama3-8b"], num_hidden_layers=n) for n in range(34, 50, 2)})
# config.json fields of the non-Llama shapes, as the released checkpoints have them (Qwen/Qwen3-4B,
# Qwen/Qwen3-8B; google/gemma-3-4b-it's text_config: sliding window 1024 on five layers of every
# six, local RoPE base 10k, global 1M with linear scaling 8, query_pre_attn_scalar 256, no soft caps).
FAMILIES = {
    "qwen3-4b": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], tie_word_embeddings=True,
                     rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=40960,
                     hidden_act="silu", bos_token_id=151643, eos_token_id=151645),
    "qwen3-8b": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], tie_word_embeddings=False,
                     rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=40960,
                     hidden_act="silu", bos_token_id=151643, eos_token_id=151645),
    "gemma3-4b": dict(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], tie_word_embeddings=True,
                      rms_norm_eps=1e-6, max_position_embeddings=131072, query_pre_attn_scalar=256,
                      sliding_window=1024, sliding_window_pattern=6, rope_theta=1000000.0,
                      rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 8.0},
                      hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=None,
                      attn_logit_softcapping=None, bos_token_id=2, eos_token_id=[1, 106], pad_token_id=0),
    "olmoe-1b-7b": dict(model_type="olmoe", architectures=["OlmoeForCausalLM"], tie_word_embeddings=False,
                        num_experts=64, num_experts_per_tok=8, norm_topk_prob=False, rope_theta=10000.0,
                        rms_norm_eps=1e-5, max_position_embeddings=4096, hidden_act="silu", clip_qkv=None,
                        router_aux_loss_coef=0.01, output_router_logits=False, pad_token_id=1,
                        bos_token_id=None, eos_token_id=50279),
    "qwen3-30b-a3b": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"],
                          tie_word_embeddings=False, num_experts=128, num_experts_per_tok=8,
                          moe_intermediate_size=768, norm_topk_prob=True, decoder_sparse_step=1,
                          mlp_only_layers=[], rope_theta=1000000.0, rms_norm_eps=1e-6,
                          max_position_embeddings=40960, hidden_act="silu", router_aux_loss_coef=0.001,
                          output_router_logits=False, bos_token_id=151643, eos_token_id=151645),
    "tiny-moe": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], tie_word_embeddings=False,
                     num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True,
                     decoder_sparse_step=1, mlp_only_layers=[], rope_theta=1000000.0, rms_norm_eps=1e-6,
                     max_position_embeddings=4096, hidden_act="silu", router_aux_loss_coef=0.001,
                     output_router_logits=False, bos_token_id=1, eos_token_id=2),
}


def hf_config_dict(shape: str, seq: int) -> dict:
    """The config.json of a shape: the Llama shapes as before (untied, RoPE base 10k), the others
    with their family's fields."""
    if shape in FAMILIES:
        d = dict(SHAPES[shape], **FAMILIES[shape])
        d["max_position_embeddings"] = max(seq, d["max_position_embeddings"])
        return d
    return dict(SHAPES[shape], model_type="llama", architectures=["LlamaForCausalLM"],
                max_position_embeddings=max(seq, 4096), rms_norm_eps=1e-5, hidden_act="silu",
                tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, rope_theta=10000.0)


def causal_lm(cfg):
    """transformers' own model class of the config's family (LlamaForCausalLM, Qwen3ForCausalLM,
    Gemma3ForCausalLM), in the default dtype (fp32)."""
    return transformers.MODEL_FOR_CAUSAL_LM_MAPPING[type(cfg)](cfg)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama2-7b")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--seq", type=int, default=1024, help="tokens per sequence (default 1024)")
    p.add_argument("--batch", default="1", help="micro-batch sizes, comma-separated (default 1)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--steps", type=int, default=5, help="timed optimizer steps (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps first (default 2)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--attn", default="sdpa", help="transformers attn_implementation (default sdpa)")
    p.add_argument("--no-checkpointing", action="store_true", help="keep all activations")
    p.add_argument("--no-autocast", action="store_true", help="run in fp32")
    p.add_argument("--peak-tflops", type=float, default=0,
                   help="peak dense bf16 TFLOP/s of the device, for MFU (H100/H200 SXM: 989)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    p.add_argument("--parallel", choices=["none", "ddp", "fsdp2"], default="none",
                   help="none (default): one process, one device; ddp or fsdp2: one rank per GPU")
    p.add_argument("--nproc", type=int, default=1,
                   help="ranks to spawn with --parallel (default 1; ignored under torchrun)")
    p.add_argument("--pg-timeout", type=int, default=600,
                   help="seconds a rank waits in a collective before the group fails (default 600)")
    args = p.parse_args(argv)
    try:
        args.batches = [int(b) for b in args.batch.split(",")]
    except ValueError:
        p.error(f"--batch: expected comma-separated integers, got {args.batch!r}")
    for name in ("seq", "grad_accum", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0 or any(b < 1 for b in args.batches):
        p.error("--warmup must be >= 0 and every --batch >= 1")
    if args.nproc < 1:
        p.error("--nproc must be at least 1")
    if args.parallel == "none" and (args.nproc > 1 or (under_torchrun() and int(os.environ["WORLD_SIZE"]) > 1)):
        p.error("--nproc N / torchrun need --parallel ddp or fsdp2")
    if args.parallel != "none" and args.device.startswith("cuda:"):
        p.error("--parallel gives rank r the GPU cuda:<local rank>: use --device cuda (and CUDA_VISIBLE_DEVICES)")
    return args


def model_config(args) -> transformers.PretrainedConfig:
    d = hf_config_dict(args.shape, args.seq)
    d.pop("architectures")
    cfg = transformers.AutoConfig.for_model(d.pop("model_type"), **d, use_cache=False)
    cfg._attn_implementation = args.attn
    return cfg


def num_experts(cfg) -> int:
    """Routed experts per sparse layer (0: a dense model)."""
    return getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None) or 0


def layer_is_sparse(cfg, i: int) -> bool:
    """Whether layer i has the mixture-of-experts feed-forward (Qwen3-MoE's decoder_sparse_step
    and mlp_only_layers; OLMoE and Mixtral: every layer)."""
    if not num_experts(cfg) or i in (getattr(cfg, "mlp_only_layers", None) or []):
        return False
    return (i + 1) % (getattr(cfg, "decoder_sparse_step", None) or 1) == 0


def ffn_flops_per_token(cfg, i: int) -> float:
    """Forward FLOPs of layer i's feed-forward per token: the dense SwiGLU, or the router plus the
    top-k experts each token computes (the active expert FLOPs, as offloadd's MoePart::Flops)."""
    h = cfg.hidden_size
    if not layer_is_sparse(cfg, i):
        return 2 * h * 3 * cfg.intermediate_size
    inter = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    return 2 * h * num_experts(cfg) + 2 * h * 3 * inter * cfg.num_experts_per_tok


def model_flops_per_step(cfg, batch: int, seq: int) -> float:
    h, heads, kv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or h // heads
    q_dim, kv_dim = heads * head_dim, kv * head_dim
    tokens = batch * seq
    layers = 0.0
    for i in range(cfg.num_hidden_layers):
        layers += 2 * tokens * h * (2 * q_dim + 2 * kv_dim) + tokens * ffn_flops_per_token(cfg, i) \
            + 2 * batch * heads * seq * seq * head_dim  # causal attention: half of QK^T and PV
    head = 2 * tokens * h * cfg.vocab_size
    return 3.0 * (layers + head)


def sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_batch(args, cfg, device: torch.device, batch: int) -> dict:
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = causal_lm(cfg)  # fp32 parameters: the master weights
    model.train()
    if not args.no_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        assert model.is_gradient_checkpointing, "transformers did not enable gradient checkpointing"
    if device.type == "cuda":
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, fused=True)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, foreach=True)
    gen = torch.Generator().manual_seed(args.seed)

    def step():
        loss_sum = 0.0
        for _ in range(args.grad_accum):
            ids = torch.randint(0, cfg.vocab_size, (batch, args.seq), generator=gen).to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=not args.no_autocast):
                loss = model(input_ids=ids, labels=ids).loss / args.grad_accum
            loss.backward()
            loss_sum += loss.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss_sum, grad_norm

    for _ in range(args.warmup):
        step()
    sync(device)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss, grad_norm = step()
        sync(device)
        times.append(time.perf_counter() - t0)

    step_s = sum(times) / len(times)
    tokens = batch * args.seq * args.grad_accum
    flops = model_flops_per_step(cfg, batch, args.seq) * args.grad_accum
    row = {"status": "ok", "batch": batch, "grad_accum": args.grad_accum, "seq": args.seq,
           "tokens_per_step": tokens, "step_s": step_s, "step_s_min": min(times),
           "step_s_max": max(times), "tokens_per_s": tokens / step_s,
           "model_tflops_per_s": flops / step_s / 1e12, "loss": float(loss),
           "grad_norm": float(grad_norm)}
    if args.peak_tflops > 0:
        row["mfu"] = row["model_tflops_per_s"] / args.peak_tflops
    if device.type == "cuda":
        row["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        row["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    return row


def release(device: torch.device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def gib(n) -> str:
    return f"{n / 2**30:.1f}" if n is not None else "-"


def print_row(r: dict):
    if r["status"] != "ok":
        print(f"| {r['batch']} | {r['grad_accum']} | {r['status']} | - | - | - | - | - |", flush=True)
        return
    mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else "-"
    print(f"| {r['batch']} | {r['grad_accum']} | {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | "
          f"{r['model_tflops_per_s']:.3g} | {mfu} | {gib(r.get('peak_allocated_bytes'))} | "
          f"{r['loss']:.3f} |", flush=True)


# ---------------------------------------------------------------------------------------------
# Several ranks: --parallel ddp | fsdp2 (the data-parallel baseline).

def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def group_barrier(device: torch.device):
    """Every rank's queued work done, then a one-element all-reduce: on return every rank is here."""
    import torch.distributed as dist
    sync(device)
    t = torch.zeros(1, device=device)
    dist.all_reduce(t)
    sync(device)


def run_batch_parallel(args, cfg, device: torch.device, batch: int, rank: int, world: int) -> dict:
    import torch.distributed as dist
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    with torch.device(device):
        model = causal_lm(cfg)  # fp32 parameters: the master weights
    model.train()
    if not args.no_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        assert model.is_gradient_checkpointing, "transformers did not enable gradient checkpointing"
    if args.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        forward = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                          gradient_as_bucket_view=True, broadcast_buffers=False)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mesh = init_device_mesh(device.type, (world,))
        mp = MixedPrecisionPolicy() if args.no_autocast else \
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        forward = model
    params = list(model.parameters())  # after fully_shard: the fp32 shards (DTensors)
    if device.type == "cuda":
        opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, fused=True)
        gc.collect()
        torch.cuda.empty_cache()  # the full copy fully_shard freed
        torch.cuda.reset_peak_memory_stats(device)
    else:
        opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, foreach=True)
    gen = torch.Generator().manual_seed(args.seed)

    def grad_norm_and_clip():
        if args.parallel == "ddp":  # the gradients are already averaged over the ranks: whole
            return torch.nn.utils.clip_grad_norm_(params, 1.0)
        from torch.distributed.tensor import DTensor
        grads = [p.grad for p in params if p.grad is not None]
        total = torch.nn.utils.get_total_norm(grads, 2.0)
        if isinstance(total, DTensor):  # partial norms of the shards: reduced over the ranks
            total = total.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, 1.0, total)
        return total

    def step():
        loss_sum = torch.zeros((), device=device)
        for a in range(args.grad_accum):
            # The global micro-batch, the same on every rank; this rank trains on its rows.
            ids = torch.randint(0, cfg.vocab_size, (batch * world, args.seq), generator=gen)
            ids = ids[rank * batch:(rank + 1) * batch].to(device)
            last = a == args.grad_accum - 1
            ctx = forward.no_sync() if args.parallel == "ddp" and not last else contextlib.nullcontext()
            with ctx:
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=not args.no_autocast):
                    loss = forward(input_ids=ids, labels=ids).loss / args.grad_accum
                loss.backward()
            loss_sum += loss.detach().float()
        grad_norm = grad_norm_and_clip()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss_sum, grad_norm

    for _ in range(args.warmup):
        step()
    group_barrier(device)
    times = []
    for _ in range(args.steps):
        group_barrier(device)
        t0 = time.perf_counter()
        loss, grad_norm = step()
        group_barrier(device)
        times.append(time.perf_counter() - t0)

    dist.all_reduce(loss)  # the ranks' mean losses: their mean is the global batch's loss
    loss = float(loss) / world
    step_s = sum(times) / len(times)
    tokens = batch * world * args.seq * args.grad_accum
    flops = model_flops_per_step(cfg, batch * world, args.seq) * args.grad_accum
    row = {"status": "ok", "parallel": args.parallel, "world": world, "batch": batch,
           "global_batch": batch * world, "grad_accum": args.grad_accum, "seq": args.seq,
           "tokens_per_step": tokens, "step_s": step_s, "step_s_min": min(times),
           "step_s_max": max(times), "tokens_per_s": tokens / step_s,
           "tokens_per_s_per_gpu": tokens / step_s / world,
           "model_tflops_per_s": flops / step_s / 1e12,
           "model_tflops_per_s_per_gpu": flops / step_s / 1e12 / world,
           "loss": loss, "grad_norm": float(grad_norm)}
    if args.peak_tflops > 0:
        row["mfu"] = row["model_tflops_per_s_per_gpu"] / args.peak_tflops
    return row


def print_row_parallel(r: dict, world: int, parallel: str):
    if r["status"] != "ok":
        print(f"| {parallel} | {world} | {r['batch']} | {r['grad_accum']} | {r['status']} | - | - | - | - | - | - |",
              flush=True)
        return
    mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else "-"
    peaks = r.get("peak_allocated_bytes_per_rank")
    peak = "/".join(gib(x) for x in peaks) if peaks else "-"
    print(f"| {parallel} | {world} | {r['batch']} | {r['grad_accum']} | {r['step_s']:.3f} | "
          f"{r['tokens_per_s']:,.0f} | {r['tokens_per_s_per_gpu']:,.0f} | "
          f"{r['model_tflops_per_s_per_gpu']:.3g} | {mfu} | {peak} | {r['loss']:.3f} |", flush=True)


def parallel_rank(local_rank: int, rank: int, world: int, args, init_method: str) -> int:
    """One rank: every batch of --batch in turn. Rank 0 prints and writes the JSON."""
    import torch.distributed as dist
    cuda = args.device.startswith("cuda")
    if cuda:
        if not torch.cuda.is_available() or torch.cuda.device_count() <= local_rank:
            print(f"error: rank {rank} needs cuda:{local_rank}, torch sees {torch.cuda.device_count()} GPUs",
                  file=sys.stderr)
            return 2
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.pg_timeout),
                            device_id=device if cuda else None)
    try:
        cfg = model_config(args)
        with torch.device("meta"):
            n_params = sum(p.numel() for p in causal_lm(cfg).parameters())
        device_name = torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu"
        env = {"shape": args.shape, "params": n_params, "device": device_name, "torch": torch.__version__,
               "transformers": transformers.__version__, "attn": args.attn,
               "checkpointing": not args.no_checkpointing, "autocast_bf16": not args.no_autocast,
               "steps": args.steps, "warmup": args.warmup, "seed": args.seed, "parallel": args.parallel,
               "world": world, "backend": backend,
               "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
               "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE")}
        if rank == 0:
            states = (16 if args.parallel == "ddp" else 16 / world) * n_params / 2**30
            print(f"# PyTorch {args.parallel} baseline: {world} ranks ({backend}), {args.shape} "
                  f"({n_params / 1e6:,.1f}M parameters, fp32 weights + grads + AdamW states = {states:.1f} GiB "
                  f"per rank), seq {args.seq}, {device_name}, torch {torch.__version__}, transformers "
                  f"{transformers.__version__}, attn {args.attn}, checkpointing "
                  f"{'on' if env['checkpointing'] else 'off'}, {'bf16' if env['autocast_bf16'] else 'fp32'} compute, "
                  f"{args.steps} steps after {args.warmup} warmup; batch is per GPU, tokens/s is the group's")
            print("| parallel | GPUs | batch/GPU | grad accum | step s | tokens/s | tokens/s/GPU | "
                  "model TFLOP/s/GPU | MFU | peak GiB per rank | loss |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)
        rows = []
        for batch in args.batches:
            release(device)
            row, oom = None, 0
            try:
                row = run_batch_parallel(args, cfg, device, batch, rank, world)
            except torch.OutOfMemoryError:
                oom = 1
            release_keep_peak(device)
            # Every rank learns whether one ran out of memory (a rank that did not sits here too:
            # the ranks run out at the same point, as they allocate alike).
            flag = torch.tensor([float(oom)], device=device)
            dist.all_reduce(flag)
            if flag.item() > 0:
                row = {"status": "oom", "parallel": args.parallel, "world": world, "batch": batch,
                       "global_batch": batch * world, "grad_accum": args.grad_accum, "seq": args.seq,
                       "oom_ranks": int(flag.item())}
            peaks = torch.tensor([float(torch.cuda.max_memory_allocated(device)),
                                  float(torch.cuda.max_memory_reserved(device))] if cuda else [0.0, 0.0],
                                 dtype=torch.float64, device=device)
            gathered = [torch.zeros_like(peaks) for _ in range(world)]
            dist.all_gather(gathered, peaks)
            if cuda and row["status"] == "ok":
                row["peak_allocated_bytes_per_rank"] = [int(g[0].item()) for g in gathered]
                row["peak_reserved_bytes_per_rank"] = [int(g[1].item()) for g in gathered]
                row["peak_allocated_bytes"] = max(row["peak_allocated_bytes_per_rank"])
                row["peak_reserved_bytes"] = max(row["peak_reserved_bytes_per_rank"])
            rows.append(row)
            if rank == 0:
                print_row_parallel(row, world, args.parallel)
        if rank == 0 and args.json:
            with open(args.json, "w") as f:
                json.dump({"env": env, "rows": rows}, f, indent=1)
        return 0 if any(r["status"] == "ok" for r in rows) else 1
    finally:
        dist.destroy_process_group()


def release_keep_peak(device: torch.device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _spawned_rank(local_rank: int, world: int, args, init_method: str, rc_path: str):
    rc = parallel_rank(local_rank, local_rank, world, args, init_method)
    if local_rank == 0:
        with open(rc_path, "w") as f:
            f.write(str(rc))


def main_parallel(args) -> int:
    if under_torchrun():
        return parallel_rank(int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]),
                             int(os.environ["WORLD_SIZE"]), args, "env://")
    if args.device.startswith("cuda") and torch.cuda.device_count() < args.nproc:
        print(f"error: --nproc {args.nproc} but torch sees {torch.cuda.device_count()} CUDA devices",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="baseline-torch-") as tmp:
        init_method = f"file://{tmp}/rendezvous"
        rc_path = os.path.join(tmp, "rc")
        if args.nproc == 1:
            return parallel_rank(0, 0, 1, args, init_method)
        import torch.multiprocessing as mp
        try:
            mp.spawn(_spawned_rank, args=(args.nproc, args, init_method, rc_path), nprocs=args.nproc, join=True)
        except mp.ProcessRaisedException as e:
            print(f"error: a rank failed: {e}", file=sys.stderr)
            return 1
        except mp.ProcessExitedException as e:
            print(f"error: a rank died: {e}", file=sys.stderr)
            return 1
        try:
            with open(rc_path) as f:
                return int(f.read().strip() or 1)
        except OSError:
            return 1


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.parallel != "none":
        return main_parallel(args)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no CUDA device (use --device cpu for a smoke run)",
              file=sys.stderr)
        return 2
    cfg = model_config(args)
    with torch.device("meta"):
        n_params = sum(p.numel() for p in causal_lm(cfg).parameters())
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    env = {"shape": args.shape, "params": n_params, "device": device_name, "torch": torch.__version__,
           "transformers": transformers.__version__, "attn": args.attn,
           "checkpointing": not args.no_checkpointing, "autocast_bf16": not args.no_autocast,
           "steps": args.steps, "warmup": args.warmup, "seed": args.seed}
    print(f"# PyTorch eager baseline: {args.shape} ({n_params / 1e6:,.1f}M parameters, fp32 weights + "
          f"grads + AdamW states = {16 * n_params / 2**30:.1f} GiB), seq {args.seq}, {device_name}, "
          f"torch {torch.__version__}, transformers {transformers.__version__}, attn {args.attn}, "
          f"checkpointing {'on' if env['checkpointing'] else 'off'}, "
          f"autocast {'bf16' if env['autocast_bf16'] else 'off'}, {args.steps} steps after "
          f"{args.warmup} warmup")
    print("| batch | grad accum | step s | tokens/s | model TFLOP/s | MFU | peak GiB | loss |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)

    rows = []
    for batch in args.batches:
        release(device)
        try:
            row = run_batch(args, cfg, device, batch)
        except torch.OutOfMemoryError:
            row = {"status": "oom", "batch": batch, "grad_accum": args.grad_accum, "seq": args.seq}
        rows.append(row)
        print_row(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=1)
    return 0 if any(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
