#!/usr/bin/env bash
# Installs what the tests need (first run only) and runs them.
set -euo pipefail
. "$(dirname "$0")/env.sh"
python -m pytest -q "$@"
