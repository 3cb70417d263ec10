#!/usr/bin/env bash
# Formatting and lint, as CI checks them (tools/run_tests.sh runs this first):
#   C++:    clang-format (.clang-format), every tracked .cpp and .h
#   Python: ruff check and ruff format (pyproject.toml's [tool.ruff])
# To fix: clang-format -i $(git ls-files '*.cpp' '*.h') && ruff format . && ruff check --fix .
set -euo pipefail
cd "$(dirname "$0")/.."

git ls-files -z '*.cpp' '*.h' | xargs -0 clang-format --dry-run -Werror
ruff check --quiet .
ruff format --check --quiet .
echo "lint: ok (clang-format $(clang-format --version | grep -o '[0-9][0-9.]*' | head -1), $(ruff --version))"
