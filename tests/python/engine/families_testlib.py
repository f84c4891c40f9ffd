"""Tiny random-init models of every supported family, built with transformers' own
config classes, with the family's real tokenizer from ../shared/data where its vocabulary is small
enough for a CPU test, else a synthetic byte-level BPE; Alpaca records tokenized through the
tokenizer's own chat template as pretokenized training data. Shared by test_families.py (CPU, fp32)
and test_families_gpu.py (CUDA, bf16)."""

from __future__ import annotations

import json
import pathlib
import random
import shutil
import sys

import torch
import transformers
from safetensors import safe_open
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

# pipeline_testlib (the plain PyTorch reference loop, offloadd-train runner) lives with the
# trainer's tests; pytest's rootdir insertion does not put that folder on the path when this
# directory runs alone.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "trainer"))
from pipeline_testlib import micro_batch_loss, train_steps  # noqa: E402

SEQ = 64         # --max-seq-length; every document is cut to at most this
MIN_TOKENS = 40  # and has at least this many: longer than every sliding window and Phi-3's
                 # original_max_position_embeddings, so each micro-batch runs the same RoPE factors
WINDOW = 16      # sliding_window of the sliding families: a quarter of the sequence
SYNTHETIC_VOCAB = 512
# transformers' embeddings are nn.Embedding(..., padding_idx=pad_token_id): the pad row's
# gradient from its input occurrences is zero, so that row is not trained where the pad id is an
# input token (a config with pad_token_id = eos, as Phi-3's; Gemma's pad 0). The models here put
# pad_token_id on the last embedding row, which no record uses (write_data checks), so the
# comparison does not depend on it; test_families.py::test_pad_row_gradient covers the rule.

# Dimensions: head_dim 16 with hidden 32 and 4 heads makes q_dim (64) differ from hidden (32), so
# a kernel that assumes hidden == heads * head_dim fails.
DIMS = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, head_dim=16)


