"""Helpers for the text/ parity tests: the native CLI drivers, builders for the tokenizers under
test (real files from shared/data plus Llama-3 / Qwen2-style / Metaspace variants built with the
Python `tokenizers` library), test templates and a varied corpus. (Not named conftest so that it
cannot clash with other suites' conftest modules.)"""

import json
import os
import subprocess
from pathlib import Path

import pytest

SOURCE_DIR = Path(os.environ.get("OFFLOADD_SOURCE_DIR", Path(__file__).resolve().parents[3]))
BINARY_DIR = Path(os.environ.get("OFFLOADD_BINARY_DIR", SOURCE_DIR / "build"))
# The real tokenizers and corpora of ../shared/data, beside the checkout (as tests/python/conftest.py
# finds it). Without it the tests that read it skip, saying so (conftest.py); the rest still run.
DATA_DIR = SOURCE_DIR.parent / "shared" / "data"
TOK_DIR = DATA_DIR / "tokenizers"

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2's pre-tokenizer: like Llama-3's but single digits.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPECIALS = (
    ["<|begin_of_text|>", "<|end_of_text|>"]
    + [f"<|reserved_special_token_{i}|>" for i in range(4)]
    + ["<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>"]
    + [f"<|reserved_special_token_{i}|>" for i in range(5, 251)]
)


def tool(name):
    path = BINARY_DIR / "text" / name
    if not path.exists():
        pytest.skip(f"{path} is not built")
    return path


class NativeTokenizer:
    """Drives offloadd-tokenize: one process per batch of JSON-lines requests."""

    def __init__(self, path):
        self.path = str(path)

    def run(self, requests):
        proc = subprocess.run(
            [str(tool("offloadd-tokenize")), "--tokenizer", self.path],
            input="\n".join(json.dumps(r) for r in requests) + "\n",
            capture_output=True, text=True, encoding="utf-8", timeout=300)
        assert proc.returncode == 0, proc.stderr
        replies = [json.loads(line) for line in proc.stdout.split("\n") if line]
        assert len(replies) == len(requests)
        for r in replies:
            assert "error" not in r, r["error"]
        return replies

    def encode_many(self, texts, add_special_tokens):
        return [r["ids"] for r in self.run(
            [{"text": t, "add_special_tokens": add_special_tokens} for t in texts])]

    def decode_many(self, id_lists, skip_special_tokens):
        return [r["text"] for r in self.run(
            [{"ids": ids, "skip_special_tokens": skip_special_tokens} for ids in id_lists])]


def build_llama3(path):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    vocab = json.loads((TOK_DIR / "llama3" / "encoder.json").read_text(encoding="utf-8"))
    merges = [tuple(l.split(" ")) for l in
              (TOK_DIR / "llama3" / "vocab.bpe").read_text(encoding="utf-8").splitlines() if l]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in LLAMA3_SPECIALS])
    assert tok.token_to_id("<|begin_of_text|>") == 128000
    assert tok.token_to_id("<|eot_id|>") == 128009
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", 128000)]),
    ])
    tok.save(str(path))


