#!/usr/bin/env bash
# Where a first touch's CPU goes (issue 42): for each chirp binary given, chirp on a flushed
# prefix of scripts/bench's database, then wrk at 32 connections for BENCH_SECONDS (default 5)
# over the first newsfeed pages of 12,000 readers no bench-cold pass samples (each request a
# first touch), and each side's CPU (user + system, from /proc) per first page: chirp, every
# Postgres process, redis-server.
#
#   bench/cold-cpu.sh BIN [BIN ...]     alternate the binaries for an A/B: A B A B
#
# Needs scripts/bench-cold's reader files (.local/bench-cold; run scripts/bench-cold once).
# BENCHMARKS.md round 32.
set -euo pipefail
cd "$(dirname "$0")/.."
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/chirp_bench}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"
export CHIRP_REDIS_PREFIX="${CHIRP_REDIS_PREFIX:-chirpbench}"
port="${BENCH_PORT:-18189}"
seconds="${BENCH_SECONDS:-5}"
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
trap stop EXIT
readers=.local/bench-cold/all.tsv
[ -s "$readers" ] || { echo "cold-cpu: run scripts/bench-cold first" >&2; exit 1; }
# Clock ticks (user + system) of the processes named $1, summed.
ticks() { pgrep -x "$1" | while read -r p; do awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null; done | awk '{t += $1} END {print t + 0}'; }
tail -n 12000 "$readers" > "$readers.cpu"
hz="$(getconf CLK_TCK)"
for bin in "$@"; do
  stop; flush_cache; start_chirp "$bin" .local/bench-cold/cpu.server.log
  for _ in $(seq 1 100); do curl -sf "$base/healthz" | grep -q '"redis":"ok"' && break; sleep 0.1; done
  c0="$(awk '{print $14 + $15}' "/proc/$pid/stat")" p0="$(ticks postgres)" r0="$(ticks redis-server)"
  result="$(wrk -t1 -c32 -d"${seconds}s" -s bench/replay.lua "$base" -- "$readers.cpu" | grep '^RESULT')"
  c1="$(awk '{print $14 + $15}' "/proc/$pid/stat")" p1="$(ticks postgres)" r1="$(ticks redis-server)"
  n="$(sed -n 's/.*requests=\([0-9]*\).*/\1/p' <<<"$result")"
  awk -v b="$(basename "$bin")" -v n="$n" -v hz="$hz" -v c=$((c1 - c0)) -v p=$((p1 - p0)) -v r=$((r1 - r0)) \
    'BEGIN {printf "%s: %d first pages; CPU ms per page: chirp %.2f, postgres %.2f, redis %.2f\n", b, n, c * 1000 / hz / n, p * 1000 / hz / n, r * 1000 / hz / n}'
  echo "  $result"
done
