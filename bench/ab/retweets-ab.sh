#!/usr/bin/env bash
# A/B of rows 2 (newsfeed first page), 4 (user tweets first page) and 7 (DeathStarBench mix) of
# scripts/bench, two builds alternated twice, on the request files scripts/bench wrote
# (.local/bench). Each build serves its own database (BASE_DB, HEAD_DB: a copy made with
# `create database … template …`, so an older build finds only the migrations it knows) and
# its own Redis prefix. Rounds 27 and 28 of BENCHMARKS.md.
#
#   BASE_BIN=/tmp/chirp-base HEAD_BIN=target/release/chirp \
#   BASE_DB=postgres://…/chirp_bench_base HEAD_DB=postgres://…/chirp_bench bench/ab/retweets-ab.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
work="${BENCH_WORK:-.local/bench}"
port="${AB_PORT:-18191}"; base="http://127.0.0.1:$port"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"
run_one() { # label bin db prefix
  local label="$1" bin="$2" db="$3" prefix="$4"
  redis-cli -u "$REDIS_URL" --scan --pattern "$prefix:*" | xargs -r -n 500 redis-cli -u "$REDIS_URL" unlink >/dev/null
  env DATABASE_URL="$db" CHIRP_REDIS_PREFIX="$prefix" CHIRP_LISTEN="127.0.0.1:$port" CHIRP_RATE_LIMITS=off RUST_LOG=warn "$bin" serve > "$work/ab-server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 100); do curl -sf "$base/livez" >/dev/null && break; sleep 0.1; done
  for row in feed tweets dsb; do
    wrk -t1 -c32 -d5s -s bench/replay.lua "$base" -- "$work/$row.tsv" >/dev/null
    echo "$label $row $(wrk -t1 -c32 -d15s --latency -s bench/replay.lua "$base" -- "$work/$row.tsv" | grep '^RESULT')"
  done
  kill -TERM "$pid"; wait "$pid" 2>/dev/null
}
# AB_ORDER="head base" runs head first: run both orders to cancel a drift of the machine
# (round 28 saw every run faster than the one before).
for _ in 1 2; do
  for which in ${AB_ORDER:-base head}; do
    case "$which" in
      base) run_one base "$BASE_BIN" "$BASE_DB" abbase ;;
      head) run_one head "$HEAD_BIN" "$HEAD_DB" abhead ;;
    esac
  done
done
