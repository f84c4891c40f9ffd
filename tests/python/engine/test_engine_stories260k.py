"""stories260K (Karpathy's pretrained llama2.c model): the converter produces a Hugging Face
directory whose greedy sample, from our engine and from transformers, is the documented one."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
import transformers
from tokenizers import Tokenizer

from engine_testlib import SOURCE_DIR, run_check

# ../shared's copy: it holds the documented greedy samples beside the model.
DATA = SOURCE_DIR.parent / "shared" / "data" / "models" / "stories260K"
pytestmark = pytest.mark.skipif(not (DATA / "stories260K.bin").exists(), reason=f"{DATA} missing")

STEPS = 256  # llama2.c run.c default: positions 0..255, starting from BOS


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("stories") / "hf"
    subprocess.run([sys.executable, str(SOURCE_DIR / "scripts" / "convert_llama2c.py"),
                    "--model", str(DATA / "stories260K.bin"), "--tokenizer", str(DATA / "tok512.bin"),
                    "--out", str(out)], check=True)
    return out


@pytest.fixture(scope="module")
def engine_ids(hf_dir, tmp_path_factory):
    out = run_check(hf_dir, None, tmp_path_factory.mktemp("gen") / "gen.safetensors",
                    "--generate", STEPS, "--prompt", 1, "--stop", 1)
    return out["generated"].tolist()


def llama2c_decode(tokens, vocab):
    """run.c's decode: strip the leading space after BOS, raw <0xNN> pieces become bytes."""
    inv = {i: p for p, i in vocab.items()}
    out, prev = b"", 1
    for t in tokens:
        piece = inv[t].replace("\u2581", " ")
        if prev == 1 and piece.startswith(" "):
            piece = piece[1:]
        if piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:
            out += bytes([int(piece[3:5], 16)])
        else:
            out += piece.encode("utf-8")
        prev = t
    return out.decode("utf-8")


def expected_text():
    return (DATA / "expected_greedy_t0.txt").read_text(encoding="utf-8")


def test_engine_reproduces_documented_greedy_sample(hf_dir, engine_ids):
    ids = engine_ids
    assert ids[0] == 1
    vocab = json.loads((hf_dir / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    text = llama2c_decode(ids[1:], vocab)
    # The documented file is the printed sample plus one trailing newline.
    assert text + "\n" == expected_text()
    # The tokenizers library decodes our tokenizer.json to the same text.
    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    assert tok.decode(ids[1:], skip_special_tokens=True) == text


def test_transformers_reproduces_documented_greedy_sample(hf_dir, engine_ids):
    model = transformers.LlamaForCausalLM.from_pretrained(hf_dir)
    model.eval()
    with torch.no_grad():
        gen = model.generate(torch.tensor([[1]]), max_new_tokens=STEPS, do_sample=False,
                             eos_token_id=1, pad_token_id=0)
    ids = gen[0].tolist()
    if ids[-1] == 1:
        ids = ids[:-1]
    assert ids == engine_ids
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    assert tok.decode(ids, skip_special_tokens=True) + "\n" == expected_text()


def llama2c_encode(text, vocab_scores):
    """run.c's encode (dummy prefix, byte fallback, greedy highest-score merges), for checking the
    merge ranks written to tokenizer.json."""
    pieces = {p: i for i, (p, _) in enumerate(vocab_scores)}
    ids = [pieces[" "]] if text else []
    for ch in text:
        if ch in pieces:
            ids.append(pieces[ch])
        else:
            ids.extend(b + 3 for b in ch.encode("utf-8"))
    while True:
        best, best_i, best_id = None, -1, -1
        for i in range(len(ids) - 1):
            merged = vocab_scores[ids[i]][0] + vocab_scores[ids[i + 1]][0]
            if merged in pieces and (best is None or vocab_scores[pieces[merged]][1] > best):
                best, best_i, best_id = vocab_scores[pieces[merged]][1], i, pieces[merged]
        if best is None:
            return ids
        ids[best_i:best_i + 2] = [best_id]


def test_tokenizer_json_encodes_like_llama2c(hf_dir):
    sys.path.insert(0, str(SOURCE_DIR / "scripts"))
    import convert_llama2c
    pieces, scores = convert_llama2c.read_tokenizer(str(DATA / "tok512.bin"), 512)
    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    for text in [expected_text(), "Tom and Sue went to the zoo. Über café 🙂!", "  two  spaces\tand tab"]:
        ours = tok.encode(text, add_special_tokens=False).ids
        assert ours == llama2c_encode(text, list(zip(pieces, scores))), text
        assert tok.decode(ours) == text


def test_converter_rejects_garbage(tmp_path):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\x01\x00\x00\x00" * 10)
    proc = subprocess.run([sys.executable, str(SOURCE_DIR / "scripts" / "convert_llama2c.py"),
                           "--model", str(bad), "--tokenizer", str(DATA / "tok512.bin"),
                           "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert proc.returncode != 0 and "bad.bin" in proc.stderr


def test_offloadd_generate_with_native_tokenizer(hf_dir):
    """offloadd-generate (engine + text/ tokenizer, all C++) prints the documented sample."""
    from engine_testlib import BINARY_DIR
    exe = BINARY_DIR / "engine" / "offloadd-generate"
    if not exe.exists():
        pytest.skip(f"{exe} not built (needs the text/ component)")
    proc = subprocess.run([str(exe), "--model", str(hf_dir), "--max-new-tokens", str(STEPS),
                           "--stop-ids", "1"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected_text()