def _rope_llama3() -> dict:
    return {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def _configs(vocab: int, bos: int, eos: int, dims: dict) -> dict:
    """variant -> (transformers config, model class). Every dropout is 0 (the engine applies
    none). Options are chosen so each part differs from its default: biases on, windows shorter
    than the sequence, soft caps small enough that tanh bends, scaling factors != 1. dims: DIMS
    or larger (the GPU test), with head_dim for the families whose head_dim is free."""
    # pad_token_id: the last embedding row, which no record uses (see the note on padding_idx above).
    ids = dict(vocab_size=vocab, bos_token_id=bos, eos_token_id=eos, pad_token_id=vocab - 1)
    d = {k: v for k, v in dims.items() if k != "head_dim"}
    d.update(ids)
    hd = dims["head_dim"]
    c = transformers
    gemma_text = dict(d, head_dim=hd, sliding_window=WINDOW, hidden_activation="gelu_pytorch_tanh",
                      layer_types=[("sliding_attention" if i % 2 == 0 else "full_attention")
                                   for i in range(d["num_hidden_layers"])],
                      query_pre_attn_scalar=24, attention_dropout=0.0)
    # Phi-3: rotary_dim = (hidden / heads) * 0.5; longrope has rotary_dim / 2 factors of each kind.
    n = d["hidden_size"] // d["num_attention_heads"] // 4
    short = [1.0 + 0.5 * i / max(1, n - 1) for i in range(n)]
    long = [1.25 + 2.75 * i / max(1, n - 1) for i in range(n)]
    return {
        "llama": (c.LlamaConfig(**d, attention_bias=True, mlp_bias=True, rope_parameters=_rope_llama3(),
                                tie_word_embeddings=False, attention_dropout=0.0), c.LlamaForCausalLM),
        "mistral": (c.MistralConfig(**d, sliding_window=WINDOW, head_dim=hd, attention_dropout=0.0),
                    c.MistralForCausalLM),
        "qwen2_tied": (c.Qwen2Config(**d, tie_word_embeddings=True, use_sliding_window=False,
                                     attention_dropout=0.0), c.Qwen2ForCausalLM),
        "qwen2_untied": (c.Qwen2Config(**d, tie_word_embeddings=False, use_sliding_window=False,
                                       attention_dropout=0.0), c.Qwen2ForCausalLM),
        "qwen3": (c.Qwen3Config(**d, head_dim=hd, tie_word_embeddings=True, use_sliding_window=False,
                                attention_dropout=0.0), c.Qwen3ForCausalLM),
        "gemma2": (c.Gemma2Config(**gemma_text, attn_logit_softcapping=2.0, final_logit_softcapping=3.0),
                   c.Gemma2ForCausalLM),
        "gemma3_text": (c.Gemma3TextConfig(**gemma_text, rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}), c.Gemma3ForCausalLM),
        "gemma3_vlm": (_gemma3_vlm(gemma_text, vocab), c.Gemma3ForConditionalGeneration),
        "phi3": (c.Phi3Config(**d, original_max_position_embeddings=32, attention_dropout=0.0,
                              resid_pdrop=0.0, embd_pdrop=0.0, rope_parameters={
                                  "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                  "short_factor": short, "long_factor": long}),
                 c.Phi3ForCausalLM),
        "olmo2": (c.Olmo2Config(**d, attention_bias=False, attention_dropout=0.0), c.Olmo2ForCausalLM),
        "gpt2": (c.GPT2Config(vocab_size=vocab, bos_token_id=bos, eos_token_id=eos, n_embd=d["hidden_size"],
                              n_layer=d["num_hidden_layers"], n_head=d["num_attention_heads"],
                              n_positions=d["max_position_embeddings"], resid_pdrop=0.0, embd_pdrop=0.0,
                              attn_pdrop=0.0, summary_first_dropout=0.0), c.GPT2LMHeadModel),
    }


def _gemma3_vlm(text: dict, vocab: int):
    """Gemma3ForConditionalGeneration with a tiny SigLIP tower: its tensors (and the projector's)
    are not trained and must come back unchanged on export. The image token ids are the
    synthetic vocabulary's special ids before the padding row (never in the training data)."""
    vision = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14,
                                             vision_use_head=False)
    text = {k: v for k, v in text.items() if k not in ("bos_token_id", "eos_token_id")}
    return transformers.Gemma3Config(text_config=text, vision_config=vision.to_dict(), mm_tokens_per_image=4,
                                     boi_token_index=vocab - 4, eoi_token_index=vocab - 3,
                                     image_token_index=vocab - 2)


# variant -> tokenizer folder under ../shared/data/tokenizers, or None for the synthetic one.
# Gemma's 256k-262k vocabulary (no Gemma tokenizer is in ../shared, only its template) and OLMo 2's
# dolma2 tokenizer (not in ../shared) get the synthetic one; Qwen2.5 shares Qwen3's 151,643-token
# BPE (Qwen3 adds special tokens), so both use qwen3's.
TOKENIZERS = {"llama": "llama3.1", "mistral": "mistral-7b-v0.3", "qwen2_tied": "qwen3",
              "qwen2_untied": "qwen3", "qwen3": "qwen3", "gemma2": None, "gemma3_text": None,
              "gemma3_vlm": None, "phi3": "phi3-mini", "olmo2": None, "gpt2": "gpt2"}
VARIANTS = list(TOKENIZERS)
# Embedding-table names (absolute bound) per checkpoint layout.
EMBEDDINGS = {"model.embed_tokens.weight", "transformer.wte.weight", "transformer.wpe.weight",
              "language_model.model.embed_tokens.weight", "model.language_model.embed_tokens.weight"}


def _synthetic_tokenizer(out: pathlib.Path, texts: list[str]) -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=SYNTHETIC_VOCAB - 4, special_tokens=["<eos>", "<bos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens(["<boi>", "<eoi>", "<image>", "<pad>"])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>"}))


def alpaca_records(shared: pathlib.Path, n: int = 200, seed: int = 0) -> list[dict]:
    records = json.loads((shared / "data" / "alpaca" / "alpaca_5000.json").read_text())
    return random.Random(seed).sample(records, n)


