"""Conformance of offloadd-tokenize with the Python `tokenizers` library.

Every tokenizer in shared/data (gpt2, llama2, phi3-mini, and llama3 / qwen2-style / llama2-metaspace
built from its files by text_testlib) is loaded as shipped and in four variants whose added tokens
carry other lstrip / rstrip / single_word / normalized flags, plus extra added tokens (whitespace,
words, a leading space, a composed character...) registered through the library itself. Each one is
compared with the library on the same tokenizer.json over:
  * texts with the tokenizer's special and added tokens at the start, middle and end, with and
    without surrounding spaces, tabs and newlines, and seeded random mixtures of them;
  * the tokenizer's chat template (tokenizer_config.json's, else the one its family publishes, else
    offloadd's built-in one) rendered by transformers' Jinja environment over LIMA and Alpaca
    records;
  * the multilingual test vectors' inputs;
  * seeded random Unicode strings.
Tokenizer directories (loaded like transformers' tokenizer classes, honouring tokenizer_config.json)
must give the ids of the `tokenizers` library on their tokenizer.json, and unsupported tokenizer
families are refused by name. One native process per tokenizer; zero mismatches allowed.
"""

import json
import random
import subprocess
import zlib

import pytest
from tokenizers import AddedToken, Tokenizer

from text_testlib import (CHATML_TOOLS_TEMPLATE, DATA_DIR, LLAMA2_CHAT_TEMPLATE, REAL_TOKENIZERS,
                          SPECIAL_SNIPPETS, TOK_DIR, NativeTokenizer, config_special_tokens,
                          glaive_messages, glaive_records, glaive_tools, run_chat, tool)

BASES = ["gpt2", "llama2", "phi3-mini", "llama3", "qwen2-style", "llama2-metaspace"]
VARIANTS = ["shipped", "strip", "single-word", "normalized-flipped", "mixed"]

# Added through the library in every variant but "shipped": (content, special).
EXTRA_TOKENS = [("<extra_0>", True), ("[MASK]", False), ("hello", False), ("ing", False),
                ("\n\n", False), (" <sp>", False), ("caf\u00e9", False), ("\u2581x", False),
                ("12", False)]

# The Llama-3 instruct template as published with meta-llama/Meta-Llama-3-8B-Instruct.
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

CONTEXTS = ["", " ", "  ", "\n", " \n", "\n\n", "\t", "Hi", " Hi", "Hi ", "\nHi", "\u00e9", "1 "]
WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u2003", "\u3000", "\u0085", "\u2028",
              "\u180e", "\u200b", "\ufeff", "\x0b", "\x0c", "\u2581"]