def build_qwen2_style(path):
    """Qwen2's pipeline (NFC, its split regex, byte-level BPE without ignore_merges, ChatML
    specials) over the Llama-3 vocabulary, since Qwen2's own vocab is not in shared/data."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    vocab = json.loads((TOK_DIR / "llama3" / "encoder.json").read_text(encoding="utf-8"))
    merges = [tuple(l.split(" ")) for l in
              (TOK_DIR / "llama3" / "vocab.bpe").read_text(encoding="utf-8").splitlines() if l]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False)
                            for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False),
                    AddedToken("</tool_call>", special=False, normalized=False)])
    tok.save(str(path))


def build_llama_metaspace(path):
    """The non-legacy Llama form (what transformers writes for legacy=False): no normalizer, a
    Metaspace pre-tokenizer with prepend_scheme "first", and a Metaspace decoder."""
    from tokenizers import Tokenizer
    data = json.loads((TOK_DIR / "llama2" / "tokenizer.json").read_text(encoding="utf-8"))
    data["normalizer"] = None
    data["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                             "prepend_scheme": "first", "split": False}
    data["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Metaspace", "replacement": "\u2581",
                                   "prepend_scheme": "first", "split": False},
        {"type": "Fuse"}]}
    for t in data["added_tokens"]:
        t["normalized"] = False
    text = json.dumps(data, ensure_ascii=False)
    Tokenizer.from_str(text)  # the Python library must accept it too
    path.write_text(text, encoding="utf-8")


SPECIAL_SNIPPETS = {
    "gpt2": ["<|endoftext|>"],
    "llama2": ["<s>", "</s>", "<unk>"],
    "llama2-metaspace": ["<s>", "</s>"],
    "phi3-mini": ["<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>", "<s>", "</s>"],
    "llama3": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "qwen2-style": ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>"],
}


def varied_corpus(name):
    """Texts that exercise every pre-tokenizer branch, plus real data."""
    texts = [
        "", " ", "  ", "\n", "\t", "\r\n", "a", "Hello world", " Hello world", "Hello  world   ",
        "Hello\n\nworld\n", "   leading and trailing   ", "tabs\tand\ttabs\t\t", "\u00a0nbsp\u00a0here",
        "I'm you're we've they'll she'd it's I'M YOU'RE THEY'LL DON'T", "don't won't can't",
        "1234567890 12 123 1234 3.14159 -42 1,000,000 0x1F 1e-9", "٣٤٥ ১২৩ ½ ²",
        "emoji 🤗🚀👍🏽 👨‍👩‍👧‍👦 ❤️ 🇫🇷 #️⃣", "caf\u00e9 cafe\u0301 na\u00efve \u212b \ufb01",
        "日本語のテキストと한국어 그리고 中文字符。", "Привет, мир! Ελληνικά. עברית ومرحبا",
        "हिन्दी ภาษาไทย", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐛𝐨𝐥𝐝 \U0001F600\U00010348",
        "def f(x):\n    return x ** 2  # square\n\n\tif x != None:\n\t\tpass\n",
        "int main() { std::vector<int> v{1,2,3}; for (auto& x : v) x += 1; return 0; }",
        "<html><body class=\"x\">&nbsp;</body></html>", "https://example.com/a?b=c&d=e#f",
        "$$\\frac{a}{b}$$ ~~~ ``` --- ... !!! ??? ;;; ::", "a\u200bb\u200cc\u200dd \ufeff",
        "line1\r\nline2\rline3\u2028line4\u0085end", "    \n    \n", "x" * 300, "ab " * 50,
        "The quick brown fox jumps over the lazy dog.",
        "\u2581already\u2581has\u2581metaspace", "<0x41> looks like a byte token",
        "trailing space ", " ", "\u3000ideographic space", "mixed 123abc456 αβγ123",
        # Unicode whitespace and near-whitespace that regex engines disagree on.
        "a\u180eb \u2007x\u0085y\u001cz\u2060w\u1680v\u202fu\u205ft\u000bs\u000c r",
        "\u180e\u180e x \u2007\u2007\n\u0085 end",
    ]
    for s in SPECIAL_SNIPPETS[name]:
        texts += [s, f"{s}hello", f"hello{s}", f"a {s} b", f"{s}{s}", f"  {s}  x  ",
                  f"\n{s}\nnext", f"pre{s} post {s}"]
    inputs = json.loads((TOK_DIR / "test_vectors" / "multilingual_conformance" / "inputs.json")
                        .read_text(encoding="utf-8"))
    texts += [c["text"] for c in inputs]
    alpaca = json.loads((DATA_DIR / "alpaca" / "alpaca_5000.json").read_text(encoding="utf-8"))
    for rec in alpaca[:150]:
        texts += [rec["instruction"] + "\n" + rec["input"], rec["output"]]
    return texts


# Llama-2-chat's template (the one published with meta-llama/Llama-2-*-chat-hf), which the
# llama2 tokenizer_config.json in shared/data does not carry.
LLAMA2_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)

# A ChatML template with tool calls in the style of Qwen2 / Hermes, written for this test.
CHATML_TOOLS_TEMPLATE = """{%- set ns = namespace(system=none, calls=0) -%}
{%- if messages and messages[0].role == 'system' -%}
  {%- set ns.system = messages[0].content -%}
{%- endif -%}
{%- if tools or ns.system is not none -%}
{{ '<|im_start|>system\\n' }}{{ ns.system if ns.system is not none else 'You are a helpful assistant.' }}
{%- if tools %}