def install_tokenizer(variant: str, shared: pathlib.Path, out: pathlib.Path) -> dict:
    """Puts the variant's tokenizer into `out`; returns {vocab, bos, eos, name}."""
    name = TOKENIZERS[variant]
    if name is None:
        texts = [r["instruction"] + " " + r["output"] for r in alpaca_records(shared, 400, 1)]
        _synthetic_tokenizer(out, texts)
        tok = Tokenizer.from_file(str(out / "tokenizer.json"))
        return dict(vocab=SYNTHETIC_VOCAB, bos=tok.token_to_id("<bos>"), eos=tok.token_to_id("<eos>"),
                    name=f"synthetic byte-level BPE ({SYNTHETIC_VOCAB})")
    src = shared / "data" / "tokenizers" / name
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if (src / f).exists():
            shutil.copy(src / f, out / f)
    if (src / "chat_template.jinja").exists():
        shutil.copy(src / "chat_template.jinja", out / "chat_template.jinja")
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    vocab = tok.get_vocab_size(with_added_tokens=True)
    # The embedding rows of the released models (padded past the tokenizer).
    vocab = {"qwen3": 151936, "phi3-mini": 32064}.get(name, vocab)
    cfg = json.loads((out / "tokenizer_config.json").read_text()) if (out / "tokenizer_config.json").exists() else {}
    tid = lambda t: tok.token_to_id(t if isinstance(t, str) else (t or {}).get("content", "")) if t else None
    eos = tid(cfg.get("eos_token")) if cfg else tok.token_to_id("<|endoftext|>")
    bos = tid(cfg.get("bos_token"))
    return dict(vocab=vocab, bos=bos if bos is not None else eos, eos=eos, name=name)