CHAR_RANGES = [(0x21, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
               (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x3040, 0x30FF),
               (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFB00, 0xFB4F), (0xFF00, 0xFFEF),
               (0x1D400, 0x1D7FF), (0x1F300, 0x1FAFF), (0x0, 0x10FFFF)]
WORDS = ["Hello", "world", "don't", "I'm", "caf\u00e9", "cafe\u0301", "\ufb01x", "1234", "3.14",
         "\u65e5\u672c\u8a9e", "\u0645\u0631\u062d\u0628\u0627", "\U0001F917", "x", "ing", "hello"]

N_RANDOM_UNICODE = 200
N_RANDOM_MIXES = 250
N_LIMA, N_ALPACA = 12, 16


# ---------------------------------------------------------------------------------------------
# Tokenizer variants


def _set_flags(variant, tok):
    """The added-token flags a variant gives `tok` (a tokenizer.json added_tokens entry)."""
    k = zlib.crc32(tok["content"].encode("utf-8")) % 5
    if variant == "strip":
        tok.update(lstrip=True, rstrip=True)
    elif variant == "single-word":
        tok.update(single_word=True, lstrip=k % 2 == 1)
    elif variant == "normalized-flipped":
        tok["normalized"] = not tok["normalized"]
    elif variant == "mixed":
        key = ["lstrip", "rstrip", "single_word", "normalized", None][k]
        if key is not None:
            tok[key] = not tok[key]


def build_variant(base_path, variant, out_path):
    """Writes the variant of tokenizer.json `base_path` to `out_path`, returns its added tokens'
    contents (the ones worth placing in texts)."""
    if variant == "shipped":
        return base_path
    tok = Tokenizer.from_file(str(base_path))
    tok.add_tokens([AddedToken(c, special=s, normalized=True) for c, s in EXTRA_TOKENS])
    data = json.loads(tok.to_str())
    for t in data["added_tokens"]:
        _set_flags(variant, t)
    text = json.dumps(data, ensure_ascii=False)
    Tokenizer.from_str(text)  # the library accepts it
    out_path.write_text(text, encoding="utf-8")
    return out_path


# ---------------------------------------------------------------------------------------------
# Corpus


def placement_texts(tokens, rng):
    """Each token alone and between every pair of contexts; then random mixtures."""
    texts = []
    for t in tokens:
        texts += [pre + t + post for pre in CONTEXTS for post in CONTEXTS]
    pieces = tokens + CONTEXTS + WORDS + [t[: len(t) // 2] for t in tokens if len(t) > 1] + \
        [t[len(t) // 2:] for t in tokens if len(t) > 1]
    for _ in range(N_RANDOM_MIXES):
        texts.append("".join(rng.choice(pieces) for _ in range(rng.randint(2, 9))))
    return texts


def random_unicode(rng, tokens):
    """Strings of random characters from many scripts, whitespace and token fragments."""
    out = []
    for _ in range(N_RANDOM_UNICODE):
        parts = []
        for _ in range(rng.randint(0, 12)):
            r = rng.random()
            if r < 0.2:
                parts.append(rng.choice(WHITESPACE))
            elif r < 0.3 and tokens:
                t = rng.choice(tokens)
                parts.append(t if rng.random() < 0.5 else t[: rng.randint(1, len(t))])
            else:
                lo, hi = rng.choice(CHAR_RANGES)
                for _ in range(rng.randint(1, 4)):
                    cp = rng.randint(lo, hi)
                    while 0xD800 <= cp <= 0xDFFF:
                        cp = rng.randint(lo, hi)
                    parts.append(chr(cp))
        out.append("".join(parts))
    return out


def multilingual_texts():
    base = TOK_DIR / "test_vectors"
    texts = [c["text"] for c in json.loads(
        (base / "multilingual_conformance" / "inputs.json").read_text(encoding="utf-8"))]
    for cases in json.loads((base / "tokenizer_tests.json").read_text(encoding="utf-8")).values():
        texts += [c["input"] for c in cases]
    for name in ["gpt2_encoded_tokens.json", "llama_encoded.json", "llama_3.2_encoded.json"]:
        texts.append(json.loads((base / name).read_text(encoding="utf-8"))["text"])
    return list(dict.fromkeys(texts))


def conversations():
    """LIMA (with its multi-turn histories) and Alpaca records as chat messages."""
    lima = json.loads((DATA_DIR / "lima" / "lima.json").read_text(encoding="utf-8"))
    alpaca = json.loads((DATA_DIR / "alpaca" / "alpaca_5000.json").read_text(encoding="utf-8"))
    multi = [r for r in lima if r["history"]][: N_LIMA // 2]
    records = multi + [r for r in lima if not r["history"]][: N_LIMA - len(multi)]
    records += alpaca[:N_ALPACA]
    convs = []
    for r in records:
        msgs = []
        for user, assistant in r.get("history", []):
            msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        prompt = r["instruction"] + ("\n\n" + r["input"] if r["input"] else "")
        msgs += [{"role": "user", "content": prompt}, {"role": "assistant", "content": r["output"]}]
        convs.append(msgs)
    return convs


def chat_template(base):
    """(template source, bos, eos) used for `base`'s chat texts."""
    if base == "phi3-mini":
        cfg = json.loads((TOK_DIR / base / "tokenizer_config.json").read_text(encoding="utf-8"))
        return cfg["chat_template"], cfg["bos_token"], cfg["eos_token"]
    if base in ("llama2", "llama2-metaspace"):
        return LLAMA2_CHAT_TEMPLATE, "<s>", "</s>"
    if base == "llama3":
        return LLAMA3_CHAT_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>"
    if base == "qwen2-style":
        return CHATML_TOOLS_TEMPLATE, "", "<|im_end|>"
    # GPT-2 publishes no template: offloadd then uses its built-in one.
    source = run_chat([{"builtin_source": True}])[0]["text"]
    return source, "<|endoftext|>", "<|endoftext|>"


def chat_texts(base):
    from transformers.utils.chat_template_utils import _compile_jinja_template
    source, bos, eos = chat_template(base)
    template = _compile_jinja_template(source)
    texts = []
    for msgs in conversations():
        system = [{"role": "system", "content": "You are a helpful assistant.\n"}]
        texts.append(template.render(messages=system + msgs, add_generation_prompt=False,
                                     bos_token=bos, eos_token=eos))
        texts.append(template.render(messages=msgs[:-1], add_generation_prompt=True,
                                     bos_token=bos, eos_token=eos))
    return texts


def corpus(base, variant, added_contents):
    """Texts for one tokenizer, grouped by kind."""
    rng = random.Random(zlib.crc32(f"{base}/{variant}".encode()))
    tokens = list(dict.fromkeys(SPECIAL_SNIPPETS[base] + added_contents))
    return {
        "placement": placement_texts(tokens, rng),
        "chat": _chat_cache(base),
        "multilingual": multilingual_texts(),
        "random-unicode": random_unicode(rng, tokens),
    }


_CHAT = {}


def _chat_cache(base):
    if base not in _CHAT:
        _CHAT[base] = chat_texts(base)
    return _CHAT[base]


# ---------------------------------------------------------------------------------------------
# Comparison


def compare(native_path, ref, groups):
    """Encodes every text with and without special tokens in one native process; returns
    (number of encodings compared, mismatch descriptions)."""
    texts = [(kind, t) for kind, ts in groups.items() for t in ts]
    requests = [{"text": t, "add_special_tokens": a} for a in (False, True) for _, t in texts]
    got = [r["ids"] for r in NativeTokenizer(native_path).run(requests)]
    want = [e.ids for a in (False, True)
            for e in ref.encode_batch([t for _, t in texts], add_special_tokens=a)]
    bad = []
    for i, (w, g) in enumerate(zip(want, got)):
        if w != g:
            kind, text = texts[i % len(texts)]
            bad.append(f"[{kind}, add_special_tokens={i >= len(texts)}] {text[:200]!r}\n"
                       f"  tokenizers: {[ref.id_to_token(x) for x in w][:40]}\n"
                       f"  offloadd:   {[ref.id_to_token(x) for x in g][:40]}")
    return len(want), bad


@pytest.fixture(scope="module")
def variant_paths(tokenizer_paths, tmp_path_factory):
    d = tmp_path_factory.mktemp("conformance")
    cache = {}

    def get(base, variant):
        if (base, variant) not in cache:
            cache[(base, variant)] = build_variant(tokenizer_paths[base], variant,
                                                   d / f"{base}.{variant}.json")
        return cache[(base, variant)]
    return get


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("base", BASES)
def test_tokenizer_conforms(variant_paths, base, variant):
    tool("offloadd-tokenize")
    path = variant_paths(base, variant)
    ref = Tokenizer.from_file(str(path))
    added = [c for c, _ in EXTRA_TOKENS] if variant != "shipped" else []
    groups = corpus(base, variant, added)
    n, bad = compare(path, ref, groups)
    assert not bad, f"{len(bad)}/{n} encodings differ from tokenizers:\n" + "\n".join(bad[:5])
    assert n >= 2 * 750, n
    assert all(len(ts) >= 20 for ts in groups.values()), {k: len(v) for k, v in groups.items()}


@pytest.mark.parametrize("base", ["llama2", "phi3-mini"])
def test_directory_equals_tokenizers_on_its_file(base):
    """A tokenizer directory (tokenizer.json + tokenizer_config.json, the form jobs name) encodes
    like the `tokenizers` library on its tokenizer.json: the shipped normalizer runs on every
    segment between added tokens, e.g. phi3-mini's "<|user|>\\nCan" gives "▁Can" (1815), the
    token the model saw in training, not "Can" (6028). transformers 5's LlamaTokenizer rebuilds
    the pipeline (Metaspace, prepend_scheme "first") and gives 6028; offloadd follows the file."""
    d = TOK_DIR / base
    ref = Tokenizer.from_file(str(d / "tokenizer.json"))
    groups = corpus(base, "directory", [])
    n, bad = compare(d, ref, groups)
    assert not bad, f"{len(bad)}/{n} encodings differ from tokenizers:\n" + "\n".join(bad[:5])
    if base == "phi3-mini":
        ids = NativeTokenizer(d).encode_many(["<|user|>\nCan brain cells move?"], False)[0]
        assert ids[:2] == [32010, 1815]


# ---------------------------------------------------------------------------------------------
# The real tokenizers of the supported families (shared/data/tokenizers/<name>/): vocabularies of 32k to 248k
# with merges written as pairs, ignore_merges, Tekken's and o200k's case-split regexes, Qwen3.6's
# \p{M} classes, SentencePiece v3 with byte fallback and 770 control tokens. Loaded as jobs load
# them (the directory, honouring tokenizer_config.json); one native process per tokenizer.

N_REAL_TOKENS = 12


def all_added_tokens(name):
    return [t["content"] for t in json.loads((TOK_DIR / name / "tokenizer.json").read_text(
        encoding="utf-8"))["added_tokens"]]


def real_added_tokens(name):
    """The added tokens placed in every context: those the chat template uses, up to
    N_REAL_TOKENS, then a deterministic sample of the rest (Llama 3.1 has 256 specials, Mistral
    770, Tekken 1000; every one of them is also placed in three contexts, `every-added`)."""
    d = TOK_DIR / name
    added = all_added_tokens(name)
    template = (d / "chat_template.jinja").read_text(encoding="utf-8")
    first = [t for t in added if t in template][:N_REAL_TOKENS]
    rest = sorted((t for t in added if t not in first),
                  key=lambda t: zlib.crc32(t.encode("utf-8")))
    return first + rest[:max(4, N_REAL_TOKENS - len(first))]


def real_chat_texts(name):
    """The tokenizer's own template rendered by transformers over LIMA / Alpaca chats and Glaive
    tool conversations (skipping those the template refuses, e.g. Mistral's id rules)."""
    from transformers.utils.chat_template_utils import render_jinja_template
    d = TOK_DIR / name
    source = (d / "chat_template.jinja").read_text(encoding="utf-8")
    tokens = config_special_tokens(d / "tokenizer_config.json")
    cases = [(m, None) for m in conversations()]
    tool_recs = [r for r in glaive_records()
                 if any(t["from"] == "function_call" for t in r["conversations"])][:8]
    cases += [(glaive_messages(r, ids=True), glaive_tools(r)) for r in tool_recs]
    texts = []
    for msgs, tools in cases:
        for gen in [False, True]:
            m = msgs[:-1] if gen else msgs
            try:
                texts.append(render_jinja_template([m], tools=tools, chat_template=source,
                                                   add_generation_prompt=gen, **tokens)[0][0])
            except Exception:
                pass
    return texts


@pytest.mark.parametrize("name", REAL_TOKENIZERS)
def test_real_tokenizer_directory_conforms(name):
    """offloadd loads the directory natively and gives the `tokenizers` library's ids on its
    tokenizer.json with zero mismatches, with and without special tokens, over the added tokens
    in context, chat renderings with tools, the multilingual vectors and random Unicode;
    transformers' AutoTokenizer (tokenizer_config.json applied) gives those ids too, checked on
    the chat renderings."""
    tool("offloadd-tokenize")
    d = TOK_DIR / name
    ref = Tokenizer.from_file(str(d / "tokenizer.json"))
    rng = random.Random(zlib.crc32(name.encode()))
    tokens = real_added_tokens(name)
    chats = real_chat_texts(name)
    groups = {
        "placement": placement_texts(tokens, rng),
        "chat": chats,
        "multilingual": multilingual_texts(),
        "random-unicode": random_unicode(rng, tokens),
        "every-added": [c for t in all_added_tokens(name) for c in (t, f" {t}x", f"a{t}\n")],
    }
    n, bad = compare(d, ref, groups)
    assert not bad, f"{len(bad)}/{n} encodings differ from tokenizers:\n" + "\n".join(bad[:5])
    assert n >= 2 * 1500, n
    assert len(chats) >= 60, len(chats)
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(str(d))
    for a in (False, True):
        want = [e.ids for e in ref.encode_batch(chats, add_special_tokens=a)]
        assert [hf(t, add_special_tokens=a)["input_ids"] for t in chats] == want


REGEX_CLASSES = [r"\s", r"\S", r"\p{L}", r"\p{N}", r"\p{M}", r"\p{P}", r"\p{S}", r"\d",
                 r"[^\s\p{L}\p{N}]", r"[^\r\n\p{L}\p{N}]", r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"]


def test_regex_classes_match_oniguruma_on_every_code_point(tokenizer_paths, tmp_path):
    """Pre-tokenizer regexes are Oniguruma's in `tokenizers`: each class used by tokenizer.json
    patterns selects the same characters in offloadd, over every assigned plane. A Split that
    removes the class's characters ahead of GPT-2's byte-level BPE makes any difference show."""
    from tokenizers import Regex, pre_tokenizers
    cps = [c for c in list(range(0x323B0)) + list(range(0xE0000, 0xE01F0))
           if not 0xD800 <= c <= 0xDFFF]
    texts = ["".join(chr(c) for c in cps[i:i + 512]) for i in range(0, len(cps), 512)]
    texts += ["'S'T'RE'VE'M'LL'D \u017f'\u212a"]
    failures = []
    for k, cls in enumerate(REGEX_CLASSES):
        tok = Tokenizer.from_file(str(tokenizer_paths["gpt2"]))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(cls), behavior="removed"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        path = tmp_path / f"class{k}.json"
        tok.save(str(path))
        got = [r["ids"] for r in NativeTokenizer(path).run([{"text": t} for t in texts])]
        want = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        bad = [t[:3] for t, w, g in zip(texts, want, got) if w != g]
        if bad:
            failures.append((cls, len(bad), bad[:3]))
    assert not failures, failures


# The `tokenizers` 0.23 wheel decomposes with older Unicode tables than ICU 72 (e.g. U+32FF, U+11938
# and Unicode 14's U+10781.. stay as they are) and lowercases with newer ones (Unicode 17's
# U+A7CE..), so these differ on characters outside those versions; no tokenizer in shared/data
# uses them. NFC (Qwen2) agrees on every code point.
KNOWN_UNICODE_GAPS = {"NFD": 1, "NFKC": 134, "NFKD": 135, "Lowercase": 55}


@pytest.mark.parametrize("name", ["NFC", "NFD", "NFKC", "NFKD", "Lowercase"])
def test_unicode_normalizers_on_every_code_point(tokenizer_paths, tmp_path, name):
    from tokenizers import normalizers
    tok = Tokenizer.from_file(str(tokenizer_paths["gpt2"]))
    tok.normalizer = getattr(normalizers, name)()
    path = tmp_path / f"{name}.json"
    tok.save(str(path))
    cps = [c for c in list(range(0x323B0)) + list(range(0xE0000, 0xE01F0))
           if not 0xD800 <= c <= 0xDFFF]
    texts = [" ".join(chr(c) for c in cps[i:i + 256]) for i in range(0, len(cps), 256)]
    got = [r["ids"] for r in NativeTokenizer(path).run([{"text": t} for t in texts])]
    want = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    chars = [c for t, w, g in zip(texts, want, got) if w != g for c in t.split(" ")]
    if chars:
        got = [r["ids"] for r in NativeTokenizer(path).run([{"text": c} for c in chars])]
        want = [e.ids for e in tok.encode_batch(chars, add_special_tokens=False)]
    bad = [f"U+{ord(c):04X}" for c, w, g in zip(chars, want, got) if w != g]
    if name in KNOWN_UNICODE_GAPS:
        # Documented in text/README.md; fails loudly if the gap changes either way.
        assert len(bad) == KNOWN_UNICODE_GAPS[name], bad
        return
    assert not bad, bad


def _unsupported_tokenizers():
    from tokenizers import decoders, models, normalizers, pre_tokenizers
    vocab = {"[UNK]": 0, "a": 1, "b": 2, "ab": 3}

    def bpe(**kw):
        return Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")], unk_token="[UNK]", **kw))

    cases = {
        "WordPiece": Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]")),
        "WordLevel": Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]")),
        "Unigram": Tokenizer(models.Unigram([("[UNK]", 0.0), ("a", -1.0), ("b", -1.5)], 0)),
        "dropout": bpe(dropout=0.1),
    }
    for name, attr, component in [
        ("BertNormalizer", "normalizer", normalizers.BertNormalizer()),
        ("StripAccents", "normalizer", normalizers.StripAccents()),
        ("Whitespace", "pre_tokenizer", pre_tokenizers.Whitespace()),
        ("WhitespaceSplit", "pre_tokenizer", pre_tokenizers.WhitespaceSplit()),
        ("BertPreTokenizer", "pre_tokenizer", pre_tokenizers.BertPreTokenizer()),
        ("Punctuation", "pre_tokenizer", pre_tokenizers.Punctuation()),
        ("UnicodeScripts", "pre_tokenizer", pre_tokenizers.UnicodeScripts()),
        ("CharDelimiterSplit", "pre_tokenizer", pre_tokenizers.CharDelimiterSplit("-")),
        ("WordPiece", "decoder", decoders.WordPiece()),
        ("BPEDecoder", "decoder", decoders.BPEDecoder()),
        ("CTC", "decoder", decoders.CTC()),
    ]:
        tok = bpe()
        setattr(tok, attr, component)
        cases[f"{attr}:{name}"] = tok
    return cases


@pytest.mark.without_shared_data
def test_unsupported_families_are_refused_by_name(tmp_path):
    """Tokenizer families offloadd does not implement are refused when loading, naming the
    model or component type, instead of encoding differently from the library."""
    failures = []
    for key, tok in _unsupported_tokenizers().items():
        path = tmp_path / f"{key.replace(':', '_')}.json"
        tok.save(str(path))
        proc = subprocess.run([str(tool("offloadd-tokenize")), "--tokenizer", str(path)],
                              input="", capture_output=True, text=True, timeout=60)
        name = key.split(":")[-1]
        if proc.returncode != 1 or name not in proc.stderr or str(path) not in proc.stderr:
            failures.append((key, proc.returncode, proc.stderr.strip()))
    assert not failures, failures
