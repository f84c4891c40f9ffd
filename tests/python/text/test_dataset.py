"""offloadd's dataset pipeline (offloadd-dataset) against a Python reference written here with
transformers (apply_chat_template, the tokenizer it loads) and the documented masking, packing,
shuffling and cursor rules."""

import json
import shutil
import subprocess

import pytest

from text_testlib import (CHATML_TOOLS_TEMPLATE, DATA_DIR, TOK_DIR, glaive_messages, glaive_records,
                          glaive_tools, run_chat, tool)

IGNORE = -100


def run_dataset(args, check=True):
    proc = subprocess.run([str(tool("offloadd-dataset"))] + [str(a) for a in args],
                          capture_output=True, text=True, encoding="utf-8", timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr
    if proc.returncode != 0:
        return proc, None, None
    lines = [json.loads(l) for l in proc.stdout.split("\n") if l]
    return proc, lines[0]["stats"], lines[1:]


def load_hf(d):
    """transformers' tokenizer for directory `d`, encoding through the `tokenizers` library on
    d/tokenizer.json: what offloadd follows (transformers 5's LlamaTokenizer rebuilds that
    pipeline and encodes differently after added tokens; see test_tokenizer_conformance.py)."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(str(d))
    if type(hf).__name__ == "LlamaTokenizer":
        hf._tokenizer = Tokenizer.from_file(str(d / "tokenizer.json"))
    return hf


# ---- Python reference -------------------------------------------------------------------------

def alpaca_messages(rec):
    msgs = []
    if rec.get("system"):
        msgs.append({"role": "system", "content": rec["system"]})
    for u, a in rec.get("history") or []:
        msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
    user = rec["instruction"] + ("\n" + rec["input"] if rec.get("input") else "")
    return msgs + [{"role": "user", "content": user}, {"role": "assistant", "content": rec["output"]}]


def sharegpt_messages(rec):
    """ShareGPT turns as messages: function_call turns are assistant tool calls (glaive_messages)."""
    return glaive_messages(rec)


def ref_chat(render, encode, msgs, tools, mask):
    """render(msgs, gen) -> text; encode(text) -> (ids, char start offsets)."""
    full = render(msgs, False)
    spans = []
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        prefix = render(msgs[:k], True)
        upto = render(msgs[:k + 1], False)
        assert full.startswith(prefix)
        end = 0
        while end < min(len(upto), len(full)) and upto[end] == full[end]:
            end += 1
        if end < len(upto):
            # The reply renders differently as the last message (Qwen3's empty <think> block):
            # the longest tail of that rendering which the full text continues with there.
            end = max(end, len(prefix) + next((len(upto) - a for a in range(len(prefix) + 1, len(upto))
                                               if full.startswith(upto[a:], len(prefix))), 0))
        spans.append((len(prefix), end))
    ids, starts = encode(full)
    labels = [i if (not mask or any(b <= s < e for b, e in spans)) else IGNORE
              for i, s in zip(ids, starts)]
    return ids, labels


def hf_render(hf, tools=None):
    return lambda msgs, gen: hf.apply_chat_template(msgs, tools=tools, tokenize=False,
                                                    add_generation_prompt=gen)


def hf_encode(hf, add_special=False):
    def encode(text):
        e = hf.backend_tokenizer.encode(text, add_special_tokens=add_special)
        return e.ids, [s for s, _ in e.offsets]
    return encode


def compare_docs(got, want):
    assert len(got) == len(want)
    for i, (g, (ids, labels)) in enumerate(zip(got, want)):
        assert g["input_ids"] == ids, f"record {i}: ids differ"
        assert g["labels"] == labels, f"record {i}: labels differ"


# ---- chat-like formats ------------------------------------------------------------------------

@pytest.mark.parametrize("mask", [True, False])
def test_alpaca_with_phi3_template(tmp_path, mask):
    d = TOK_DIR / "phi3-mini"
    hf = load_hf(d)
    records = json.loads((DATA_DIR / "alpaca" / "alpaca_5000.json").read_text("utf-8"))[:150]
    data = tmp_path / "alpaca.json"
    data.write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
    args = ["--tokenizer", d, "--data", data] + ([] if mask else ["--no-mask-prompt"])
    _, stats, docs = run_dataset(args)
    want = [ref_chat(hf_render(hf), hf_encode(hf), alpaca_messages(r), None, mask) for r in records]
    compare_docs(docs, want)
    # The ids are exactly what transformers' apply_chat_template(tokenize=True) produces.
    for r, doc in zip(records[:20], docs):
        enc = hf.apply_chat_template(alpaca_messages(r), tokenize=True)
        assert doc["input_ids"] == enc["input_ids"]
    assert stats["documents"] == 150 and stats["skipped"] == 0
    if mask:
        assert 0 < stats["trained_tokens"] < stats["tokens"]
        # The trained tokens of a document decode to the reply and the end-of-turn markup
        # ("<|end|>" has rstrip, so it absorbs the template's "\n").
        trained = [t for t, l in zip(docs[0]["input_ids"], docs[0]["labels"]) if l != IGNORE]
        assert hf.decode(trained) == records[0]["output"] + "<|end|><|endoftext|>"
    else:
        assert stats["trained_tokens"] == stats["tokens"]


def test_lima_multi_turn_history(tmp_path):
    d = TOK_DIR / "phi3-mini"
    hf = load_hf(d)
    lima = json.loads((DATA_DIR / "lima" / "lima.json").read_text("utf-8"))
    records = [r for r in lima if r["history"]][:15] + lima[:15]
    data = tmp_path / "lima.jsonl"
    data.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in records), encoding="utf-8")
    _, _, docs = run_dataset(["--tokenizer", d, "--data", data, "--format", "alpaca"])
    want = [ref_chat(hf_render(hf), hf_encode(hf), alpaca_messages(r), None, True) for r in records]
    compare_docs(docs, want)
    # Every assistant turn of a multi-turn record is trained, not only the last.
    first = docs[0]
    runs = sum(1 for i, l in enumerate(first["labels"])
               if l != IGNORE and (i == 0 or first["labels"][i - 1] == IGNORE))
    assert runs == len(records[0]["history"]) + 1


def test_sharegpt_tool_calls_with_chatml_template(tmp_path):
    d = tmp_path / "chatml"
    d.mkdir()
    shutil.copy(TOK_DIR / "llama2" / "tokenizer.json", d / "tokenizer.json")
    config = json.loads((TOK_DIR / "llama2" / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    (d / "chat_template.jinja").write_text(CHATML_TOOLS_TEMPLATE)  # takes precedence
    hf = load_hf(d)
    records = json.loads((DATA_DIR / "glaive_toolcall_sharegpt" / "glaive_toolcall_en_demo.json")
                         .read_text("utf-8"))[:40]
    _, _, docs = run_dataset(["--tokenizer", d, "--data",
                              DATA_DIR / "glaive_toolcall_sharegpt" / "glaive_toolcall_en_demo.json"])
    want = []
    for r in records:
        tools = glaive_tools(r)
        want.append(ref_chat(hf_render(hf, tools), hf_encode(hf), sharegpt_messages(r),
                             tools, True))
    compare_docs(docs[:40], want)


# ---- tool calls through the real templates -----------------------------------------------------

def openai_record(rec):
    """A Glaive record in OpenAI's fine-tuning form: messages with tool_calls whose arguments are
    JSON strings (as OpenAI's API writes them), tool messages, and tools."""
    msgs = glaive_messages(rec)
    for m in msgs:
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = json.dumps(c["function"]["arguments"])
    return {"messages": msgs, "tools": glaive_tools(rec)}


TOOL_MARKERS = {"qwen3": "<tool_call>", "llama3.1": '{"name": "', "gpt-oss": "<|call|>"}


@pytest.mark.parametrize("form", ["sharegpt", "openai"])
@pytest.mark.parametrize("name", ["qwen3", "llama3.1", "gpt-oss"])
def test_tool_calls_render_through_the_template(tmp_path, name, form):
    """Glaive's function_call / observation turns (ShareGPT) and OpenAI-style tool_calls / tool
    messages render through the template's own tool-call syntax, exactly as transformers'
    apply_chat_template(messages, tools=...) with tool_calls (text and ids), and only the
    assistant's tokens are trained: its replies and its tool calls, not the prompts, the tool
    schemas or the tool results. The mask is the reference computed from transformers'
    renderings of prefixes (ref_chat)."""
    d = TOK_DIR / name
    hf = load_hf(d)
    records = [r for r in glaive_records()
               if any(t["from"] == "function_call" for t in r["conversations"])][:10]
    records += [r for r in glaive_records()
                if not any(t["from"] == "function_call" for t in r["conversations"])][:2]
    data = tmp_path / "tools.jsonl"
    lines = records if form == "sharegpt" else [openai_record(r) for r in records]
    data.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in lines), encoding="utf-8")
    _, stats, docs = run_dataset(["--tokenizer", d, "--data", data])
    want = []
    for r in records:
        msgs, tools = glaive_messages(r), glaive_tools(r)
        want.append(ref_chat(hf_render(hf, tools), hf_encode(hf), msgs, tools, True))
        text = hf.apply_chat_template(msgs, tools=tools, tokenize=False)
        assert TOOL_MARKERS[name] in text or not msgs[1].get("tool_calls")
    compare_docs(docs, want)
    for r, doc in zip(records[:4], docs):
        enc = hf.apply_chat_template(glaive_messages(r), tools=glaive_tools(r), tokenize=True,
                                     return_dict=True)
        assert doc["input_ids"] == list(enc["input_ids"])
    assert stats["documents"] == len(records) and stats["skipped"] == 0
    # The first record's call is trained; its tool result and its prompts are not.
    msgs = glaive_messages(records[0])
    trained = hf.decode([l for l in docs[0]["labels"] if l != IGNORE])
    call = next(m for m in msgs if m.get("tool_calls"))["tool_calls"][0]["function"]
    result = next(m for m in msgs if m["role"] == "tool")["content"]
    assert json.dumps(call["arguments"]) in trained and call["name"] in trained
    assert result not in trained
    assert all(m["content"] not in trained for m in msgs if m["role"] == "user")
    assert all(m["content"] in trained for m in msgs if m["role"] == "assistant")


