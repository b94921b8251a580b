#!/usr/bin/env bash
# What CI sees, checked before a push: clone HEAD into a temporary folder, install into a new
# venv (so nothing installed by hand leaks in), run the README's two commands there.
#   bash scripts/fresh_clone_check.sh
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
git clone -q "$repo" "$work/src"
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
cd "$work/src"
"$py" -m pip install -q -c constraints.txt -e '.[dev]'
"$py" -m pytest -q
"$py" -m crucible generate --prompt "The capital of France is" --max-tokens 8 --temperature 0
