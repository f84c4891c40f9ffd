"""Fixtures for the text/ parity tests (helpers live in text_testlib.py)."""

import pathlib

import pytest

from text_testlib import DATA_DIR, TOK_DIR, build_llama3, build_llama_metaspace, build_qwen2_style


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


def pytest_configure(config):
    config.addinivalue_line("markers", "without_shared_data: runs without ../shared/data (real tokenizers, corpora)")


def pytest_collection_modifyitems(config, items):
    """Without ../shared/data, the text tests that read it skip, naming the folder (a plain clone
    has none); those marked without_shared_data still run."""
    if DATA_DIR.is_dir():
        return
    here = pathlib.Path(__file__).parent
    skip = pytest.mark.skip(reason=f"{DATA_DIR} (the shared data folder: real tokenizers, corpora) is not present")
    for item in items:
        if here in pathlib.Path(item.fspath).parents and item.get_closest_marker("without_shared_data") is None:
            item.add_marker(skip)
