"""offloadd's native tokenizer against the Python `tokenizers` library, on every real tokenizer
in shared/data (and on Llama-3 / Qwen2-style / Metaspace-form tokenizers built by text_testlib), and
against the shipped swift-transformers test vectors."""

import json

import pytest
from tokenizers import Tokenizer

from text_testlib import TOK_DIR, NativeTokenizer, tool, varied_corpus

NAMES = ["gpt2", "llama2", "phi3-mini", "llama3", "qwen2-style", "llama2-metaspace"]

_RUNS = {}


def parity_run(tokenizer_paths, name):
    """Encodes the corpus (with and without special tokens, with offsets) and decodes the
    reference ids (with and without skipping special tokens) in one native process, once per
    tokenizer, so that each large tokenizer is loaded once."""
    if name in _RUNS:
        return _RUNS[name]
    path = tokenizer_paths[name]
    ref = Tokenizer.from_file(str(path))
    texts = varied_corpus(name)
    want = {a: ref.encode_batch(texts, add_special_tokens=a) for a in (False, True)}
    ids = [e.ids for e in want[True]]
    ids += [i[: len(i) // 2] for i in ids if len(i) > 3]  # cuts multi-byte characters too
    requests = ([{"text": t, "add_special_tokens": a, "offsets": True}
                 for a in (False, True) for t in texts]
                + [{"ids": i, "skip_special_tokens": skip} for skip in (False, True) for i in ids])
    replies = NativeTokenizer(path).run(requests)
    n = len(texts)
    run = {
        "ref": ref, "path": path, "texts": texts, "want": want, "ids": ids,
        "encoded": {False: replies[:n], True: replies[n:2 * n]},
        "decoded": {False: [r["text"] for r in replies[2 * n:2 * n + len(ids)]],
                    True: [r["text"] for r in replies[2 * n + len(ids):]]},
    }
    _RUNS[name] = run
    return run


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("add_special", [False, True])
def test_encode_matches_python(tokenizer_paths, name, add_special):
    run = parity_run(tokenizer_paths, name)
    want = [e.ids for e in run["want"][add_special]]
    got = [r["ids"] for r in run["encoded"][add_special]]
    mismatches = [(t, w, g) for t, w, g in zip(run["texts"], want, got) if w != g]
    assert not mismatches, f"{len(mismatches)}/{len(want)} differ; first: {mismatches[0]!r}"
    assert sum(len(w) for w in want) > 1000  # the corpus really was encoded


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("skip_special", [False, True])
def test_decode_matches_python(tokenizer_paths, name, skip_special):
    run = parity_run(tokenizer_paths, name)
    ids = run["ids"]
    if name == "llama2":
        # tokenizers 0.23 decodes added tokens with normalized=true through their *normalized*
        # form ("\u2581<s>"), so it neither skips them nor drops the space it adds. transformers'
        # LlamaTokenizer (5.17) and the shipped vectors (4.57) skip them and add no space; offloadd
        # follows transformers here.
        from transformers import AutoTokenizer
        hf = AutoTokenizer.from_pretrained(str(run["path"].parent))
        want = [hf.decode(i, skip_special_tokens=skip_special) for i in ids]
    else:
        want = run["ref"].decode_batch(ids, skip_special_tokens=skip_special)
    got = run["decoded"][skip_special]
    mismatches = [(i, w, g) for i, w, g in zip(ids, want, got) if w != g]
    assert not mismatches, f"{len(mismatches)}/{len(ids)} differ; first: {mismatches[0]!r}"


@pytest.mark.parametrize("name", NAMES)
def test_offsets_match_python(tokenizer_paths, name):
    """Token start offsets (used to align chat-template spans with tokens) agree with the Python
    library's, once our byte offsets are floored to character starts (Python's are per char)."""
    run = parity_run(tokenizer_paths, name)
    bad = []
    for text, enc, reply in zip(run["texts"], run["want"][False], run["encoded"][False]):
        char_starts, pos = {}, 0
        for ch in text:
            width = len(ch.encode("utf-8"))
            for k in range(width):
                char_starts[pos + k] = pos
            pos += width
        ours = [char_starts.get(s, s) for s in reply["starts"]]
        want = [len(text[:s].encode("utf-8")) for s, _ in enc.offsets]
        if ours != want:
            bad.append((text, want, ours))
    assert not bad, f"{len(bad)}/{len(run['texts'])} differ; first: {bad[0]!r}"


def _vectors(name):
    return json.loads((TOK_DIR / "test_vectors" / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("tok_name,vector_file", [
    ("gpt2", "gpt2_encoded_tokens.json"),
    ("llama2", "llama_encoded.json"),
    ("llama3", "llama_3.2_encoded.json"),
])
def test_shipped_paragraph_vectors(tokenizer_paths, tok_name, vector_file):
    v = _vectors(vector_file)
    got = NativeTokenizer(tokenizer_paths[tok_name]).encode_many([v["text"]], True)[0]
    assert got == v["token_ids"]


@pytest.mark.parametrize("tok_name,key", [
    ("gpt2", "distilgpt2"),
    ("llama2", "coreml-projects/Llama-2-7b-chat-coreml"),
    ("llama3", "pcuenq/Llama-3.2-1B-Instruct-tokenizer"),
])
def test_shipped_tokenizer_tests(tokenizer_paths, tok_name, key):
    cases = _vectors("tokenizer_tests.json")[key]
    got = NativeTokenizer(tokenizer_paths[tok_name]).encode_many([c["input"] for c in cases], True)
    for case, ids in zip(cases, got):
        assert ids == case["encoded"]["input_ids"], case["input"]


@pytest.mark.parametrize("tok_name,vector_file", [
    ("gpt2", "gpt2_multilingual.json"),
    ("llama2", "tinyllama_multilingual.json"),
])
def test_shipped_multilingual_vectors(tokenizer_paths, tok_name, vector_file):
    base = TOK_DIR / "test_vectors" / "multilingual_conformance"
    inputs = {c["id"]: c["text"] for c in json.loads((base / "inputs.json").read_text("utf-8"))}
    entries = json.loads((base / vector_file).read_text("utf-8"))["entries"]
    native = NativeTokenizer(tokenizer_paths[tok_name])
    got = native.encode_many([inputs[e["id"]] for e in entries], True)
    bad = [e["id"] for e, ids in zip(entries, got) if ids != e["input_ids"]]
    assert not bad, bad
    decoded = native.decode_many([e["input_ids"] for e in entries], True)
    bad = [e["id"] for e, d in zip(entries, decoded) if d != e["decoded_skip_special"]]
    assert not bad, bad


def test_bad_input_reports_errors(tmp_path, tokenizer_paths):
    import subprocess
    broken = tmp_path / "tokenizer.json"
    data = json.loads(tokenizer_paths["gpt2"].read_text(encoding="utf-8"))
    data["model"]["merges"] = []
    broken.write_text(json.dumps(data))
    proc = subprocess.run([str(tool("offloadd-tokenize")), "--tokenizer", str(broken)],
                          input="", capture_output=True, text=True)
    assert proc.returncode == 1
    assert "merges" in proc.stderr and str(broken) in proc.stderr


CLASS_CONFIGS = {
    "gpt2": {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>",
             "eos_token": "<|endoftext|>", "add_prefix_space": False},
    "llama3": {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
               "eos_token": "<|eot_id|>"},
    "qwen2-style": {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>",
                    "pad_token": "<|endoftext|>", "bos_token": None},
}


@pytest.mark.parametrize("name", ["gpt2", "llama3", "qwen2-style"])
def test_directory_matches_transformers(tokenizer_paths, tmp_path, name):
    """A tokenizer directory of these classes loads like transformers 5 AutoTokenizer, which uses
    the file as is. (Llama-class directories follow the `tokenizers` library on their
    tokenizer.json instead, as transformers 4 did; transformers 5 rebuilds them with a Metaspace
    pre-tokenizer and encodes differently after added tokens and on leading spaces: see
    test_tokenizer_conformance.py::test_directory_equals_tokenizers_on_its_file.)"""
    import shutil
    from transformers import AutoTokenizer
    d = tmp_path / name
    d.mkdir()
    shutil.copy(tokenizer_paths[name], d / "tokenizer.json")
    (d / "tokenizer_config.json").write_text(json.dumps(CLASS_CONFIGS[name]))
    hf = AutoTokenizer.from_pretrained(str(d))
    # The byte-level classes use the file as is (covered in depth above): a shorter corpus.
    texts = varied_corpus(name)[:150]
    want = {a: [hf(t, add_special_tokens=a)["input_ids"] for t in texts] for a in (False, True)}
    replies = NativeTokenizer(d).run(
        [{"text": t, "add_special_tokens": a} for a in (False, True) for t in texts]
        + [{"ids": w, "skip_special_tokens": skip} for skip in (False, True) for w in want[True]])
    n = len(texts)
    for k, add in enumerate((False, True)):
        got = [r["ids"] for r in replies[k * n:(k + 1) * n]]
        bad = [(t, w, g) for t, w, g in zip(texts, want[add], got) if w != g]
        assert not bad, f"add_special={add}: {len(bad)}/{n} differ; first: {bad[0]!r}"
    for k, skip in enumerate((False, True)):
        got = [r["text"] for r in replies[(2 + k) * n:(3 + k) * n]]
        want_text = [hf.decode(w, skip_special_tokens=skip) for w in want[True]]
        bad = [(w, g) for w, g in zip(want_text, got) if w != g]
        assert not bad, f"skip_special={skip}: {len(bad)} decodes differ; first: {bad[0]!r}"
