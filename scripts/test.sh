#!/usr/bin/env bash
# Installs what the tests need (first run only), lints the tree and runs the tests.
set -euo pipefail
. "$(dirname "$0")/env.sh"
# the linter and the formatter (ruff, pinned in the test extra; settings in pyproject.toml's [tool.ruff]): any
# finding, or any file `ruff format` would change, fails the run
python -m ruff check .
python -m ruff format --check .
# mergekit, the oracle of tests/test_mergekit_yaml.py, lives in its own environment (never a dependency); that
# comparison is skipped when it cannot be built (no network, no python3.11).
if [ "${RAM_LIVE_MERGEKIT:-1}" != 0 ]; then
  bash "$root/benchmarks/mergekit_env.sh" >/dev/null \
    || echo "test.sh: no mergekit environment: tests/test_mergekit_yaml.py skips its comparison" >&2
fi
python -m pytest -q "$@"
