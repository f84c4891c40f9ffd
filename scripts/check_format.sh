#!/usr/bin/env bash
# The format check CI runs (.ci/run): clang-format (.clang-format at the root) over the C++ lines
# changed since the base, never the whole tree. Prints the diff that would make them conform and
# exits 1 when there is one.
#   OFFLOADD_FORMAT_BASE  the commit to compare against (default: the merge base with main, or with
#                         origin/main; on main itself, the parent of HEAD)
# Fix locally with: git diff -M -U0 "$(git merge-base HEAD main)" | clang-format-diff -p1 -i
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
base="${OFFLOADD_FORMAT_BASE:-}"
if [[ -z "$base" ]]; then
  for ref in main origin/main; do
    if git rev-parse --verify -q "$ref^{commit}" >/dev/null; then
      base="$(git merge-base HEAD "$ref" 2>/dev/null || true)"
      [[ -n "$base" ]] && break
    fi
  done
  # On main (or with no main at all) the change under test is the last commit.
  if [[ -z "$base" || "$base" == "$(git rev-parse HEAD)" ]]; then
    base="$(git rev-parse -q --verify HEAD~1 || true)"
  fi
fi
[[ -n "$base" ]] || { echo "[format] no base commit to compare against; nothing checked"; exit 0; }
# The changed lines, with renames followed (-M): a file moved to another folder keeps its old lines,
# which are not changed ones (git clang-format diffs with diff-index, which sees a moved file as
# new from its first line to its last). clang-format-diff comes with clang-format.
command -v clang-format-diff >/dev/null \
  || { echo "[format] clang-format-diff is missing (apt-get install clang-format; scripts/setup.sh)" >&2; exit 1; }
out="$(git diff -M -U0 --no-color "$base" -- '*.cc' '*.h' '*.cu' '*.cuh' | clang-format-diff -p1 2>&1)" \
  || { echo "$out" >&2; echo "[format] clang-format-diff failed" >&2; exit 1; }
if [[ "$out" != *"@@"* ]]; then
  echo "[format] lines changed since $(git rev-parse --short "$base") follow .clang-format"
  exit 0
fi
echo "$out"
echo "[format] FAILED: the lines above, changed since $(git rev-parse --short "$base"), do not follow" \
  ".clang-format; run: git diff -M -U0 $(git rev-parse --short "$base") | clang-format-diff -p1 -i" >&2
exit 1
