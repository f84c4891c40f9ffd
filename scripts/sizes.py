#!/usr/bin/env python3
"""Files over 800 lines and functions over 150 lines in the project's own sources.

    scripts/sizes.py [--root DIR] [--files N] [--functions N] [--list]

C/C++/CUDA function extents come from Universal Ctags (`ctags --fields=+ne`: a definition's
first and last line); Python's from its own parser. In a git checkout only tracked files count
(tests/ included: the house rule covers it); build outputs never do.
Prints the counts, and with --list every offender with its length. Exits 0 whatever it finds:
it reports, tests/python/test_source_layout.py enforces.
"""
import argparse
import ast
import json
import pathlib
import shutil
import subprocess
import sys

CPP = (".cc", ".h", ".cu", ".inc", ".cpp", ".hpp")
SKIP = {"build", ".git", "third_party", "node_modules", ".venv"}


def sources(root):
    """The tracked files of a git checkout (so build trees and stray copies are left out), else
    every file under root but build outputs."""
    try:
        names = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], check=True,
                               capture_output=True, text=True).stdout.split("\0")
        paths = [root / n for n in names if n]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in root.rglob("*")
                 if not any(part in SKIP or part.startswith("build")
                            for part in p.relative_to(root).parts[:-1])]
    for p in sorted(paths):
        if p.is_file() and (p.suffix in CPP or p.suffix == ".py"):
            yield p


def cpp_functions(paths):
    if not shutil.which("ctags"):
        sys.exit("sizes.py: Universal Ctags is needed for C++ function lengths (apt install "
                 "universal-ctags)")
    out = subprocess.run(
        ["ctags", "--output-format=json", "--fields=+ne", "--kinds-C++=f", "--kinds-C=f",
         "--languages=C++,C", "--langmap=C++:+.cu.inc", "-f", "-"] + [str(p) for p in paths],
        check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        tag = json.loads(line)
        if tag.get("_type") == "tag" and "end" in tag:
            yield tag["path"], tag.get("scope", "") + "::" + tag["name"] if tag.get("scope") \
                else tag["name"], tag["end"] - tag["line"] + 1


def py_functions(path):
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield str(path), node.name, node.end_lineno - node.lineno + 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=pathlib.Path(__file__).resolve().parents[1], type=pathlib.Path)
    ap.add_argument("--files", type=int, default=800, help="file length limit (lines)")
    ap.add_argument("--functions", type=int, default=150, help="function length limit (lines)")
    ap.add_argument("--list", action="store_true", help="name every offender")
    args = ap.parse_args()
    root = args.root.resolve()
    files = list(sources(root))
    long_files = []
    for p in files:
        n = len(p.read_text(errors="replace").splitlines())
        if n > args.files:
            long_files.append((n, str(p.relative_to(root))))
    funcs = list(cpp_functions([p for p in files if p.suffix in CPP]))
    for p in files:
        if p.suffix == ".py":
            funcs.extend(py_functions(p))
    long_funcs = sorted(((n, str(pathlib.Path(f).resolve().relative_to(root)), name)
                         for f, name, n in funcs if n > args.functions), reverse=True)
    print(f"{len(files)} source files, {len(funcs)} functions")
    print(f"files over {args.files} lines: {len(long_files)}")
    print(f"functions over {args.functions} lines: {len(long_funcs)}")
    if args.list:
        for n, rel in sorted(long_files, reverse=True):
            print(f"  file {rel}: {n}")
        for n, rel, name in long_funcs:
            print(f"  function {rel} {name}: {n}")


if __name__ == "__main__":
    main()