def test_builtin_template_for_tokenizer_without_one(tmp_path):
    from transformers.utils.chat_template_utils import _compile_jinja_template
    source = run_chat([{"builtin_source": True}])[0]["text"]
    template = _compile_jinja_template(source)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(TOK_DIR / "gpt2" / "tokenizer.json"))

    def render(msgs, gen):
        return template.render(messages=msgs, add_generation_prompt=gen, bos_token="",
                               eos_token="<|endoftext|>")

    def encode(text):
        e = tok.encode(text, add_special_tokens=False)
        return e.ids, [s for s, _ in e.offsets]

    records = json.loads((DATA_DIR / "alpaca" / "alpaca_5000.json").read_text("utf-8"))[:60]
    data = tmp_path / "a.json"
    data.write_text(json.dumps(records), encoding="utf-8")
    _, _, docs = run_dataset(["--tokenizer", TOK_DIR / "gpt2", "--data", data])
    compare_docs(docs, [ref_chat(render, encode, alpaca_messages(r), None, True) for r in records])
    assert render(alpaca_messages(records[0]), False).startswith("### User:\n")


# ---- text, prompt/completion, pretokenized ----------------------------------------------------

def test_text_prompt_completion_and_pretokenized(tmp_path):
    d = TOK_DIR / "llama2"
    hf = load_hf(d)
    eos = hf.convert_tokens_to_ids("</s>")
    texts = ["Once upon a time, there was a tokenizer.", "  leading spaces\nand ünïcode 🤗", ""]
    pcs = [("Q: What is 2+2?\nA:", " 4"), ("Translate 'chat' to English:", " cat"),
           ("", "only completion")]
    records = ([{"text": t} for t in texts] + [{"prompt": p, "completion": c} for p, c in pcs]
               + [{"input_ids": [1, 15043, 3186]},
                  {"input_ids": [1, 15043, 3186], "labels": [-100, -100, 3186]}])
    data = tmp_path / "mixed.jsonl"
    data.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in records), encoding="utf-8")
    _, stats, docs = run_dataset(["--tokenizer", d, "--data", data])
    want = []
    for t in texts:
        ids = hf(t)["input_ids"] + [eos]
        want.append((ids, list(ids)))
    for p, c in pcs:
        e = hf.backend_tokenizer.encode(p + c, add_special_tokens=True)
        ids = e.ids + [eos]
        labels = [IGNORE if s < len(p) else i for i, (s, _) in zip(e.ids, e.offsets)] + [eos]
        want.append((ids, labels))
    want.append(([1, 15043, 3186], [1, 15043, 3186]))
    want.append(([1, 15043, 3186], [-100, -100, 3186]))
    compare_docs(docs, want)
    assert stats["records"] == len(records)


