"""Helpers for the transformers cross-check (test_hf_crosscheck.py): tiny random-init models of each
supported family with a real tokenizer, chat-format data subsets from ../shared/data, and the
reference training loop that runs every packed document on its own."""

import json
import pathlib
import random
import shutil

import torch
import transformers
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers

# Qwen2-Instruct's ChatML template (the one shipped with Qwen2-*-Instruct's tokenizer_config.json).
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
          "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512)


def _install_tokenizer(family: str, tokenizers_dir: pathlib.Path, out: pathlib.Path) -> dict:
    """Copies the family's real tokenizer into the model directory; returns the token ids the
    model config needs."""
    if family == "qwen2":
        # Qwen2's own tokenizer.json is not in ../shared/data: GPT-2's byte-level BPE vocabulary
        # and merges in Qwen2's pipeline (NFC, its split regex, byte-level without GPT-2's
        # regex; transformers' Qwen2Tokenizer enforces that pipeline), ChatML special tokens and
        # Qwen2-Instruct's chat template.
        tok = Tokenizer.from_file(str(tokenizers_dir / "gpt2" / "tokenizer.json"))
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
        tok.save(str(out / "tokenizer.json"))
        (out / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "Qwen2Tokenizer", "chat_template": CHATML,
            "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None}))
        eos = tok.token_to_id("<|im_end|>")
        return dict(vocab=tok.get_vocab_size(with_added_tokens=True), bos=eos, eos=eos)
    name = {"llama": "llama2", "mistral": "phi3-mini", "gpt2": "gpt2"}[family]
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if (tokenizers_dir / name / f).exists():
            shutil.copy(tokenizers_dir / name / f, out / f)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if family == "mistral":
        vocab = 32064  # Phi-3-mini pads its 32011 tokens to 32064 embedding rows
    if family == "gpt2":
        eos = tok.token_to_id("<|endoftext|>")
        return dict(vocab=vocab, bos=eos, eos=eos)
    eos = tok.token_to_id("<|endoftext|>") if family == "mistral" else tok.token_to_id("</s>")
    return dict(vocab=vocab, bos=tok.token_to_id("<s>"), eos=eos)


def _config(family: str, ids: dict) -> transformers.PretrainedConfig:
    common = dict(vocab_size=ids["vocab"], bos_token_id=ids["bos"], eos_token_id=ids["eos"])
    if family == "gpt2":
        # Dropout 0: the reference is transformers in train mode without dropout.
        return transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=512,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                       summary_first_dropout=0.0, **common)
    if family == "llama":
        return transformers.LlamaConfig(**TINY, attention_dropout=0.0, **common)
    if family == "mistral":
        return transformers.MistralConfig(**TINY, sliding_window=4096, attention_dropout=0.0, **common)
    return transformers.Qwen2Config(**TINY, tie_word_embeddings=True, use_sliding_window=False,
                                    attention_dropout=0.0, **common)


def build_family_model(family: str, tokenizers_dir: pathlib.Path, out: pathlib.Path,
                       seed: int = 0) -> pathlib.Path:
    """A 2-layer random-init model saved as an HF directory with its tokenizer. Norm weights and
    biases (which HF initialises to 1 and 0) are perturbed so that they matter in the forward."""
    out.mkdir(parents=True, exist_ok=True)
    ids = _install_tokenizer(family, tokenizers_dir, out)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(_config(family, ids))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out, safe_serialization=True)
    return out


def write_data(data_dir: pathlib.Path, out: pathlib.Path, seed: int) -> dict:
    """Small subsets of the three chat record formats: Alpaca records, LIMA records rewritten as
    {"messages": [...]} (one multi-turn), and Glaive tool-calling ShareGPT conversations (with
    function_call / observation turns and a tools field). Returns {format: (path, records)}."""
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    alpaca = json.loads((data_dir / "alpaca" / "alpaca_5000.json").read_text())
    alpaca = rng.sample(alpaca, 12)
    lima = json.loads((data_dir / "lima" / "lima.json").read_text())
    short = lambda r: len(r["instruction"]) + len(r["output"]) + sum(len(a + b) for a, b in r["history"])
    single = sorted((r for r in lima if not r["history"] and short(r) < 500), key=short)
    multi = min((r for r in lima if r["history"]), key=short)
    lima = rng.sample(single, 7) + [multi]
    messages = []
    for r in lima:
        turns = []
        for u, a in r["history"]:
            turns += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        user = r["instruction"] + ("\n" + r["input"] if r["input"] else "")
        turns += [{"role": "user", "content": user}, {"role": "assistant", "content": r["output"]}]
        messages.append({"messages": turns})
    glaive = json.loads((data_dir / "glaive_toolcall_sharegpt" / "glaive_toolcall_en_demo.json").read_text())
    calls = [r for r in glaive if any(t["from"] == "function_call" for t in r["conversations"])]
    sharegpt = sorted(calls, key=lambda r: len(json.dumps(r)))[:6]
    paths = {}
    for name, records in (("alpaca", alpaca), ("messages", messages), ("sharegpt", sharegpt)):
        p = out / f"{name}.json"
        p.write_text(json.dumps(records))
        paths[name] = (p, records)
    return paths


