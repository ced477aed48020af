#!/usr/bin/env bash
# Installs what the benchmark needs (first run only) and runs it: RAM / RAM+ / probe speed against the copy_
# floor and mergekit's ram, and peak memory (see benchmarks/bench_merge.py; --quick for a < 1 min run).
set -euo pipefail
. "$(dirname "$0")/env.sh"
python benchmarks/bench_merge.py "$@"