# ---- errors -----------------------------------------------------------------------------------

def test_bad_lines_are_errors_with_file_and_line_or_skipped(tmp_path):
    d = TOK_DIR / "gpt2"
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text('{"text": "ok"}\n\n{"text": "broken"\n{"nothing": 1}\n{"text": "fine"}\n')
    proc, _, _ = run_dataset(["--tokenizer", d, "--data", jsonl], check=False)
    assert proc.returncode == 1
    assert f"{jsonl}:3: not valid JSON" in proc.stderr
    _, stats, docs = run_dataset(["--tokenizer", d, "--data", jsonl, "--skip-bad-records"])
    assert stats["skipped"] == 2 and len(docs) == 2
    assert stats["first_errors"][0].startswith(f"{jsonl}:3:")
    assert stats["first_errors"][1].startswith(f"{jsonl}:4: cannot tell the record format")

    array = tmp_path / "bad.json"
    records = [{"instruction": "a", "input": "", "output": "b"},
               {"instruction": "c", "input": ""},  # no output
               {"instruction": "e", "input": "", "output": 5}]
    array.write_text(json.dumps(records, indent=2))
    line_of_second = json.dumps(records, indent=2).split("\n").index("  {", 2) + 1
    proc, _, _ = run_dataset(["--tokenizer", d, "--data", array], check=False)
    assert proc.returncode == 1
    assert f"{array}:{line_of_second}: missing \"output\"" in proc.stderr
    _, stats, docs = run_dataset(["--tokenizer", d, "--data", array, "--skip-bad-records"])
    assert stats["skipped"] == 2 and len(docs) == 1

    truncated = tmp_path / "trunc.json"
    truncated.write_text('[{"text": "a"},\n {"text": "b"')
    proc, _, _ = run_dataset(["--tokenizer", d, "--data", truncated], check=False)
    assert proc.returncode == 1 and f"{truncated}:2: unterminated JSON array" in proc.stderr

    pretok = tmp_path / "p.jsonl"
    pretok.write_text('{"input_ids": [1, 2, 99999999]}\n')
    proc, _, _ = run_dataset(["--tokenizer", d, "--data", pretok], check=False)
    assert proc.returncode == 1 and f"{pretok}:1: input_ids: 99999999" in proc.stderr


