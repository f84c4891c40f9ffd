"""Shared pytest fixtures: where the build and the sources are."""

import os
import pathlib

import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("OFFLOADD_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
BINARY_DIR = pathlib.Path(os.environ.get("OFFLOADD_BINARY_DIR", SOURCE_DIR / "build"))
SHARED_DIR = SOURCE_DIR.parent / "shared"


@pytest.fixture(scope="session")
def binary_dir() -> pathlib.Path:
    return BINARY_DIR


@pytest.fixture(scope="session")
def source_dir() -> pathlib.Path:
    return SOURCE_DIR


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
    if not SHARED_DIR.is_dir():
        pytest.skip(f"{SHARED_DIR} (the shared data folder) is not present")
    return SHARED_DIR
