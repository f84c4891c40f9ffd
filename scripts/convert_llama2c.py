#!/usr/bin/env python3
"""Convert a llama2.c legacy checkpoint (+ its tokenizer .bin) to a Hugging Face Llama directory.

    convert_llama2c.py --model stories260K.bin --tokenizer tok512.bin --out DIR

Writes DIR/model.safetensors, config.json, generation_config.json, tokenizer.json and
tokenizer_config.json, loadable by transformers (LlamaForCausalLM, AutoTokenizer) and by
offloadd's engine.

llama2.c layout ("version 0", little-endian): 7 x int32 header (dim, hidden_dim, n_layers,
n_heads, n_kv_heads, vocab_size, max_seq_len; vocab_size < 0 means an untied classifier follows),
then float32 arrays token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final,
freq_cis_real, freq_cis_imag[, wcls]. llama2.c applies rotary embeddings to adjacent pairs
(2i, 2i+1) of each head; transformers rotates halves (i, i + d/2), so the rows of wq and wk are
permuted per head exactly as transformers' convert_llama_weights_to_hf.py does.

The tokenizer .bin is: int32 max_token_length, then per id: float32 score, int32 length, bytes.
It becomes a SentencePiece-style BPE tokenizer.json (byte_fallback, legacy "▁" prefix, merges
ranked by the merged piece's score, as transformers' SentencePiece converter ranks them). Ids 1
and 2, stored as "\\n<s>\\n" and "\\n</s>\\n", are named <s> and </s>.

Needs only numpy and safetensors.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
from safetensors.numpy import save_file

SPIECE_UNDERLINE = "\u2581"


def read_checkpoint(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 28:
        raise ValueError(f"{path}: too short for a llama2.c header")
    dim, hidden, n_layers, n_heads, n_kv_heads, vocab, max_seq = struct.unpack("<7i", data[:28])
    shared = vocab > 0
    vocab = abs(vocab)
    if min(dim, hidden, n_layers, n_heads, n_kv_heads, vocab, max_seq) <= 0 or dim % n_heads:
        raise ValueError(f"{path}: implausible header {dim, hidden, n_layers, n_heads, n_kv_heads, vocab, max_seq}")
    head = dim // n_heads
    kv_dim = n_kv_heads * head
    shapes = [
        ("tok_embeddings", (vocab, dim)),
        ("rms_att", (n_layers, dim)),
        ("wq", (n_layers, dim, dim)),
        ("wk", (n_layers, kv_dim, dim)),
        ("wv", (n_layers, kv_dim, dim)),
        ("wo", (n_layers, dim, dim)),
        ("rms_ffn", (n_layers, dim)),
        ("w1", (n_layers, hidden, dim)),
        ("w2", (n_layers, dim, hidden)),
        ("w3", (n_layers, hidden, dim)),
        ("rms_final", (dim,)),
        ("freq_cis_real", (max_seq, head // 2)),
        ("freq_cis_imag", (max_seq, head // 2)),
    ]
    if not shared:
        shapes.append(("wcls", (vocab, dim)))
    floats = np.frombuffer(data, dtype="<f4", offset=28)
    need = sum(int(np.prod(s)) for _, s in shapes)
    if floats.size != need:
        raise ValueError(f"{path}: {floats.size} floats after the header, layout needs {need}")
    arrays, off = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        arrays[name] = floats[off:off + n].reshape(shape).astype(np.float32)
        off += n
    hp = dict(dim=dim, hidden=hidden, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
              vocab=vocab, max_seq=max_seq, shared=shared)
    return hp, arrays


def permute_rotary(w, n_heads):
    """Interleaved (2i, 2i+1) rotary rows -> rotate_half (i, i + d/2) rows, per head."""
    out_dim, in_dim = w.shape
    return w.reshape(n_heads, out_dim // n_heads // 2, 2, in_dim).transpose(0, 2, 1, 3).reshape(out_dim, in_dim)


def convert_weights(hp, a):
    t = {"model.embed_tokens.weight": a["tok_embeddings"], "model.norm.weight": a["rms_final"]}
    for i in range(hp["n_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = a["rms_att"][i]
        t[p + "post_attention_layernorm.weight"] = a["rms_ffn"][i]
        t[p + "self_attn.q_proj.weight"] = permute_rotary(a["wq"][i], hp["n_heads"])
        t[p + "self_attn.k_proj.weight"] = permute_rotary(a["wk"][i], hp["n_kv_heads"])
        t[p + "self_attn.v_proj.weight"] = a["wv"][i]
        t[p + "self_attn.o_proj.weight"] = a["wo"][i]
        t[p + "mlp.gate_proj.weight"] = a["w1"][i]
        t[p + "mlp.down_proj.weight"] = a["w2"][i]
        t[p + "mlp.up_proj.weight"] = a["w3"][i]
    if not hp["shared"]:
        t["lm_head.weight"] = a["wcls"]
    return {k: np.ascontiguousarray(v) for k, v in t.items()}


def read_tokenizer(path, vocab_size):
    with open(path, "rb") as f:
        data = f.read()
    off = 4
    pieces, scores = [], []
    for i in range(vocab_size):
        if off + 8 > len(data):
            raise ValueError(f"{path}: truncated at id {i}")
        score, n = struct.unpack("<fi", data[off:off + 8])
        off += 8
        if n < 0 or off + n > len(data):
            raise ValueError(f"{path}: bad piece length {n} at id {i}")
        pieces.append(data[off:off + n].decode("utf-8"))
        scores.append(score)
        off += n
    if off != len(data):
        raise ValueError(f"{path}: {len(data) - off} trailing bytes")
    return pieces, scores


def build_tokenizer_json(pieces, scores):
    names = {0: "<unk>", 1: "<s>", 2: "</s>"}
    vocab = {}
    for i, p in enumerate(pieces):
        token = names.get(i, p.replace(" ", SPIECE_UNDERLINE))
        if token in vocab:
            raise ValueError(f"duplicate piece {token!r} (ids {vocab[token]} and {i})")
        vocab[token] = i
    # Merges exactly as transformers' SentencePieceExtractor: every split of a normal piece into
    # two vocabulary pieces, ranked by the merged piece's score (highest first), ties by ids.
    merges = []
    for token, i in vocab.items():
        if i < 3 or token.startswith("<0x"):
            continue
        local = [(token[:k], token[k:]) for k in range(1, len(token))
                 if token[:k] in vocab and token[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend((scores[i], m) for m in local)
    merges.sort(key=lambda x: -x[0])  # stable: keeps the id order within equal scores
    special = [{"id": i, "content": names[i], "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for i in (0, 1, 2)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": SPIECE_UNDERLINE},
            {"type": "Replace", "pattern": {"String": " "}, "content": SPIECE_UNDERLINE}]},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SPIECE_UNDERLINE}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
                  "ignore_merges": False, "vocab": vocab, "merges": [list(m) for _, m in merges]},
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="llama2.c checkpoint (.bin, legacy version 0)")
    ap.add_argument("--tokenizer", required=True, help="llama2.c tokenizer (.bin)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--norm-eps", type=float, default=1e-5)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    args = ap.parse_args(argv)

    hp, arrays = read_checkpoint(args.model)
    pieces, scores = read_tokenizer(args.tokenizer, hp["vocab"])
    os.makedirs(args.out, exist_ok=True)
    save_file(convert_weights(hp, arrays), os.path.join(args.out, "model.safetensors"),
              metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": hp["vocab"], "hidden_size": hp["dim"], "intermediate_size": hp["hidden"],
        "num_hidden_layers": hp["n_layers"], "num_attention_heads": hp["n_heads"],
        "num_key_value_heads": hp["n_kv_heads"], "head_dim": hp["dim"] // hp["n_heads"],
        "max_position_embeddings": hp["max_seq"], "rms_norm_eps": args.norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": args.rope_theta},
        "rope_theta": args.rope_theta, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": hp["shared"], "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": None, "dtype": "float32",
    }
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2}, f, indent=2)
    with open(os.path.join(args.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(build_tokenizer_json(pieces, scores), f, ensure_ascii=False, indent=1)
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False,
                   "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None,
                   "legacy": True, "clean_up_tokenization_spaces": False,
                   "model_max_length": hp["max_seq"]}, f, indent=2)
    print(f"wrote {args.out}: {hp['n_layers']} layers, dim {hp['dim']}, vocab {hp['vocab']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