# ---- packing, shuffle, cursor -----------------------------------------------------------------

MASK64 = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def epoch_order(n, seed, epoch, shuffle):
    order = list(range(n))
    if not shuffle:
        return order
    state = seed ^ ((epoch * 0x9E3779B97F4A7C15) & MASK64)
    for i in range(n - 1, 0, -1):
        state, r = splitmix64(state)
        j = r % (i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def ref_pack(docs, count, max_len, seed, shuffle=True, packing=True, drop=False, pad_id=None):
    out, epoch, index, n = [], 0, 0, len(docs)
    while len(out) < count:
        seq = {"input_ids": [], "labels": [], "position_ids": [], "cu_seqlens": [],
               "document_ids": [], "sources": []}
        while True:
            if index >= n:
                epoch, index = epoch + 1, 0
                if seq["input_ids"]:
                    break
                continue
            src = epoch_order(n, seed, epoch, shuffle)[index]
            ids, labels = docs[src]["input_ids"], docs[src]["labels"]
            length = len(ids)
            if length == 0:
                index += 1
                continue
            if length > max_len:
                if drop:
                    index += 1
                    continue
                length = max_len
            if seq["input_ids"] and (not packing or len(seq["input_ids"]) + length > max_len):
                break
            if not seq["cu_seqlens"]:
                seq["cu_seqlens"].append(0)
            k = len(seq["sources"])
            seq["input_ids"] += ids[:length]
            seq["labels"] += [IGNORE] + labels[1:length]
            seq["position_ids"] += list(range(length))
            seq["document_ids"] += [k] * length
            seq["cu_seqlens"].append(len(seq["input_ids"]))
            seq["sources"].append(src)
            index += 1
            if len(seq["input_ids"]) == max_len or not packing:
                break
        if pad_id is not None:
            pad = max_len - len(seq["input_ids"])
            seq["input_ids"] += [pad_id] * pad
            seq["labels"] += [IGNORE] * pad
            seq["position_ids"] += [0] * pad
            seq["document_ids"] += [-1] * pad
        seq["state"] = {"epoch": epoch, "index": index}
        out.append(seq)
    return out


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
    records = json.loads((DATA_DIR / "alpaca" / "alpaca_5000.json").read_text("utf-8"))[:40]
    path = tmp_path_factory.mktemp("pack") / "small.json"
    path.write_text(json.dumps(records), encoding="utf-8")
    _, _, docs = run_dataset(["--tokenizer", TOK_DIR / "gpt2", "--data", path])
    return path, docs


@pytest.mark.parametrize("opts", [
    {"max_len": 256, "seed": 1234},
    {"max_len": 64, "seed": 7},                            # truncation of long documents
    {"max_len": 64, "seed": 7, "drop": True},
    {"max_len": 300, "seed": 0, "shuffle": False, "pad_id": 50256},
    {"max_len": 128, "seed": 3, "packing": False},
])
def test_packing_matches_reference(small_dataset, opts):
    path, docs = small_dataset
    count = 60  # more than one epoch in every configuration
    args = ["--tokenizer", TOK_DIR / "gpt2", "--data", path, "--pack", count,
            "--max-seq-length", opts["max_len"], "--seed", opts["seed"]]
    if not opts.get("shuffle", True):
        args.append("--no-shuffle")
    if not opts.get("packing", True):
        args.append("--no-packing")
    if opts.get("drop"):
        args.append("--drop-overlong")
    if "pad_id" in opts:
        args += ["--pad-id", opts["pad_id"]]
    _, _, seqs = run_dataset(args)
    want = ref_pack(docs, count, opts["max_len"], opts["seed"], opts.get("shuffle", True),
                    opts.get("packing", True), opts.get("drop", False), opts.get("pad_id"))
    assert len(seqs) == count
    for i, (g, w) in enumerate(zip(seqs, want)):
        for key in ["input_ids", "labels", "position_ids", "cu_seqlens", "document_ids", "sources"]:
            assert g[key] == w[key], f"sequence {i}: {key} differs"
        assert (g["state"]["epoch"], g["state"]["index"]) == (w["state"]["epoch"],
                                                              w["state"]["index"])
        assert len(g["input_ids"]) <= opts["max_len"]
    assert max(s["state"]["epoch"] for s in seqs) >= 1
    if opts.get("packing", True):
        assert any(len(s["sources"]) > 1 for s in seqs)  # documents really were packed


def test_cursor_resume_reproduces_the_stream(small_dataset):
    path, _ = small_dataset
    base = ["--tokenizer", TOK_DIR / "gpt2", "--data", path, "--max-seq-length", 200, "--seed", 99]
    _, _, full = run_dataset(base + ["--pack", 40])
    for cut in [1, 17, 33]:
        state = json.dumps(full[cut - 1]["state"])
        _, _, rest = run_dataset(base + ["--pack", 40 - cut, "--restore", state])
        assert [s["input_ids"] for s in rest] == [s["input_ids"] for s in full[cut:]]
        assert [s["sources"] for s in rest] == [s["sources"] for s in full[cut:]]
    # A state saved with another seed is refused.
    proc, _, _ = run_dataset(["--tokenizer", TOK_DIR / "gpt2", "--data", path, "--max-seq-length",
                              200, "--seed", 5, "--pack", 1, "--restore",
                              json.dumps(full[0]["state"])], check=False)
    assert proc.returncode == 1 and "seed" in proc.stderr
    # Different seeds give different orders, the same seed the same one.
    _, _, again = run_dataset(base + ["--pack", 5])
    _, _, other = run_dataset(base[:-1] + [100, "--pack", 5])
    assert [s["sources"] for s in again] == [s["sources"] for s in full[:5]]
    assert [s["sources"] for s in other] != [s["sources"] for s in full[:5]]


PHI3_WITH_GENERATION = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n'}}{% generation %}"
    "{{ message['content'] + '<|end|>\\n' }}{% endgeneration %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
)


