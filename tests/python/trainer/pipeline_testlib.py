"""Helpers for the pipeline tests: tiny models, data, running offloadd-train, and the plain
PyTorch reference training loop (transformers model + torch.optim.AdamW + clip_grad_norm_)."""

import json
import pathlib
import random
import subprocess

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers

VOCAB = 300


def build_tokenizer(path: pathlib.Path) -> None:
    """A byte-level BPE tokenizer with VOCAB entries, trained on a few sentences."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = ["the quick brown fox jumps over the lazy dog", "offloaded training of language models",
            "weights stream to the gpu and gradients flow back"] * 20
    tok.train_from_iterator(text, trainer)
    tok.save(str(path))


def build_model(out: pathlib.Path, *, tied: bool = False, layers: int = 2, seed: int = 0) -> pathlib.Path:
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=layers, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=256,
                                   tie_word_embeddings=tied, eos_token_id=0, bos_token_id=0)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg)
    model.save_pretrained(out, safe_serialization=True)
    build_tokenizer(out / "tokenizer.json")
    return out


def write_pretokenized(path: pathlib.Path, n: int = 64, seed: int = 1) -> pathlib.Path:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            length = rng.randint(6, 40)
            ids = [rng.randrange(1, VOCAB) for _ in range(length)]
            labels = [i if rng.random() > 0.2 else -100 for i in ids]  # some masked tokens
            f.write(json.dumps({"input_ids": ids, "labels": labels}) + "\n")
    return path


def run_train(binary_dir: pathlib.Path, args: list[str], timeout: int = 600,
              check: bool = True) -> subprocess.CompletedProcess:
    cmd = [str(binary_dir / "trainer" / "offloadd-train"), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"{' '.join(cmd)}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r


def read_stats(path: pathlib.Path, steps_only: bool = True) -> list[dict]:
    """--stats-jsonl records: the optimizer steps' (with "loss"), or every record (evaluations and
    LSP projector checks have their own)."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if "loss" in r] if steps_only else records


def micro_batch_loss(model, m: dict, trained: int):
    """One dumped micro-batch's summed token loss over the step's trained-token count, as the
    pipeline normalises it."""
    b, t = m["batch"], m["seq"]
    dev = next(model.parameters()).device
    ids = torch.tensor(m["input_ids"], device=dev).view(b, t)
    pos = torch.tensor(m["position_ids"], device=dev).view(b, t)
    targets = torch.tensor(m["targets"], device=dev).view(b, t)
    logits = model(input_ids=ids, position_ids=pos).logits
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # HF: the loss in fp32
    return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                             ignore_index=-100, reduction="sum") / max(1, trained)


def reference_train(model_dir: pathlib.Path, batches: list, *, lr: float, weight_decay: float,
                    max_grad_norm: float, scheduler: str, warmup_steps: int,
                    betas=(0.9, 0.999), eps=1e-8, loss_fn=None) -> tuple[list[float], dict]:
    """Plain PyTorch training on the batches offloadd-train consumed (--dump-batches).
    loss_fn(model, micro_batch, trained) defaults to micro_batch_loss."""
    loss_fn = loss_fn or micro_batch_loss
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                              attn_implementation="eager")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                            fused=True)
    losses = train_steps(model, batches, opt, scheduler, warmup_steps, max_grad_norm, loss_fn)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_steps(model, batches: list, opt, scheduler: str, warmup_steps: int, max_grad_norm: float,
                loss_fn=None) -> list[float]:
    """The reference loop of the trainer's and the engine's parity tests (families_testlib): per
    step of dumped micro-batches, each one's loss over the step's trained tokens backward,
    clip_grad_norm_ when max_grad_norm > 0 (parameters without a gradient, e.g. a vision tower,
    are left out), `opt`, transformers' scheduler. Returns the per-step losses."""
    loss_fn = loss_fn or micro_batch_loss
    params = [p for g in opt.param_groups for p in g["params"]]
    sched = transformers.get_scheduler(scheduler, opt, num_warmup_steps=warmup_steps,
                                       num_training_steps=len(batches))
    losses = []
    for step in batches:
        opt.zero_grad(set_to_none=True)
        trained = sum(sum(1 for t in m["targets"] if t != -100) for m in step)
        total = 0.0
        for m in step:
            loss = loss_fn(model, m, trained)
            loss.backward()
            total += loss.item()
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_grad_norm)
        opt.step()
        sched.step()
        losses.append(total)
    return losses


def reference_train_fp16(model_dir: pathlib.Path, batches: list, *, lr: float, weight_decay: float,
                         max_grad_norm: float, scheduler: str, warmup_steps: int, init_scale: float,
                         growth_interval: int, growth_factor: float = 2.0,
                         backoff_factor: float = 0.5) -> dict:
    """fp16 compute with fp32 master weights, as offloadd-train --dtype=fp16 does it: a model.half()
    copy runs forward/backward on the loss scaled by the real torch.amp.GradScaler, its fp16
    gradients are summed over micro-batches in fp32 into the master's .grad, then GradScaler's
    unscale_ / clip_grad_norm_ / step (skipped on inf/NaN) / update, and the scheduler steps only
    when the optimizer did (HF Trainer: `if not optimizer_step_was_skipped`). The fp16 copy is
    refreshed from the master after every step. Returns per-step losses, the loss scale each step
    ran with, which steps were skipped, learning rates, and the final fp32 state dict."""
    torch.manual_seed(0)
    master = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                               attn_implementation="eager")
    half = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float16,
                                                             attn_implementation="eager")
    master.train()
    half.train()
    params, hparams = list(master.parameters()), list(half.parameters())
    assert len(params) == len(hparams)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    sched = transformers.get_scheduler(scheduler, opt, num_warmup_steps=warmup_steps,
                                       num_training_steps=len(batches))
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_factor=growth_factor,
                                  backoff_factor=backoff_factor, growth_interval=growth_interval)
    out = {"losses": [], "scales": [], "skipped": [], "lrs": []}
    for step in batches:
        opt.zero_grad(set_to_none=True)
        acc = [torch.zeros_like(p) for p in params]
        trained = sum(sum(1 for t in m["targets"] if t != -100) for m in step)
        total = 0.0
        scale = scaler.get_scale()
        out["lrs"].append(opt.param_groups[0]["lr"])
        for m in step:
            loss = micro_batch_loss(half, m, trained)
            scaler.scale(loss).backward()
            for a, hp in zip(acc, hparams):
                if hp.grad is not None:
                    a += hp.grad.float()
                    hp.grad = None
            total += loss.item()
        for p, a in zip(params, acc):
            p.grad = a
        scaler.unscale_(opt)
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        scaler.step(opt)
        scaler.update()
        skipped = scaler.get_scale() < scale
        if not skipped:
            sched.step()
        with torch.no_grad():
            for p, hp in zip(params, hparams):
                hp.copy_(p)
        out["losses"].append(total)
        out["scales"].append(scale)
        out["skipped"].append(bool(skipped))
    out["state"] = {k: v.detach().clone() for k, v in master.state_dict().items()}
    return out
