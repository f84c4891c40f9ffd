"""The licence: Apache-2.0 at the root, the same text in the Python SDK's wheel (PEP 639 metadata)
and in the Debian package's machine-readable debian/copyright, which also names the licences of
the data the repository bundles (examples/data)."""

from __future__ import annotations

import os
import pathlib
import re
import zipfile

import pytest

SOURCE = pathlib.Path(os.environ.get("OFFLOADD_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[3]))
BUILD = pathlib.Path(os.environ.get("OFFLOADD_BINARY_DIR", SOURCE / "build"))


def test_root_licence_is_apache_2():
    text = (SOURCE / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the full text, not a notice


def test_python_package_declares_and_ships_the_licence():
    py = SOURCE / "client/python"
    # The wheel can only hold files inside its project directory: a copy, kept identical.
    assert (py / "LICENSE").read_bytes() == (SOURCE / "LICENSE").read_bytes()
    toml = (py / "pyproject.toml").read_text()
    assert re.search(r'^license = "Apache-2.0"$', toml, re.M), "pyproject.toml: no SPDX license"
    assert re.search(r'^license-files = \["LICENSE"\]$', toml, re.M)


def test_built_wheel_metadata_names_the_licence():
    wheels = sorted((BUILD / "deploy/python").glob("offloadd-*-py3-none-any.whl"))
    if not wheels:
        pytest.skip(f"no wheel built under {BUILD}/deploy/python (target offloadd_python_wheel)")
    with zipfile.ZipFile(wheels[-1]) as z:
        info = next(n.split("/")[0] for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = z.read(f"{info}/METADATA").decode()
        assert "License-Expression: Apache-2.0" in meta, meta[:600]
        assert "License-File: LICENSE" in meta
        assert z.read(f"{info}/licenses/LICENSE") == (SOURCE / "LICENSE").read_bytes()


def dep5_paragraphs(text: str) -> list[dict[str, str]]:
    paras = []
    for block in re.split(r"\n\s*\n", text.strip()):
        fields: dict[str, str] = {}
        key = None
        for line in block.splitlines():
            if line.startswith("#"):
                continue
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line.strip()
            else:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        paras.append(fields)
    return paras


def test_debian_copyright_is_dep5_and_covers_the_bundled_data():
    paras = dep5_paragraphs((SOURCE / "debian/copyright").read_text())
    header = paras[0]
    assert header["Format"] == "https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
    files = {p["Files"]: p for p in paras[1:] if "Files" in p}
    standalone = {p["License"].split("\n")[0] for p in paras[1:] if "Files" not in p and "License" in p}
    assert files["*"]["License"].startswith("Apache-2.0")
    assert files["examples/data/stories260K/*"]["License"].startswith("Expat")
    assert files["examples/data/alpaca/*"]["License"].startswith("CC-BY-NC-4.0")
    # Every short name used is spelled out: a stand-alone paragraph or the text under Files.
    for pattern, p in files.items():
        name, _, body = p["License"].partition("\n")
        assert body or name in standalone, f"{pattern}: licence {name} has no text"
    # Every file under examples/data is matched by a paragraph more specific than "*".
    for f in (SOURCE / "examples/data").rglob("*"):
        if f.is_file():
            rel = f.relative_to(SOURCE).as_posix()
            assert any(pat != "*" and pathlib.PurePosixPath(rel).match(pat) for pat in files), rel