def test_generation_blocks_give_the_masks_transformers_gives(tmp_path):
    """With {% generation %} blocks the trained spans are those blocks, exactly like
    transformers' return_assistant_tokens_mask."""
    d = tmp_path / "phi3gen"
    d.mkdir()
    shutil.copy(TOK_DIR / "phi3-mini" / "tokenizer.json", d / "tokenizer.json")
    shutil.copy(TOK_DIR / "phi3-mini" / "tokenizer_config.json", d / "tokenizer_config.json")
    (d / "chat_template.jinja").write_text(PHI3_WITH_GENERATION)
    hf = load_hf(d)
    lima = json.loads((DATA_DIR / "lima" / "lima.json").read_text("utf-8"))
    records = [r for r in lima if r["history"]][:10] + lima[:10]
    data = tmp_path / "lima.json"
    data.write_text(json.dumps(records), encoding="utf-8")
    _, _, docs = run_dataset(["--tokenizer", d, "--data", data])
    want = []
    for r in records:
        out = hf.apply_chat_template(alpaca_messages(r), tokenize=True, return_dict=True,
                                     return_assistant_tokens_mask=True)
        ids = list(out["input_ids"])
        want.append((ids, [i if m else IGNORE for i, m in zip(ids, out["assistant_masks"])]))
    compare_docs(docs, want)


