"""Fixtures for the text/ parity tests (helpers live in text_testlib.py)."""

import pytest

from text_testlib import TOK_DIR, build_llama3, build_llama_metaspace, build_qwen2_style


@pytest.fixture(scope="session")
def tokenizer_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokenizers")
    paths = {
        "gpt2": TOK_DIR / "gpt2" / "tokenizer.json",
        "llama2": TOK_DIR / "llama2" / "tokenizer.json",
        "phi3-mini": TOK_DIR / "phi3-mini" / "tokenizer.json",
        "llama3": d / "llama3.json",
        "qwen2-style": d / "qwen2.json",
        "llama2-metaspace": d / "llama2_metaspace.json",
    }
    build_llama3(paths["llama3"])
    build_qwen2_style(paths["qwen2-style"])
    build_llama_metaspace(paths["llama2-metaspace"])
    return paths