# Tools
<tools>
{% for tool in tools -%}
{{ tool | tojson }}
{% endfor -%}
</tools>
{%- endif %}<|im_end|>
{% endif -%}
{%- for message in messages -%}
  {%- if message.role == 'system' and loop.first -%}
  {%- elif message.role == 'assistant' and message.tool_calls is defined and message.tool_calls -%}
{{ '<|im_start|>assistant\\n' }}{% if message.content %}{{ message.content | trim + '\\n' }}{% endif %}
    {%- for call in message.tool_calls %}
      {%- set ns.calls = ns.calls + 1 %}
{{ '<tool_call>\\n{"name": "' ~ call.function.name ~ '", "arguments": ' ~ call.function.arguments | tojson ~ '}\\n</tool_call>' }}
    {%- endfor %}<|im_end|>
{% elif message.role == 'tool' -%}
{{ '<|im_start|>user\\n<tool_response>\\n' ~ message.content ~ '\\n</tool_response><|im_end|>\\n' }}
  {%- else -%}
{{ '<|im_start|>' + message.role + '\\n' + message.content | trim + '<|im_end|>\\n' }}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}
"""


def run_chat(requests):
    proc = subprocess.run([str(tool("offloadd-chat"))],
                          input="\n".join(json.dumps(r) for r in requests) + "\n",
                          capture_output=True, text=True, encoding="utf-8", timeout=300)
    assert proc.returncode == 0, proc.stderr
    replies = [json.loads(line) for line in proc.stdout.split("\n") if line]
    assert len(replies) == len(requests)
    return replies


# ---- the real tokenizers and chat templates of the supported families --------------------------------------

# Tokenizer directories (tokenizer.json + tokenizer_config.json + chat_template.jinja).
REAL_TOKENIZERS = ["qwen3", "qwen3.6", "llama3.1", "mistral-7b-v0.3", "mistral-tekken", "gpt-oss"]
# Template-only folders: name -> (template file, tokenizer_config.json or None, special tokens
# the family uses when the folder has no config; PROVENANCE.md names them).
TEMPLATE_ONLY = {
    "gemma3": (TOK_DIR / "gemma3-template" / "chat_template.jinja",
               TOK_DIR / "gemma3-template" / "tokenizer_config.json", {}),
    "deepseek-v3.1": (TOK_DIR / "chat-templates" / "deepseek-ai-DeepSeek-V3.1.jinja", None,
                      {"bos_token": "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
                       "eos_token": "<\uff5cend\u2581of\u2581sentence\uff5c>"}),
    "glm-4.6": (TOK_DIR / "chat-templates" / "GLM-4.6.jinja", None,
                {"eos_token": "<|endoftext|>"}),
    "smollm3": (TOK_DIR / "chat-templates" / "HuggingFaceTB-SmolLM3-3B.jinja",
                TOK_DIR / "chat-templates" / "HuggingFaceTB-SmolLM3-3B.tokenizer_config.json", {}),
}


def config_special_tokens(config_path):
    """The special-token variables transformers passes to a template, from tokenizer_config.json."""
    config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    out = {}
    for key in ["bos_token", "eos_token", "unk_token", "pad_token"]:
        v = config.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        out[key] = v or ""
    return out


def template_dir(name, tmp):
    """A directory offloadd's ChatTemplate::FromDirectory reads for `name` (a REAL_TOKENIZERS
    folder as shipped, or a template-only one laid out as chat_template.jinja plus a config), and
    (template source, special tokens) for transformers' renderer."""
    if name in REAL_TOKENIZERS:
        d = TOK_DIR / name
        return d, (d / "chat_template.jinja").read_text(encoding="utf-8"), \
            config_special_tokens(d / "tokenizer_config.json")
    source_path, config_path, tokens = TEMPLATE_ONLY[name]
    d = Path(tmp) / name
    d.mkdir(parents=True, exist_ok=True)
    source = source_path.read_text(encoding="utf-8")
    (d / "chat_template.jinja").write_text(source, encoding="utf-8")
    if config_path is not None:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        config.pop("chat_template", None)
        tokens = config_special_tokens(config_path)
    else:
        config = dict(tokens)
    (d / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    full = {k: "" for k in ["bos_token", "eos_token", "unk_token", "pad_token"]}
    full.update(tokens)
    return d, source, full


def glaive_records():
    return json.loads((DATA_DIR / "glaive_toolcall_sharegpt" / "glaive_toolcall_en_demo.json")
                      .read_text(encoding="utf-8"))


def glaive_tools(rec):
    """ShareGPT's bare function schemas in OpenAI's form (what offloadd's dataset does too)."""
    tools = json.loads(rec["tools"]) if rec.get("tools") else []
    return [t if "type" in t else {"type": "function", "function": t} for t in tools] or None


def glaive_messages(rec, ids=False):
    """A Glaive ShareGPT record as OpenAI-style messages: function_call turns become assistant
    messages with tool_calls, observations tool messages (the rule offloadd's dataset applies).
    With `ids`, calls and results carry 9-character ids (Mistral's templates require them)."""
    roles = {"human": "user", "gpt": "assistant", "system": "system", "observation": "tool"}
    msgs, n = [], 0
    for turn in rec["conversations"]:
        if turn["from"] == "function_call":
            call = json.loads(turn["value"])
            calls = call if isinstance(call, list) else [call]
            tool_calls = []
            for c in calls:
                n += 1
                tc = {"type": "function", "function": {"name": c["name"],
                                                       "arguments": c.get("arguments", {})}}
                if ids:
                    tc = {"id": f"call{n:05d}", **tc}
                tool_calls.append(tc)
            msgs.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
        else:
            m = {"role": roles[turn["from"]], "content": turn["value"]}
            if ids and m["role"] == "tool":
                m["tool_call_id"] = f"call{n:05d}"
            msgs.append(m)
    return msgs
