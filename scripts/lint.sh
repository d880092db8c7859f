#!/usr/bin/env bash
# Lint and format checks over every tracked file (.pre-commit-config.yaml: ruff check, ruff
# format, clang-format, end-of-file newlines, trailing whitespace, no large files, no binaries).
#
#   bash scripts/lint.sh          check; writes no source file; exit 1 on any violation (CI)
#   bash scripts/lint.sh --fix    apply ruff's fixes and both formatters, then check
#
# The tools come from the venv that scripts/setup.sh makes (VENV, default .venv). pre-commit
# and ruff keep their state in build/ (pre-commit/, ruff-cache/): nothing outside is written.
set -euo pipefail
cd "$(dirname "$0")/.."

fix=0
case "${1:-}" in
  --fix) fix=1 ;;
  "") ;;
  -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: bash scripts/lint.sh [--fix]" >&2; exit 2 ;;
esac

VENV=${VENV:-.venv}
for tool in pre-commit ruff clang-format check-added-large-files end-of-file-fixer trailing-whitespace-fixer; do
  if [ ! -x "$VENV/bin/$tool" ]; then
    echo "lint: $VENV/bin/$tool is missing: run bash scripts/setup.sh (it installs ruff, clang-format," \
      "pre-commit and pre-commit-hooks)" >&2
    exit 2
  fi
done
export PATH="$(cd "$VENV/bin" && pwd):$PATH"
export PRE_COMMIT_HOME="$PWD/build/pre-commit"
export RUFF_CACHE_DIR="$PWD/build/ruff-cache"
mkdir -p "$PRE_COMMIT_HOME"

if [ "$fix" = 1 ]; then
  # The fixers (stage pre-commit) fail when they change a file; what counts is the check after.
  pre-commit run --all-files --hook-stage pre-commit || true
  echo "lint: fixes applied; checking"
fi
if pre-commit run --all-files --hook-stage manual; then
  echo "lint: passed"
else
  echo >&2
  if [ "$fix" = 1 ]; then
    echo "lint: violations remain that no tool fixes (listed above): fix them by hand, then run" \
      "bash scripts/lint.sh again" >&2
  else
    echo "lint: failed. To apply the formatters and ruff's fixes: bash scripts/lint.sh --fix" \
      "(or pre-commit run --all-files, with $VENV/bin on PATH); fix by hand what remains." >&2
  fi
  exit 1
fi
