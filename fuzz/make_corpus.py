#!/usr/bin/env python3
"""Builds the seed corpora of the fuzz harnesses (fuzz/*_fuzzer.cc) into OUT/<harness>/.

Seeds are small on purpose (libFuzzer mutates every byte of an input; a 2 MB tokenizer.json
would make each run thousands of times slower): they are cut from the real files of
../shared/data (tokenizers, chat templates, Alpaca, LIMA, Glaive ShareGPT records) and completed
with generated inputs for the formats that shared/data has no file of (safetensors, config.json,
the daemon and job YAML, the store and worker wire formats). Deterministic: the same inputs give
the same corpus. Usage: make_corpus.py --shared ../shared/data --out build-fuzz/corpus
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


class Corpus:
    def __init__(self, out):
        self.out = out
        self.counts = {}

    def add(self, harness, name, data):
        d = os.path.join(self.out, harness)
        os.makedirs(d, exist_ok=True)
        if isinstance(data, str):
            data = data.encode()
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
        self.counts[harness] = self.counts.get(harness, 0) + 1


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def compact(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


# --- tokenizers -----------------------------------------------------------------------------

def shrink_tokenizer(tok, keep_ids, n_merges):
    """The same pipeline with a vocabulary cut to ids < keep_ids (plus what the first merges make)."""
    tok = json.loads(json.dumps(tok))
    model = tok["model"]
    inv = {v: k for k, v in model["vocab"].items()}
    vocab = {inv[i]: i for i in range(min(keep_ids, len(inv))) if i in inv}
    merges = []
    for m in model.get("merges", []):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in vocab and b in vocab and (a + b) in model["vocab"]:
            if a + b not in vocab:
                vocab[a + b] = len(vocab)
            merges.append(m)
            if len(merges) >= n_merges:
                break
    model["vocab"] = vocab
    model["merges"] = merges
    added = []
    for i, t in enumerate(tok.get("added_tokens", [])[:8]):
        added.append(dict(t, id=len(vocab) + i))
    tok["added_tokens"] = added
    # Post-processors and normalizers may name added tokens by id: renumber the usual ones.
    pp = tok.get("post_processor")
    if isinstance(pp, dict) and "special_tokens" in pp:
        for name, st in pp["special_tokens"].items():
            st["ids"] = [vocab.get(name, added[0]["id"] if added else 0)]
    return tok


def tokenizer_seeds(c, shared):
    texts = [
        "Hello world! It's 2024.",
        "caf\u00e9 \u4f60\u597d \U0001f600  spaces\n\ttabs",
        "<s>[INST] hi [/INST]</s><|endoftext|><|user|>",
    ]
    c.add("tokenizer", "tiny_bytelevel.json",
          open(os.path.join(HERE, "data", "tiny_bytelevel_tokenizer.json"), "rb").read())
    vectors = os.path.join(shared, "tokenizers", "test_vectors", "tokenizer_tests.json")
    if os.path.exists(vectors):
        try:
            v = load_json(vectors)
            for k in list(v)[:4]:
                entry = v[k]
                if isinstance(entry, list) and entry and isinstance(entry[0], dict):
                    t = entry[0].get("input")
                    if isinstance(t, str):
                        texts.append(t[:200])
        except (ValueError, KeyError):
            pass
    for name, keep, merges in (("gpt2", 400, 300), ("llama2", 600, 300), ("phi3-mini", 600, 300)):
        path = os.path.join(shared, "tokenizers", name, "tokenizer.json")
        if not os.path.exists(path):
            continue
        small = compact(shrink_tokenizer(load_json(path), keep, merges))
        c.add("tokenizer", f"{name}.json", small)
        for i, t in enumerate(texts):
            c.add("tokenizer", f"{name}_text{i}", small.encode() + b"\0" + t.encode())
        # A pure byte-level / Metaspace variant without post-processor and decoder.
        t = load_json(path)
        t = shrink_tokenizer(t, 300, 50)
        t["post_processor"] = None
        c.add("tokenizer", f"{name}_nopost.json", compact(t))


# --- chat templates -------------------------------------------------------------------------

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          "{% set system_message = messages[0]['content'] %}{% else %}"
          "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
          "{% for message in loop_messages %}{% if (message['role'] == 'user') != "
          "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate') }}"
          "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
          "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + "
          "message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
          "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + "
          "' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + "
          "' ' + eos_token }}{% endif %}{% endfor %}")
TOOLS = ("{%- if tools %}{{- '<tools>' }}{%- for t in tools %}{{ t | tojson(indent=2) }}"
         "{%- endfor %}{{- '</tools>' }}{%- endif %}{%- for m in messages -%}"
         "{%- if m.role == 'assistant' and m.tool_calls is defined -%}{%- for c in m.tool_calls -%}"
         "<call>{{ c.function.name }}({{ c.function.arguments | tojson }})</call>{%- endfor -%}"
         "{%- endif -%}{% generation %}{{ m.content | trim }}{% endgeneration %}"
         "{{ '\\n' if not loop.last else '' }}{%- endfor -%}")
MISC = ("{% set ns = namespace(n=0) %}{% macro f(x, y=2) %}{{ x * y }}{% endmacro %}"
        "{% for i in range(3) if i != 1 %}{{ f(i) }}{{ loop.revindex }}{% set ns.n = ns.n + i %}"
        "{% else %}none{% endfor %}{{ ns.n }}{{ 'a,b' .split(',') | join('-') | upper }}"
        "{{ {'k': [1, 2.5, none, true]} | tojson }}{{ messages | selectattr('role', 'equalto', "
        "'user') | map(attribute='content') | list | length }}{{ 'x' ~ 7 // 2 ~ 2 ** 3 }}"
        "{{ messages[-1].content[1:3] | default('d') }}{# comment #}")


# Number literals out of range, loops and strings that grow without bound.
HOSTILE = {
    "huge_int": "{{ 99999999999999999999 }}{{ '99999999999999999999' | int }}",
    "huge_float": "{{ 1e999 }}{{ -1e999 | round }}{{ 'nan' | float }}",
    "nested_range": "{% for i in range(99999999) %}{% for j in range(99999999) %}x{% endfor %}"
                    "{% endfor %}",
    "doubling": "{% set s = 'xxxxxxxxxxxxxxxx' %}{% for i in range(40) %}{% set s = s ~ s %}"
                "{% endfor %}{{ s | length }}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
}


def jinja_seeds(c, shared):
    templates = {"chatml": CHATML, "llama2": LLAMA2, "tools": TOOLS, "misc": MISC, **HOSTILE}
    phi3 = os.path.join(shared, "tokenizers", "phi3-mini", "tokenizer_config.json")
    if os.path.exists(phi3):
        t = load_json(phi3).get("chat_template")
        if isinstance(t, str):
            templates["phi3"] = t
    builtin = os.path.join(REPO, "text", "chat_template.cc")
    for name, t in templates.items():
        c.add("jinja", name + ".jinja", t)
    # With a conversation taken from the Glaive ShareGPT file (roles mapped like dataset.cc).
    glaive = os.path.join(shared, "glaive_toolcall_sharegpt", "glaive_toolcall_en_demo.json")
    if os.path.exists(glaive):
        roles = {"human": "user", "gpt": "assistant", "function_call": "assistant",
                 "observation": "tool", "system": "system"}
        for i, rec in enumerate(load_json(glaive)[:3]):
            msgs = [{"role": roles.get(t["from"], "user"), "content": t["value"][:300]}
                    for t in rec["conversations"]]
            c.add("jinja", f"chatml_glaive{i}", CHATML.encode() + b"\0" + compact(msgs).encode())
            c.add("jinja", f"tools_glaive{i}", TOOLS.encode() + b"\0" + compact(msgs).encode())
    del builtin


# --- datasets -------------------------------------------------------------------------------

def dataset_seeds(c, shared):
    # Options byte (see dataset_fuzzer.cc): auto + mask_prompt + add_eos, Phi-3 (0x28) or GPT-2
    # (0x68); some seeds with skip_bad_records (0x10) and a forced format.
    def add(name, text, opts=(0x28, 0x68)):
        for o in opts:
            c.add("dataset", f"{name}_{o:02x}", bytes([o]) + text.encode())

    alpaca = os.path.join(shared, "alpaca", "alpaca_5000.json")
    if os.path.exists(alpaca):
        recs = load_json(alpaca)
        add("alpaca_array", json.dumps(recs[:3], ensure_ascii=False, indent=2))
        add("alpaca_lines", "\n".join(compact(r) for r in recs[3:6]) + "\n", (0x29, 0x39))
    seeds = os.path.join(shared, "alpaca", "seed_tasks.jsonl")
    if os.path.exists(seeds):
        lines = open(seeds, encoding="utf-8").read().splitlines()[:2]
        add("seed_tasks", "\n".join(lines) + "\n", (0x38,))
    lima = os.path.join(shared, "lima", "lima.json")
    if os.path.exists(lima):
        recs = load_json(lima)
        multi = [r for r in recs if r.get("history")][:1]
        trim = [dict(r, output=r["output"][:400]) for r in recs[:2] + multi]
        add("lima", compact(trim), (0x29, 0x69))
    glaive = os.path.join(shared, "glaive_toolcall_sharegpt", "glaive_toolcall_en_demo.json")
    if os.path.exists(glaive):
        recs = load_json(glaive)[:2]
        add("glaive_sharegpt", json.dumps(recs, ensure_ascii=False), (0x2b, 0x6b))
    msgs = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello!"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}
    add("messages", compact(msgs) + "\n", (0x2a, 0x6a))
    add("prompt_completion", '{"prompt": "2+2=", "completion": " 4"}\n', (0x2d, 0x3d))
    add("text", '{"text": "Once upon a time"}\n{"text": ""}\n', (0x2c, 0x6c))
    add("pretokenized", '{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}\n{"input_ids": [5]}\n',
        (0x2e, 0x6e))
    add("mixed_bad", '[{"text": "a"}, {"prompt": 1}, 7, {"conversations": [{"from": "x"}]}]',
        (0x38,))


# --- safetensors and config.json --------------------------------------------------------------

def columnar_seeds(c):
    """pyarrow-written Parquet and Arrow files (fuzz/data/parquet and fuzz/data/arrow, made by their
    make_seeds.py), kept in the tree so that the corpus needs no pyarrow."""
    for harness, ext in (("parquet", ".parquet"), ("arrow", ".arrow")):
        d = os.path.join(HERE, "data", harness)
        for name in sorted(os.listdir(d)):
            if name.endswith(ext):
                with open(os.path.join(d, name), "rb") as f:
                    c.add(harness, name, f.read())


def safetensors_file(tensors, metadata=None, pad=True):
    header = {}
    data = b""
    for name, dtype, shape, size in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + size]}
        data += bytes((i * 37) & 0xFF for i in range(size))
    if metadata is not None:
        header["__metadata__"] = metadata
    h = compact(header).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds(c):
    c.add("safetensors", "empty", safetensors_file([]))
    c.add("safetensors", "one_f32", safetensors_file([("w", "F32", [2, 3], 24)], {"format": "pt"}))
    c.add("safetensors", "dtypes", safetensors_file(
        [("a", "BF16", [4], 8), ("b", "F16", [1, 2], 4), ("c", "I64", [1], 8),
         ("d", "BOOL", [3], 3), ("e", "U8", [0], 0), ("f", "F64", [], 8)]))
    c.add("safetensors", "model", safetensors_file(
        [("model.embed_tokens.weight", "F32", [8, 4], 128),
         ("model.layers.0.self_attn.q_proj.weight", "BF16", [4, 4], 32),
         ("lm_head.weight", "F32", [8, 4], 128)], {"format": "pt", "note": "seed"}))
    c.add("safetensors", "overlap",
          struct.pack("<Q", 80) + compact({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                                            "b": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}}
                                           ).encode()[:80].ljust(80) + b"abcd")


CONFIGS = [
    {"model_type": "llama", "vocab_size": 32000, "hidden_size": 64, "intermediate_size": 128,
     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
     "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
     "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"},
    {"model_type": "llama", "vocab_size": 128256, "hidden_size": 64, "intermediate_size": 128,
     "num_hidden_layers": 1, "num_attention_heads": 4, "head_dim": 16,
     "max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
     "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
     "eos_token_id": [128001, 128008], "attention_dropout": 0.0, "attention_bias": False},
    {"model_type": "mistral", "vocab_size": 32000, "hidden_size": 64, "intermediate_size": 128,
     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
     "sliding_window": 4096, "max_position_embeddings": 32768},
    {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128,
     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
     "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
     "tie_word_embeddings": True, "use_sliding_window": False},
    {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 64, "n_layer": 2, "n_head": 4,
     "n_positions": 1024, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
     "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1},
    # The supported families: per-head q/k norm, sandwich norms and softcaps, per-layer-type RoPE,
    # a multimodal wrapper, fused tensors with longrope and partial rotary, post-norm.
    {"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128,
     "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
     "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1,
     "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
    {"model_type": "gemma2", "vocab_size": 256000, "hidden_size": 64, "intermediate_size": 128,
     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
     "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 16,
     "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 4096},
    {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "eos_token_id": [1, 106],
     "text_config": {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 6, "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
                     "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
     "vision_config": {"model_type": "siglip_vision_model"}},
    {"model_type": "phi3", "vocab_size": 32064, "hidden_size": 64, "intermediate_size": 128,
     "num_hidden_layers": 2, "num_attention_heads": 4, "partial_rotary_factor": 0.5,
     "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
     "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3],
                      "long_factor": [2.0, 3.0, 4.0, 5.0]}, "sliding_window": 2047},
    {"model_type": "olmo2", "vocab_size": 100352, "hidden_size": 64, "intermediate_size": 128,
     "num_hidden_layers": 2, "num_attention_heads": 4, "attention_bias": True,
     "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 500000.0}},
]


def model_config_seeds(c):
    for i, cfg in enumerate(CONFIGS):
        c.add("model_config", f"config{i}.json", json.dumps(cfg, indent=2))


# --- YAML: daemon config and job files --------------------------------------------------------

DAEMON_CONFIGS = [
    "log_level: debug\nstate_dir: /tmp/s\nallowed_roots: [/tmp]\n",
    "server:\n  unix_socket: /tmp/x.sock\n  unix_socket_mode: 0600\n  max_request_bytes: 4MiB\n"
    "  shutdown_grace_seconds: 2.5\n  tcp: {listen: '127.0.0.1:0', tls_cert_file: /c, "
    "tls_key_file: /k, auth_token_file: /t}\nmetrics: {listen: '127.0.0.1:0', peak_flops: 1e15}\n",
    "storage:\n  directories:\n    - {path: /nvme0, weight: 2}\n    - path: /nvme1\n"
    "  aio: {block_size: 1MiB, queue_depth: 64}\nworkers: {processes: 2, threads_per_process: 4, "
    "pin_cores: false, adamw_kernel: avx2}\nmemory: {host_memory_limit: 24GiB, "
    "gpu_memory_limit: 2TB}\n",
    "a: &a [x, x]\nb: [*a, *a]\n",
    "server:\n  openai_api: {listen: 'localhost:8080', auth_token_file: /t, model_dir: /m, "
    "data_dir: /d, max_upload_bytes: 1MiB, base_learning_rate: 1e-4}\n",
]

JOB_FILES = [
    "display_name: demo\nmodel: {path: /srv/m, compute_dtype: bf16}\ndataset:\n"
    "  paths: [/srv/a.jsonl, /srv/b.json]\n  format: alpaca\n  max_seq_length: 512\n"
    "  template: \"0042\"\ntraining: {learning_rate: 3e-4, max_steps: 20, "
    "lr_scheduler_type: cosine}\noffload:\n  offload_optimizer: {device: nvme, nvme_path: /nvme0}\n"
    "  activations: {mode: RECOMPUTE, layer_overrides: {0: keep}}\noutput_dir: /srv/out\n",
    '{"display_name": "j", "model": {"path": "/m"}, "dataset": {"paths": ["/d"], '
    '"format": "DATASET_FORMAT_SHAREGPT"}, "training": {"per_device_train_batch_size": 8, '
    '"gradient_accumulation_steps": 2, "max_grad_norm": 1.0, "warmup_steps": 10, "seed": 42}, '
    '"output_dir": "/o", "labels": {"team": "x"}}',
    "dropout: disable\ncompression: {type: none}\ntraining: {weight_decay: .nan}\n",
]


def yaml_seeds(c):
    deploy = os.path.join(REPO, "deploy", "offloadd.yaml")
    if os.path.exists(deploy):
        c.add("daemon_config", "deploy_offloadd.yaml", open(deploy, "rb").read())
    for i, y in enumerate(DAEMON_CONFIGS):
        c.add("daemon_config", f"config{i}.yaml", y)
    for i, y in enumerate(JOB_FILES):
        c.add("job_file", f"job{i}.yaml", y)


# --- JobSpec protos (job_spec_fuzzer's sandbox) ------------------------------------------------

ROOT = "/tmp/offloadd-fuzz-job-spec"
JOB_SPECS = [
    f'model {{ path: "{ROOT}/model" }} dataset {{ paths: "{ROOT}/data/alpaca.jsonl" '
    f'max_seq_length: 64 }} training {{ per_device_train_batch_size: 2 max_steps: 5 }} '
    f'output_dir: "{ROOT}/out/run1"',
    f'display_name: "chat" model {{ path: "{ROOT}/model" }} dataset {{ paths: "{ROOT}/data/chat.json" '
    f'paths: "{ROOT}/data/sharegpt.json" template: "{ROOT}/template.jinja" mask_prompt: true }} '
    f'output_dir: "{ROOT}/out/run2" offload {{ offload_optimizer {{ device: OFFLOAD_DEVICE_NVME '
    f'nvme_path: "{ROOT}/nvme" }} }}',
    f'model {{ path: "{ROOT}/model" }} tokenizer {{ path: "{ROOT}/model/tokenizer.json" }} '
    f'dataset {{ paths: "{ROOT}/data/text.jsonl" paths: "{ROOT}/data/pretok.jsonl" '
    f'template: "builtin" format: DATASET_FORMAT_TEXT }} output_dir: "{ROOT}/out/run3" '
    f'labels {{ key: "a" value: "b" }}',
    f'model {{ path: "{ROOT}/../etc" }} dataset {{ paths: "/etc/passwd" }} output_dir: "/tmp"',
]


def encode(message, text, proto="offloadd/v1/job.proto"):
    """The protobuf wire format of `text` (text format) as `message`; None without protoc."""
    protoc = shutil.which("protoc")
    if not protoc:
        return None
    r = subprocess.run([protoc, f"--encode=offloadd.v1.{message}", "--proto_path=" + os.path.join(REPO, "proto"),
                        proto], input=text.encode(), capture_output=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"protoc --encode={message} failed: {r.stderr.decode()}\n{text}")
    return r.stdout


def job_spec_seeds(c):
    if not shutil.which("protoc"):
        print("make_corpus: protoc not found; job_spec and grpc_handlers start from empty corpora", file=sys.stderr)
        return
    for i, text in enumerate(JOB_SPECS):
        c.add("job_spec", f"spec{i}.pb", encode("JobSpec", text))


# --- gRPC call sequences (grpc_handlers_fuzzer: method byte, u16 length, request) --------------

GRPC_ROOT = "/tmp/offloadd-fuzz-grpc"
GRPC_METHODS = {"CreateJob": (0, "CreateJobRequest"), "GetJob": (1, "GetJobRequest"),
                "ListJobs": (2, "ListJobsRequest"), "CancelJob": (3, "CancelJobRequest"),
                "PauseJob": (4, "PauseJobRequest"), "ResumeJob": (5, "ResumeJobRequest"),
                "WatchJob": (6, "WatchJobRequest"), "ListCheckpoints": (7, "ListCheckpointsRequest"),
                "GetNodeInfo": (8, "GetNodeInfoRequest")}


def grpc_calls(calls):
    out = b""
    for method, text in calls:
        code, message = GRPC_METHODS[method]
        proto = "offloadd/v1/node_service.proto" if method == "GetNodeInfo" else "offloadd/v1/job_service.proto"
        body = encode(message, text, proto)
        out += struct.pack("<BH", code, len(body)) + body
    return out


def grpc_seeds(c):
    if not shutil.which("protoc"):
        return
    spec = JOB_SPECS[0].replace(ROOT, GRPC_ROOT)
    chat = JOB_SPECS[1].replace(ROOT, GRPC_ROOT)
    hostile = JOB_SPECS[3].replace(ROOT, GRPC_ROOT)
    seqs = {
        "create-watch": [("CreateJob", f"spec {{ {spec} }}"), ("GetJob", 'job_id: "$0"'),
                         ("WatchJob", 'job_id: "$0"'), ("ListCheckpoints", 'job_id: "$0"'),
                         ("ListJobs", "page_size: 2")],
        "pause-resume-cancel": [("CreateJob", f"spec {{ {chat} }}"), ("PauseJob", 'job_id: "$0"'),
                                ("ResumeJob", 'job_id: "$0"'), ("CancelJob", 'job_id: "$0" reason: "r"'),
                                ("WatchJob", 'job_id: "$0" after_cursor: 2 include_progress: false')],
        "idempotent": [("CreateJob", f'spec {{ {spec} }} request_id: "r1"'),
                       ("CreateJob", f'spec {{ {spec} }} request_id: "r1"'),
                       ("CreateJob", f'spec {{ {chat} }} request_id: "r1"'), ("CancelJob", 'job_id: "$0"')],
        "validate-node": [("CreateJob", f"spec {{ {spec} }} validate_only: true"), ("GetNodeInfo", ""),
                          ("ListJobs", "states: JOB_STATE_QUEUED page_token: \"1\"")],
        "hostile": [("CreateJob", f"spec {{ {hostile} }}"), ("GetJob", 'job_id: "../../etc/passwd"'),
                    ("ResumeJob", 'job_id: "$0"')],
    }
    for name, calls in seqs.items():
        c.add("grpc_handlers", name, grpc_calls(calls))


# --- wire formats ------------------------------------------------------------------------------

def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def commit_entry(layer, kind, part, version, size, chunk_bytes, extents, chunks):
    e = struct.pack("<IIIIQQII", 1, layer, kind, part, version, size, chunk_bytes, len(extents))
    for d, off, length in extents:
        e += struct.pack("<HQQ", d, off, length)
    e += struct.pack("<I", len(chunks))
    for d, crc in chunks:
        e += struct.pack("<HI", d, crc)
    return e


def drop_entry(layer, kind, part, version):
    return struct.pack("<IIIIQ", 2, layer, kind, part, version)


def frame(entries):
    payload = struct.pack("<I", len(entries)) + b"".join(entries)
    return struct.pack("<III", 0x524D464F, len(payload), crc32c(payload)) + payload


def store_seeds(c):
    e1 = commit_entry(0, 1, 0, 1, 10000, 4096, [(0, 0, 8192), (1, 4096, 4096)],
                      [(0, 0x1234), (1, 0x5678), (0, 0x9ABC)])
    e2 = commit_entry(3, 2, 1, 7, 4096, 4096, [(0, 8192, 4096)], [(0, 0)])
    d1 = drop_entry(0, 1, 0, 1)
    image = frame([e1]) + frame([e2, d1])
    c.add("store_format", "manifest", b"\0" + image)
    c.add("store_format", "manifest_torn", b"\0" + image + frame([e1])[:-3])
    for i, payload in enumerate(([e1], [e2, d1], [])):
        p = struct.pack("<I", len(payload)) + b"".join(payload)
        c.add("store_format", f"framed{i}", b"\1" + struct.pack("<H", len(p)) + p)
    body = struct.pack("<QIII", 0x3152545344464C4F, 1, 0, 2) + bytes(range(16))
    c.add("store_format", "identity", b"\2" + body + struct.pack("<I", crc32c(body)))


def worker_seeds(c):
    # Offsets name regions by their low 3 bits (0 grad, 1 master, 2 exp_avg, 3 exp_avg_sq,
    # 4 weights, 5 counters, 6 accum, 7 raw) and a delta in the rest (worker_protocol_fuzzer.cc).
    n = 2 * 2048 + 5
    adamw = struct.pack("<QQQQQQQQdddddfI", n, 0, 1, 2, 3, 4, 5, 1, 1e-3, 0.9, 0.999, 1e-8, 0.01,
                        1.0, 3)
    c.add("worker_protocol", "adamw_fp32", b"\0" + struct.pack("<IIQ", 1, 1, 42) + adamw.ljust(112, b"\0"))
    c.add("worker_protocol", "adamw_bf16", b"\0" + struct.pack("<IIQ", 1, 0, 43) + adamw.ljust(112, b"\0"))
    acc = struct.pack("<QQQQQII", n, 0, 6, 5, 1, 2, 0)
    c.add("worker_protocol", "accumulate", b"\0" + struct.pack("<IIQ", 2, 1 | 8, 44) + acc.ljust(112, b"\0"))
    gn = struct.pack("<QQII", 3000, 0, 1, 0)
    c.add("worker_protocol", "gradnorm", b"\0" + struct.pack("<IIQ", 3, 1, 45) + gn.ljust(112, b"\0"))
    c.add("worker_protocol", "shutdown", b"\0" + struct.pack("<IIQ", 4, 0, 46) + bytes(112))
    slot = struct.pack("<IIQQQQQQ", 1, 3, 5, 1, 16, 1, 2 | 8 * 64, 3) + bytes(16)
    c.add("worker_protocol", "redo_slot", b"\1" + slot + struct.pack("<f", 1.5) * 64)
    seg = struct.pack("<QIIQQ", 0x3144444F4C464F21, 1, 96, 65536, 4096) + b"fuzz".ljust(64, b"\0")
    c.add("worker_protocol", "segment", b"\2" + seg.ljust(65536, b"\0"))


# --- the OpenAI-compatible API (openai_request_fuzzer: mode byte, then an upload / a create
# request / a chat JSONL file) --------------------------------------------------------------------

def openai_seeds(c):
    rec = json.dumps({"messages": [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "Hi"},
                                   {"role": "assistant", "content": "Hello."}]})
    tool = json.dumps({"messages": [{"role": "user", "content": "weather?"},
                                    {"role": "assistant", "content": None, "tool_calls": [
                                        {"id": "1", "type": "function",
                                         "function": {"name": "w", "arguments": "{}"}}]},
                                    {"role": "tool", "content": "sunny"},
                                    {"role": "assistant", "content": "Sunny."}]})
    body = ("--b0\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nfine-tune\r\n"
            "--b0\r\nContent-Disposition: form-data; name=\"file\"; filename=\"t.jsonl\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n" + rec + "\n" + tool + "\n\r\n--b0--\r\n")
    c.add("openai_request", "upload", b"\x00multipart/form-data; boundary=b0\x00" + body.encode())
    requests = [
        {"model": "stories260K", "training_file": "file-a"},
        {"model": "stories260K", "training_file": "file-a", "validation_file": "file-a",
         "hyperparameters": {"n_epochs": 2, "batch_size": 4, "learning_rate_multiplier": 0.5},
         "suffix": "demo", "seed": 7},
        {"model": "/srv/models/m", "training_file": "file-a",
         "method": {"type": "supervised", "supervised": {"hyperparameters": {"batch_size": "auto"}}}},
        {"model": "x", "training_file": "file-b", "method": {"type": "dpo"}, "metadata": {"k": "v"}},
    ]
    for i, r in enumerate(requests):
        c.add("openai_request", f"create{i}", b"\x01" + json.dumps(r).encode())
    c.add("openai_request", "jsonl", b"\x02" + (rec + "\n\n" + tool + "\r\n").encode())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=os.path.join(REPO, "..", "shared", "data"))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if not os.path.isdir(args.shared):
        raise SystemExit(f"make_corpus: {args.shared} not found (the real data files; set "
                         "OFFLOADD_FUZZ_DATA)")
    if os.path.isdir(args.out):
        shutil.rmtree(args.out)
    c = Corpus(args.out)
    tokenizer_seeds(c, args.shared)
    jinja_seeds(c, args.shared)
    dataset_seeds(c, args.shared)
    columnar_seeds(c)
    safetensors_seeds(c)
    model_config_seeds(c)
    yaml_seeds(c)
    job_spec_seeds(c)
    grpc_seeds(c)
    store_seeds(c)
    worker_seeds(c)
    openai_seeds(c)
    print("make_corpus: " + ", ".join(f"{h} {n}" for h, n in sorted(c.counts.items())))


if __name__ == "__main__":
    main()