def test_qwen3_reasoning_in_earlier_turns(tmp_path):
    """Qwen3's template keeps reasoning_content only after the last user query and opens the final
    turn with a <think> block: every assistant turn is still trained (earlier ones as rendered in
    the whole conversation, without their reasoning), the ids are apply_chat_template's, and the
    mask is the reference's."""
    d = TOK_DIR / "qwen3"
    hf = load_hf(d)
    lima = json.loads((DATA_DIR / "lima" / "lima.json").read_text("utf-8"))
    records = []
    for k, rec in enumerate([r for r in lima if r["history"]][:6]):
        msgs = []
        for j, (u, a) in enumerate(rec["history"]):
            msgs += [{"role": "user", "content": u},
                     {"role": "assistant", "content": a, "reasoning_content": f"Step {j}."}]
        last = {"role": "assistant", "content": rec["output"]}
        if k % 2:
            last["reasoning_content"] = "Think it over."
        msgs += [{"role": "user", "content": rec["instruction"]}, last]
        records.append({"messages": msgs})
    data = tmp_path / "reasoning.jsonl"
    data.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in records), encoding="utf-8")
    _, _, docs = run_dataset(["--tokenizer", d, "--data", data])
    compare_docs(docs, [ref_chat(hf_render(hf), hf_encode(hf), r["messages"], None, True)
                        for r in records])
    for r, doc in zip(records, docs):
        enc = hf.apply_chat_template(r["messages"], tokenize=True, return_dict=True)
        assert doc["input_ids"] == list(enc["input_ids"])
        trained = hf.decode([l for l in doc["labels"] if l != IGNORE])
        assert all(m["content"] in trained for m in r["messages"] if m["role"] == "assistant")
        assert "Step 0." not in trained  # earlier reasoning is not in the rendering at all
        if "reasoning_content" in r["messages"][-1]:
            assert "<think>\nThink it over.\n</think>" in trained
