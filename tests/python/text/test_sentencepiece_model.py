"""A model directory with only a SentencePiece tokenizer.model (no tokenizer.json) is read through
libsentencepiece (text/sentencepiece_model.h). Its ids equal the `sentencepiece` package's on the
same file and transformers' converted fast tokenizer's (the shipped tokenizer.json of each
directory, which transformers' LlamaConverter made from that tokenizer.model: legacy for Llama 2,
non-legacy for Mistral v0.3) on the Alpaca and LIMA records, with 0 mismatches (but for the one
record that begins with spaces, where the two references disagree and offloadd follows
SentencePiece); special tokens, BOS/EOS and decoding behave as that fast tokenizer's."""

import json
import shutil

import pytest

from text_testlib import DATA_DIR, TOK_DIR, NativeTokenizer, tool

sentencepiece = pytest.importorskip("sentencepiece")
tokenizers = pytest.importorskip("tokenizers")


def record_texts(limit_alpaca=1500, limit_lima=300):
    """The fields of real records, as training renders them one by one."""
    texts = []
    for r in json.loads((DATA_DIR / "alpaca" / "alpaca_5000.json").read_text("utf-8"))[:limit_alpaca]:
        texts += [r["instruction"], r["output"]] + ([r["input"]] if r["input"] else [])
    for r in json.loads((DATA_DIR / "lima" / "lima.json").read_text("utf-8"))[:limit_lima]:
        texts += [r["instruction"], r["output"]]
    return [t for t in texts if t]


