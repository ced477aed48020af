#!/usr/bin/env bash
# Streaming-from-disk benchmark: RAM / RAM+ on sharded HF folders vs the floor (the merge's reads and
# writes with its threads, no arithmetic) and mergekit-yaml's ram, peak RSS and seconds, cold and warm; the CPU
# (AVX-512 / AVX2) in the heading (see benchmarks/bench_stream.py; --quick ~2 min on a busy 2-vCPU VM).
set -euo pipefail
. "$(dirname "$0")/env.sh"; python benchmarks/bench_stream.py "$@"