def first_user_text(fmt: str, record: dict) -> str:
    if fmt == "alpaca":
        return record["instruction"]
    if fmt == "messages":
        return record["messages"][0]["content"]
    return next(t["value"] for t in record["conversations"] if t["from"] == "human")


def to_messages(fmt: str, record: dict) -> list[dict]:
    """A record as the chat messages offloadd renders (text/dataset.h's mapping)."""
    if fmt == "alpaca":
        user = record["instruction"] + ("\n" + record["input"] if record["input"] else "")
        return [{"role": "user", "content": user}, {"role": "assistant", "content": record["output"]}]
    if fmt == "messages":
        return record["messages"]
    roles = {"human": "user", "gpt": "assistant", "function_call": "assistant", "observation": "tool"}
    return [{"role": roles[t["from"]], "content": t["value"]} for t in record["conversations"]]


def hf_chat_documents(model_dir: pathlib.Path, data: dict) -> list[list[int]]:
    """Every record rendered by transformers' apply_chat_template with the tokenizer's own template
    and tokenized without extra special tokens (what apply_chat_template(tokenize=True) does)."""
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    docs = []
    for fmt, (_, records) in data.items():
        for r in records:
            text = tok.apply_chat_template(to_messages(fmt, r), tokenize=False)
            docs.append(tok(text, add_special_tokens=False)["input_ids"])
    return docs


def split_documents(m: dict) -> list[dict]:
    """The documents of one dumped micro-batch: for each row, the runs of equal segment id that
    hold a trained or real token (the padding segment has targets -100 only and is skipped), each
    with its input ids, position ids and targets."""
    b, t = m["batch"], m["seq"]
    docs = []
    for r in range(b):
        row = slice(r * t, (r + 1) * t)
        ids, pos, tgt = m["input_ids"][row], m["position_ids"][row], m["targets"][row]
        seg = m["segment_ids"][row] if m["segment_ids"] else [0] * t
        start = 0
        for i in range(1, t + 1):
            if i == t or seg[i] != seg[start]:
                docs.append(dict(row=r, segment=seg[start], input_ids=ids[start:i],
                                 position_ids=pos[start:i], targets=tgt[start:i]))
                start = i
    return docs


def packed_micro_batch_loss(model, m: dict, trained: int):
    """One dumped micro-batch's summed token loss over the step's trained-token count, running
    every packed document on its own (its own forward from position 0, as HF would see a lone
    document); documents without a trained target (the padding run) are skipped."""
    total = None
    for d in split_documents(m):
        targets = torch.tensor(d["targets"])
        if (targets == -100).all():
            continue
        logits = model(input_ids=torch.tensor([d["input_ids"]])).logits.float()[0]
        loss = torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, reduction="sum")
        total = loss if total is None else total + loss
    if total is None:  # nothing trained in this micro-batch
        return sum(p.sum() * 0 for p in model.parameters())
    return total / max(1, trained)


def first_step_gradients(model_dir: pathlib.Path, step: list, dtype) -> dict:
    """transformers' gradients of the first dumped step's loss (every packed document on its own)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype,
                                                              attn_implementation="eager")
    model.train()
    trained = sum(sum(1 for t in m["targets"] if t != -100) for m in step)
    for m in step:
        packed_micro_batch_loss(model, m, trained).backward()
    return {n: p.grad.double() for n, p in model.named_parameters()}


def gradients_from_update(initial: dict, updated: dict, lr: float) -> dict:
    """Inverts one AdamW step from zero state with eps = 1, no weight decay and no clipping:
    bias correction makes m_hat = g and v_hat = g^2, so the update is u = -lr * g / (|g| + 1)
    and g = -u / (lr - |u|). With lr = 1e4 the update is large against the weight, so the
    weight's float32 rounding costs the recovered g only ~1e-7 relative."""
    out = {}
    for name, w in updated.items():
        u = w.double() - initial[name].double()
        out[name] = -u / (lr - u.abs())
    return out
