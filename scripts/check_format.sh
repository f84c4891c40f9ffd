#!/usr/bin/env bash
# The format check CI runs (.ci/run): clang-format (.clang-format at the root) over the C++ lines
# changed since the base, never the whole tree. Prints the diff that would make them conform and
# exits 1 when there is one.
#   OFFLOADD_FORMAT_BASE  the commit to compare against (default: the merge base with main, or with
#                         origin/main; on main itself, the parent of HEAD)
# Fix locally with: git clang-format "$(git merge-base HEAD main)"
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
command -v git-clang-format >/dev/null \
  || { echo "[format] git-clang-format is missing (apt-get install clang-format; scripts/setup.sh)" >&2; exit 1; }
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
# git-clang-format 14 exits 0 whether or not it has a diff to show: the diff itself is the verdict.
out="$(git clang-format --diff --extensions cc,h,cu,cuh "$base" 2>&1)" \
  || { echo "$out" >&2; echo "[format] git clang-format failed" >&2; exit 1; }
if [[ "$out" != *"diff --git"* ]]; then
  echo "[format] lines changed since $(git rev-parse --short "$base") follow .clang-format"
  exit 0
fi
echo "$out"
echo "[format] FAILED: the lines above, changed since $(git rev-parse --short "$base"), do not follow" \
  ".clang-format; run: git clang-format $(git rev-parse --short "$base")" >&2
exit 1
