#!/usr/bin/env bash
# Installs what the demo needs (first run only) and runs the quickstart: a tiny Llama built from a config,
# three agents with sparse, heterogeneous updates, the probe, and every merge method.
set -euo pipefail
. "$(dirname "$0")/env.sh"
python examples/quickstart.py "$@"
