#!/usr/bin/env bash
# Streaming-from-disk benchmark (issue 7): RAM / RAM+ on sharded HF folders vs the read-and-write floor and
# mergekit-yaml's ram, peak RSS and seconds, cold and warm (see benchmarks/bench_stream.py; --quick < 1 min).
set -euo pipefail
. "$(dirname "$0")/env.sh"; python benchmarks/bench_stream.py "$@"