def model_only_dir(tmp_path, name, config=None):
    d = tmp_path / name
    d.mkdir()
    shutil.copy(TOK_DIR / name / "tokenizer.model", d / "tokenizer.model")
    if config is not None:
        (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d


def test_llama2_tokenizer_model_equals_sentencepiece_and_the_converted_fast_tokenizer(tmp_path):
    tool("offloadd-tokenize")
    d = model_only_dir(tmp_path, "llama2")  # no config: transformers' defaults (legacy, BOS)
    texts = record_texts()
    assert len(texts) > 3000
    native = NativeTokenizer(d)
    got = native.encode_many(texts, add_special_tokens=False)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
    fast = tokenizers.Tokenizer.from_file(str(TOK_DIR / "llama2" / "tokenizer.json"))
    want_sp = sp.encode(texts)
    want_fast = [e.ids for e in fast.encode_batch(texts, add_special_tokens=False)]
    bad_sp = [t for t, g, w in zip(texts, got, want_sp) if g != w]
    bad_fast = [t for t, g, w in zip(texts, got, want_fast) if g != w]
    assert not bad_sp, f"{len(bad_sp)}/{len(texts)} differ from sentencepiece, e.g. {bad_sp[:3]!r}"
    assert not bad_fast, f"{len(bad_fast)}/{len(texts)} differ from tokenizers, e.g. {bad_fast[:3]!r}"
    # BOS as LlamaTokenizerFast adds it. (This 2023 tokenizer.json marks <s> and </s>
    # normalized: true, which today's converter no longer writes, so control tokens written in the
    # text are checked on Mistral's below.)
    head = texts[:300] + [" leading space", "  two", "tab\there", "line\n\nbreaks", "😀 ünï 中文"]
    assert native.encode_many(head, add_special_tokens=True) == [
        e.ids for e in fast.encode_batch(head, add_special_tokens=True)]
    assert native.encode_many(head[-5:], add_special_tokens=False) == sp.encode(head[-5:])
    # Decoding as SentencePiece does (which drops control tokens); with the special tokens kept
    # they are written out as LlamaTokenizerFast's decoder writes them.
    ids = [sp.encode(t) for t in head]
    assert native.decode_many([[1] + i + [2] for i in ids], True) == sp.decode(ids)
    assert native.decode_many([[1] + ids[0] + [2]], False) == ["<s> " + sp.decode(ids[0]) + "</s>"]


def test_mistral_v3_tokenizer_model_follows_its_config(tmp_path):
    """Mistral v0.3's config says legacy: false: the text after a control token such as [INST]
    gets no "▁" prefix, as in the non-legacy tokenizer.json converted from this file, so that chat
    renderings give mistral-common's ids (its PROVENANCE.md)."""
    tool("offloadd-tokenize")
    config = json.loads((TOK_DIR / "mistral-7b-v0.3" / "tokenizer_config.json").read_text("utf-8"))
    assert config["legacy"] is False
    d = model_only_dir(tmp_path, "mistral-7b-v0.3",
                       {k: config[k] for k in ("add_bos_token", "add_eos_token", "legacy",
                                               "bos_token", "eos_token", "unk_token")})
    texts = record_texts()
    native = NativeTokenizer(d)
    got = native.encode_many(texts, add_special_tokens=False)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
    fast = tokenizers.Tokenizer.from_file(str(TOK_DIR / "mistral-7b-v0.3" / "tokenizer.json"))
    want_sp = sp.encode(texts)
    want_fast = [e.ids for e in fast.encode_batch(texts, add_special_tokens=False)]
    bad_sp = [t for t, g, w in zip(texts, got, want_sp) if g != w]
    assert not bad_sp, f"{len(bad_sp)}/{len(texts)} differ from sentencepiece, e.g. {bad_sp[:3]!r}"
    # The two references disagree where a text begins with spaces (PROVENANCE.md): SentencePiece
    # (and transformers' slow LlamaTokenizer) add "▁" before "  Any", Metaspace(prepend_scheme
    # first) does not. offloadd follows SentencePiece there; every other record equals the fast
    # tokenizer. One LIMA record of the 4,188 fields begins with spaces.
    bad_fast = [t for t, g, w in zip(texts, got, want_fast) if g != w]
    assert all(t.startswith(" ") for t in bad_fast), [t[:40] for t in bad_fast if not t.startswith(" ")]
    assert len(bad_fast) == sum(t.startswith(" ") for t in texts) == 1, len(bad_fast)
    chats = [f"[INST] {r}[/INST] {o}</s>" for r, o in zip(texts[0:200:2], texts[1:200:2])]
    chats += ["<s>[INST] What is the capital of France?[/INST] Paris.</s>[INST] And of Germany?[/INST]"]
    for a in (False, True):
        assert native.encode_many(chats, add_special_tokens=a) == [
            e.ids for e in fast.encode_batch(chats, add_special_tokens=a)]
    ids = [fast.encode(t).ids for t in chats[:50]]
    for skip in (True, False):
        assert native.decode_many(ids, skip) == [fast.decode(i, skip_special_tokens=skip) for i in ids]
    # A control token in the vocabulary but not in the text stays text: [control_12] is one token
    # only when written exactly.
    odd = ["[control_12]x", "[INST][INST]", "<unk>x", "a [TOOL_CALLS] b"]
    assert native.encode_many(odd, add_special_tokens=False) == [
        e.ids for e in fast.encode_batch(odd, add_special_tokens=False)]


def test_tokenizer_json_still_wins_beside_tokenizer_model(tmp_path):
    """Both files present: tokenizer.json is used, as before (Llama 2's directory has both)."""
    tool("offloadd-tokenize")
    d = TOK_DIR / "llama2"
    assert (d / "tokenizer.model").exists() and (d / "tokenizer.json").exists()
    fast = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    texts = ["Hello world", "<s>x"]
    assert NativeTokenizer(d).encode_many(texts, True) == [e.ids for e in fast.encode_batch(texts)]


@pytest.mark.without_shared_data
def test_a_file_that_is_not_a_sentencepiece_model_is_refused_by_name(tmp_path):
    import subprocess
    d = tmp_path / "bad"
    d.mkdir()
    (d / "tokenizer.model").write_bytes(b"\x00not a model proto")
    proc = subprocess.run([str(tool("offloadd-tokenize")), "--tokenizer", str(d)],
                          input="", capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "tokenizer.model" in proc.stderr and "SentencePiece" in proc.stderr, proc.stderr


@pytest.mark.without_shared_data
def test_libsentencepiece_is_only_in_the_shim():
    """Debian's libsentencepiece exports the protobuf-lite 3.14 it bundles; in a process that also
    uses the system protobuf (gRPC: the daemon, the executor) it aborts or crashes. offloadd's
    programs never link it: only liboffloadd_sentencepiece.so does, loaded with RTLD_DEEPBIND."""
    import subprocess
    shim = tool("liboffloadd_sentencepiece.so")
    program = tool("offloadd-tokenize")

    def needed(path):
        out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
        return [line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]

    assert any(n.startswith("libsentencepiece.so") for n in needed(shim)), needed(shim)
    assert not [n for n in needed(program) if "sentencepiece" in n], needed(program)