def build_variant(variant: str, shared: pathlib.Path, out: pathlib.Path, seed: int = 0,
                  dims: dict | None = None) -> tuple[pathlib.Path, dict]:
    """Saves the tiny random-init model (fp32 safetensors) with its tokenizer into `out`. Norm
    weights and biases (HF initialises them to 1 or 0) are perturbed so that they matter; so are
    Gemma's (1 + w) norms, whose w starts at 0. Returns (out, tokenizer info)."""
    out.mkdir(parents=True, exist_ok=True)
    tok = install_tokenizer(variant, shared, out)
    cfg, cls = _configs(tok["vocab"], tok["bos"], tok["eos"], dims or DIMS)[variant]
    torch.manual_seed(seed)
    model = cls(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1 or n.endswith("_norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out, safe_serialization=True)
    return out, tok


def write_data(variant: str, model_dir: pathlib.Path, shared: pathlib.Path, path: pathlib.Path,
               n: int, seed: int) -> pathlib.Path:
    """n Alpaca records as pretokenized {"input_ids", "labels"} lines, rendered through the
    tokenizer's chat template where it has one (transformers' apply_chat_template; the prompt,
    i.e. the render with add_generation_prompt up to the assistant turn, is masked with -100),
    else as "instruction\\n\\nresponse" + eos. Each is cut to SEQ tokens and has >= MIN_TOKENS."""
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    pad = cfg.get("text_config", cfg).get("pad_token_id")
    lines = []
    for r in alpaca_records(shared, 4 * n, seed):
        user = r["instruction"] + ("\n" + r["input"] if r["input"] else "")
        if tok.chat_template:
            msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": r["output"]}]
            full = tok.apply_chat_template(msgs, tokenize=False)
            prompt = tok.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
            ids = tok(full, add_special_tokens=False)["input_ids"]
            head = tok(prompt, add_special_tokens=False)["input_ids"]
        else:
            head = tok(user + "\n\n", add_special_tokens=False)["input_ids"]
            ids = head + tok(r["output"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        masked = next((i for i, (a, b) in enumerate(zip(ids, head)) if a != b), min(len(ids), len(head)))
        masked = min(masked, SEQ // 2)  # keep a trained completion inside the cut
        assert pad not in ids, f"record uses the pad row {pad}"
        ids = ids[:SEQ]
        if len(ids) < MIN_TOKENS:
            continue
        labels = [-100] * masked + ids[masked:]
        lines.append(json.dumps({"input_ids": ids, "labels": labels}))
        if len(lines) == n:
            break
    assert len(lines) == n, f"only {len(lines)} records of >= {MIN_TOKENS} tokens"
    path.write_text("\n".join(lines) + "\n")
    return path


def checkpoint_layout(model_dir: pathlib.Path) -> dict:
    """{tensor name: (shape, dtype)} over every *.safetensors file of a model directory."""
    layout = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                t = st.get_slice(k)
                layout[k] = (tuple(t.get_shape()), t.get_dtype())
    return layout


def load_checkpoint(model_dir: pathlib.Path) -> dict:
    out = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            out.update({k: st.get_tensor(k) for k in st.keys()})
    return out


def state_as_checkpoint(model, tmp: pathlib.Path) -> dict:
    """The trained reference model's tensors under the checkpoint's own names (save_pretrained
    applies transformers' key mapping, e.g. Gemma 3's language_model.model.* and tied heads)."""
    model.save_pretrained(tmp, safe_serialization=True)
    return load_checkpoint(tmp)


def reference_model(model_dir: pathlib.Path, dtype=torch.float32, device="cpu"):
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype,
                                                             attn_implementation="eager").to(device)


def run_reference(model, batches: list, *, lr: float, weight_decay: float, max_grad_norm: float,
                  scheduler: str, warmup_steps: int, record=None) -> list[float]:
    """transformers + torch.optim.AdamW + clip_grad_norm_ + transformers' scheduler on the batches
    offloadd-train dumped (pipeline_testlib.train_steps, the trainer tests' loop), on the model's
    device and in its dtype; trains `model` in place and returns the per-step losses. Parameters
    that get no gradient (a vision tower) are not touched by AdamW. record: an
    adamw_noise_testlib.GradientRecorder to attach to the optimizer."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, foreach=False)
    if record is not None:
        record.attach(opt, model)
    return train_steps(model, batches, opt, scheduler, warmup_steps, max_grad_norm)


def run_reference_low(master, low, batches: list, *, lr: float, weight_decay: float,
                      max_grad_norm: float, scheduler: str, warmup_steps: int,
                      record=None) -> list[float]:
    """transformers' model in a 16-bit dtype with fp32 master weights, as offloadd trains in bf16
    (and as test_engine_fp16.py compares the engine with transformers' own fp16 model): `low`
    (the model loaded in bf16) runs forward and backward, the loss in fp32 from its logits; its
    16-bit gradients are summed over micro-batches in fp32 into `master`'s .grad; clip_grad_norm_
    and torch.optim.AdamW on the fp32 master; the 16-bit copy refreshed from the master after
    every step. Returns the per-step losses; `master` holds the trained weights. record: an
    adamw_noise_testlib.GradientRecorder to attach to the master's optimizer."""
    master.train()
    low.train()
    params, lparams = list(master.parameters()), list(low.parameters())
    assert len(params) == len(lparams)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=False)
    if record is not None:
        record.attach(opt, master)
    sched = transformers.get_scheduler(scheduler, opt, num_warmup_steps=warmup_steps,
                                       num_training_steps=len(batches))
    losses = []
    for step in batches:
        opt.zero_grad(set_to_none=True)
        acc = [None] * len(params)
        trained = sum(sum(1 for t in m["targets"] if t != -100) for m in step)
        total = 0.0
        for m in step:
            loss = micro_batch_loss(low, m, trained)
            loss.backward()
            for i, lp in enumerate(lparams):
                if lp.grad is not None:
                    acc[i] = lp.grad.float() if acc[i] is None else acc[i] + lp.grad.float()
                    lp.grad = None
            total += loss.item()
        for p, a in zip(params, acc):
            p.grad = a
        torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_grad_norm)
        opt.step()
        sched.step()
        with torch.no_grad():
            for p, lp in zip(params, lparams):
                lp.copy_(p)
        losses.append(total)
    return losses
