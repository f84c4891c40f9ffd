"""offloadd's Jinja subset and chat templates against Python: jinja2 in transformers' environment
(_compile_jinja_template: trim_blocks, lstrip_blocks, its tojson, raise_exception) and
transformers' apply_chat_template on real tokenizer directories."""

import json
import shutil
import subprocess

import pytest

from text_testlib import (CHATML_TOOLS_TEMPLATE, DATA_DIR, LLAMA2_CHAT_TEMPLATE, REAL_TOKENIZERS,
                          TEMPLATE_ONLY, TOK_DIR, glaive_messages, glaive_records, glaive_tools,
                          run_chat, template_dir)

JINJA_CASES = [
    ("{{ 'a' + 'b' ~ 1 ~ none ~ true }}", {}),
    ("{% for x in xs %}{{ loop.index }}/{{ loop.length }}{{ ',' if not loop.last }}{% endfor %}",
     {"xs": [3, 1, 2]}),
    ("{% for x in xs if x > 1 %}{{ x }}{{ loop.first }}{% else %}empty{% endfor %}", {"xs": [3, 1, 2]}),
    ("{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", {"xs": []}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": {"b": 1, "a": [1, "x"]}}),
    ("{% set ns = namespace(n=0) %}{% for x in xs %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}",
     {"xs": [1, 2, 3]}),
    ("{% set n = 0 %}{% for x in xs %}{% set n = n + x %}{% endfor %}{{ n }}", {"xs": [1, 2]}),
    ("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ 'é\"\\n' | tojson }}",
     {"d": {"z": 1.5, "a": [True, None, "x"], "m": {}}}),
    ("{{ s | trim }}|{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s | length }}",
     {"s": "  héllo wörld \n"}),
    ("{{ s.upper() }} {{ s | lower }} {{ s.title() }} {{ s | capitalize }}", {"s": "hello WORLD"}),
    ("{{ s.split() }} {{ s.split(',') }} {{ s.startswith('a') }} {{ s.endswith(('x', 'c')) }}",
     {"s": "a,b c"}),
    ("{{ xs[0] }} {{ xs[-1] }} {{ xs[1:] }} {{ xs[::-1] }} {{ s[1:3] }} {{ s[-1] }}",
     {"xs": [1, 2, 3], "s": "añbc"}),
    ("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1.0 * 3 }}", {}),
    ("{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ z is none }} {{ x is string }}"
     " {{ 3 is odd }} {{ n is number }} {{ d is mapping }} {{ xs is iterable }}",
     {"x": "s", "z": None, "n": 1.5, "d": {}, "xs": []}),
    ("{% if a and not b or c %}yes{% elif b %}b{% else %}no{% endif %}", {"a": 1, "b": 0, "c": 0}),
    ("{{ 'x' in 'xyz' }} {{ 2 in xs }} {{ 'k' in d }} {{ 5 not in xs }}",
     {"xs": [1, 2], "d": {"k": 1}}),
    ("{{ xs | join(', ') }} {{ xs | first }} {{ xs | last }} {{ xs | reverse | list }}",
     {"xs": ["a", "b", "c"]}),
    ("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | join('|') }}",
     {"ms": [{"role": "user", "content": "u1"}, {"role": "bot", "content": "b"},
             {"role": "user", "content": "u2"}]}),
    ("{{ ms | rejectattr('role', 'equalto', 'user') | list | length }}",
     {"ms": [{"role": "user"}, {"role": "bot"}]}),
    ("{{ x | default('dflt') }} {{ y | default('dflt') }} {{ '' | default('e', true) }}", {"x": 0}),
    ("{{ d.get('a') }} {{ d.get('zz', 'no') }} {{ d['a'] }} {{ d.a }} {{ d.keys() | list }}",
     {"d": {"a": 1}}),
    ("{%- for m in ms %}\n  {{- m }}\n{%- endfor %}\n", {"ms": ["a", "b"]}),
    ("{% for m in ms %}\n    {{ m }}\n{% endfor %}\n", {"ms": ["a", "b"]}),
    ("{# comment #}\n  {% if true %}\n    x\n  {% endif %}\ny", {}),
    ("{% macro greet(name, p='Hi') %}{{ p }} {{ name }}!{% endmacro %}{{ greet('A') }} {{ greet('B', 'Yo') }}", {}),
    ("{% set t %}inner {{ 1 + 1 }}{% endset %}[{{ t }}]", {}),
    ("{% for x in range(5) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("{{ (1, 2) }} {{ [1, 'a', none, true, 1.5] }} {{ {'a': 'b'} }} {{ 1e-05 }} {{ 0.1 + 0.2 }}", {}),
    ("{{ x if x else 'none' }} {{ 'a' if false }}|", {"x": ""}),
    ("{{ s.replace('a', 'b') }} {{ s | replace('a', 'c') }} {{ s.count('a') }} {{ s.find('n') }}",
     {"s": "banana"}),
    ("{{ loop_messages | length }}{% for m in messages[1:] %}{{ loop.previtem is defined }}{% endfor %}",
     {"messages": [1, 2, 3]}),
    ("{{ xs | sort | list }} {{ ys | sort(attribute='n') | map(attribute='n') | list }} {{ xs | unique | list }}",
     {"xs": [3, 1, 3], "ys": [{"n": 2}, {"n": 1}]}),
    ("{{ 'line1\\nline2' | indent(2) }}|{{ 'a\\nb' | indent(4, true) }}", {}),
    ("{{ xs | reject('equalto', 'b') | join(',') }} {{ xs | select('ne', 'a') | list }} "
     "{{ ns | select('odd') | list }} {{ [0, 1, '', 'x'] | select | list }} {{ ns | reject | list }}",
     {"xs": ["a", "b", "c"], "ns": [0, 1, 2, 3]}),
    ("{{ x is false }} {{ y is sequence }} {{ d | tojson(ensure_ascii=False, sort_keys=True) }}"
     "{% for m in xs %}{{ loop.nextitem if not loop.last }}{% endfor %}",
     {"x": False, "y": "s", "d": {"b": "é", "a": 1}, "xs": [1, 2, 3]}),
]


@pytest.mark.without_shared_data
def test_jinja_subset_matches_jinja2():
    from transformers.utils.chat_template_utils import _compile_jinja_template
    replies = run_chat([{"template": t, "context": c} for t, c in JINJA_CASES])
    for (template, context), reply in zip(JINJA_CASES, replies):
        want = _compile_jinja_template(template).render(**context)
        assert reply.get("text") == want, (template, reply)


@pytest.mark.without_shared_data
def test_jinja_errors_are_reported():
    replies = run_chat([
        {"template": "{{ raise_exception('roles must alternate') }}", "context": {}},
        {"template": "line1\n{% if x %}unclosed", "context": {}},
        {"template": "{% for %}", "context": {}},
        {"template": "{{ x.y }}", "context": {}},
        {"template": "{% include 'other.j2' %}", "context": {}},
        {"template": "{{ 1 + 'a' }}", "context": {}},
        {"template": "{% if false %}{{ x | wordwrap(3) }}{% endif %}", "context": {}},
        {"template": "line1\n{% if x is lower %}{% endif %}", "context": {}},
    ])
    assert "roles must alternate" in replies[0]["error"]
    assert "endif" in replies[1]["error"]
    assert "line 1" in replies[2]["error"]
    assert "undefined" in replies[3]["error"]
    assert "include" in replies[4]["error"]
    assert "unsupported operand" in replies[5]["error"]
    # Filters and tests outside the subset are refused when the template is parsed, even in a
    # branch that never renders, naming the construct and its line.
    assert "line 1: unsupported filter 'wordwrap'" in replies[6]["error"]
    assert "line 2: unsupported test 'lower'" in replies[7]["error"]


def conversations():
    """Conversations from the shipped datasets (as chat messages) plus hand-made edge cases."""
    lima = json.loads((DATA_DIR / "lima" / "lima.json").read_text(encoding="utf-8"))
    convs = []
    for rec in [r for r in lima if r["history"]][:5] + lima[:5]:
        msgs = []
        for u, a in rec["history"]:
            msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        msgs += [{"role": "user", "content": rec["instruction"]},
                 {"role": "assistant", "content": rec["output"]}]
        convs.append(msgs)
    convs.append([{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "  Hi there  "},
                  {"role": "assistant", "content": "Hello 👋\n\nHow can I help?"},
                  {"role": "user", "content": "Nothing."}])
    return convs


def make_dir(tmp_path, name, template):
    d = tmp_path / name
    d.mkdir()
    shutil.copy(TOK_DIR / "llama2" / "tokenizer.json", d / "tokenizer.json")
    config = json.loads((TOK_DIR / "llama2" / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d


@pytest.fixture(scope="module")
def template_dirs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chat")
    return {
        "phi3-mini": TOK_DIR / "phi3-mini",
        "llama2-chat": make_dir(tmp, "llama2chat", LLAMA2_CHAT_TEMPLATE),
        "chatml-tools": make_dir(tmp, "chatml", CHATML_TOOLS_TEMPLATE),
    }


@pytest.mark.parametrize("name", ["phi3-mini", "llama2-chat", "chatml-tools"])
def test_chat_template_matches_transformers(template_dirs, name):
    from transformers import AutoTokenizer
    d = template_dirs[name]
    hf = AutoTokenizer.from_pretrained(str(d))
    requests, want = [], []
    for msgs in conversations():
        if name == "llama2-chat" and msgs[-1]["role"] == "user" and len(msgs) % 2 == 0:
            continue  # system + alternating turns ending with the user is fine; others raise
        for gen in [False, True]:
            requests.append({"dir": str(d), "messages": msgs, "add_generation_prompt": gen})
            want.append(hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen))
    replies = run_chat(requests)
    for req, reply, w in zip(requests, replies, want):
        assert reply.get("text") == w, (req["messages"][:1], reply)
    assert len(requests) >= 10


def test_chat_template_with_tools_matches_transformers(template_dirs):
    from transformers import AutoTokenizer
    glaive = json.loads((DATA_DIR / "glaive_toolcall_sharegpt" / "glaive_toolcall_en_demo.json")
                        .read_text(encoding="utf-8"))
    d = template_dirs["chatml-tools"]
    hf = AutoTokenizer.from_pretrained(str(d))
    requests, want = [], []
    for rec in glaive[:20]:
        tools = [{"type": "function", "function": t} for t in json.loads(rec["tools"])]
        msgs = []
        for turn in rec["conversations"]:
            if turn["from"] == "human":
                msgs.append({"role": "user", "content": turn["value"]})
            elif turn["from"] == "gpt":
                msgs.append({"role": "assistant", "content": turn["value"]})
            elif turn["from"] == "function_call":
                call = json.loads(turn["value"])
                msgs.append({"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": call}]})
            else:
                msgs.append({"role": "tool", "content": turn["value"]})
        requests.append({"dir": str(d), "messages": msgs, "tools": tools})
        want.append(hf.apply_chat_template(msgs, tools=tools, tokenize=False))
    replies = run_chat(requests)
    for reply, w in zip(replies, want):
        assert reply.get("text") == w


def test_llama2_template_raises_on_bad_roles(template_dirs):
    reply = run_chat([{"dir": str(template_dirs["llama2-chat"]), "messages": [
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}])[0]
    assert "Conversation roles must alternate" in reply["error"]


@pytest.mark.without_shared_data
def test_builtin_template_renders_documented_layout():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A"}]
    reply = run_chat([{"builtin": True, "bos_token": "<s>", "eos_token": "</s>", "messages": msgs,
                       "spans": True}])[0]
    text = "<s>### System:\nS\n\n### User:\nU\n\n### Assistant:\nA</s>\n\n"
    assert reply["text"] == text
    assert reply["spans"] == [[text.index("A</s>"), len(text)]]


# ---- the real templates of the supported families ------------------------------------------------------------

# Template variables each family documents (apply_chat_template's **kwargs), tried besides none.
TEMPLATE_EXTRAS = {
    "qwen3": [{"enable_thinking": False}, {"enable_thinking": True}],
    "qwen3.6": [{"enable_thinking": False}],
    "smollm3": [{"enable_thinking": False}],
    "glm-4.6": [{"enable_thinking": False}],
    "deepseek-v3.1": [{"thinking": True}],
    "gpt-oss": [{"reasoning_effort": "high"}, {"model_identity": "You are a test."},
                {"builtin_tools": ["browser", "python"]}],
    "llama3.1": [{"builtin_tools": ["brave_search", "wolfram_alpha", "code_interpreter"]},
                 {"tools_in_user_message": False}, {"date_string": "01 Jan 2025"}],
}


def real_template_cases():
    """(messages, tools) covering system prompts, multi-turn, tools with calls and results
    (arguments as objects and as JSON strings, parallel calls), and reasoning in earlier turns
    (Qwen3's reasoning_content and inline <think>, gpt-oss's thinking)."""
    lima = json.loads((DATA_DIR / "lima" / "lima.json").read_text(encoding="utf-8"))
    cases = []
    for rec in [r for r in lima if r["history"]][:2] + lima[:2]:
        msgs = []
        for u, a in rec["history"]:
            msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        msgs += [{"role": "user", "content": rec["instruction"]},
                 {"role": "assistant", "content": rec["output"]}]
        cases.append((msgs, None))
    cases.append(([{"role": "system", "content": "You are terse."},
                   {"role": "user", "content": "  Hi there  "},
                   {"role": "assistant", "content": "Hello \U0001F44B\n\nHow can I help?"},
                   {"role": "user", "content": "Nothing."},
                   {"role": "assistant", "content": "OK."}], None))
    with_tools = [r for r in glaive_records() if any(t["from"] == "function_call"
                                                     for t in r["conversations"])]
    for k, rec in enumerate(with_tools[:6]):
        msgs = glaive_messages(rec, ids=True)
        if k % 2:
            msgs = [{"role": "system", "content": "You call tools when they help."}] + msgs
        cases.append((msgs, glaive_tools(rec)))
    # Arguments as a JSON string (OpenAI's API form) and two parallel calls.
    msgs = glaive_messages(with_tools[0], ids=True)
    for m in msgs:
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = json.dumps(c["function"]["arguments"])
    cases.append((msgs, glaive_tools(with_tools[0])))
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    cases.append(([{"role": "user", "content": "Weather in Paris and Rome?"},
                   {"role": "assistant", "content": "Checking both.", "tool_calls": [
                       {"id": "call00001", **call},
                       {"id": "call00002", "type": "function", "function": {
                           "name": "get_weather", "arguments": {"city": "Rome"}}}]},
                   {"role": "tool", "tool_call_id": "call00001", "content": "{\"temp\": 21}"},
                   {"role": "tool", "tool_call_id": "call00002", "content": "{\"temp\": 25}"},
                   {"role": "assistant", "content": "Paris 21, Rome 25."}],
                  [{"type": "function", "function": {
                      "name": "get_weather", "description": "Current weather",
                      "parameters": {"type": "object", "required": ["city"], "properties": {
                          "city": {"type": "string", "description": "City name"}}}}}]))
    # Reasoning in earlier turns: Qwen3's reasoning_content and inline <think>, gpt-oss thinking.
    cases.append(([{"role": "user", "content": "2+2?"},
                   {"role": "assistant", "content": "4", "reasoning_content": "\nAdd them.\n"},
                   {"role": "user", "content": "3+3?"},
                   {"role": "assistant", "content": "<think>\nAdd again.\n</think>\n\n6"},
                   {"role": "user", "content": "And 4+4?"},
                   {"role": "assistant", "content": "8", "reasoning_content": "Double four."}],
                  None))
    # Content given as a list of parts (the multimodal message form), text only.
    cases.append(([{"role": "user", "content": [{"type": "text", "text": "Describe a cat."}]},
                   {"role": "assistant", "content": [{"type": "text", "text": "Furry."}]}],
                  None))
    cases.append(([{"role": "system", "content": "Be brief."},
                   {"role": "user", "content": "2+2?"},
                   {"role": "assistant", "content": "4", "thinking": "Add them."},
                   {"role": "user", "content": "3+3?"},
                   {"role": "assistant", "content": "6", "thinking": "Add again."}], None))
    return cases


def _hf_render(source, tokens, msgs, tools, gen, extra):
    from transformers.utils.chat_template_utils import render_jinja_template
    try:
        text = render_jinja_template([msgs], tools=tools, chat_template=source,
                                     add_generation_prompt=gen, **tokens, **extra)[0][0]
        return text, None
    except Exception as e:  # the template refused the conversation (raise_exception, TypeError)
        return None, e


@pytest.mark.parametrize("name", REAL_TOKENIZERS + list(TEMPLATE_ONLY))
def test_real_templates_match_transformers(tmp_path, name):
    """Each real template renders every case exactly as transformers' renderer (the one
    apply_chat_template calls, with the special tokens of the folder's tokenizer_config.json),
    with and without the generation prompt and with the family's template variables; where
    transformers' rendering fails (a template's raise_exception, or a type error such as
    DeepSeek's string concatenation of object arguments), offloadd's fails too, with the
    template's message."""
    d, source, tokens = template_dir(name, tmp_path)
    requests, want = [], []
    for msgs, tools in real_template_cases():
        for extra in [{}] + TEMPLATE_EXTRAS.get(name, []):
            for gen in [False, True]:
                m = msgs[:-1] if gen else msgs
                req = {"dir": str(d), "messages": m, "add_generation_prompt": gen, "extra": extra}
                if tools:
                    req["tools"] = tools
                requests.append(req)
                want.append(_hf_render(source, tokens, m, tools, gen, extra))
    replies = run_chat(requests)
    rendered = tool_renderings = 0
    for req, reply, (text, err) in zip(requests, replies, want):
        where = (name, req["messages"][-1]["content"][:40], req.get("extra"),
                 req["add_generation_prompt"])
        if err is not None:
            assert "error" in reply, (where, str(err), reply.get("text", "")[-300:])
            if type(err).__name__ == "TemplateError":
                assert str(err) in reply["error"], (where, str(err), reply["error"])
            continue
        assert "error" not in reply, (where, reply["error"])
        assert reply["text"] == text, where
        rendered += 1
        tool_renderings += "tools" in req
    assert rendered >= 10, (rendered, len(requests))
    # Gemma 3's template has no tool role (it raises on tool messages); DeepSeek-V3.1's takes
    # arguments as strings only (it concatenates them).
    assert tool_renderings >= {"gemma3": 0, "deepseek-v3.1": 2}.get(name, 8), tool_renderings
