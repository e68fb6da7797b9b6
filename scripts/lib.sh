# Shell helpers shared by the benchmark scripts: `source scripts/lib.sh` after setting
# DATABASE_URL, REDIS_URL, CHIRP_REDIS_PREFIX, `port` and `out` (a directory for logs).

base="http://127.0.0.1:${port:?set port before sourcing scripts/lib.sh}"
pid=""

# sql ARGS...: psql on $DATABASE_URL, unaligned, stopping at the first error.
sql() { psql "$DATABASE_URL" -X -q -v ON_ERROR_STOP=1 -tA "$@"; }

# stop: stops the chirp that `start_chirp` started, if any (SIGTERM: it drains and exits).
stop() { if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=""; fi; }

# start_chirp BIN LOG [ENV=VALUE ...]: starts `BIN serve` on $port without rate limits (one load
# client would hit the per-IP limits) and waits until it answers /livez.
start_chirp() {
  local bin="$1" log="$2"; shift 2
  stop
  env CHIRP_LISTEN="127.0.0.1:$port" CHIRP_RATE_LIMITS=off RUST_LOG=warn "$@" "$bin" serve >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do curl -sf "$base/livez" >/dev/null && return 0; sleep 0.1; done
  echo "chirp did not start; see $log" >&2; exit 1
}

# flush_cache: removes every key of $CHIRP_REDIS_PREFIX (a flush of this chirp's cache alone).
flush_cache() { redis-cli -u "$REDIS_URL" --scan --pattern "$CHIRP_REDIS_PREFIX:*" | xargs -r -n 500 redis-cli -u "$REDIS_URL" unlink >/dev/null; }

# drain_jobs: waits (while chirp runs: its worker takes them) until the fan-out queue is empty.
drain_jobs() {
  for _ in $(seq 1 600); do [ "$(sql -c "select count(*) from jobs")" = 0 ] && return 0; sleep 1; done
  echo "jobs did not drain" >&2
}

# percentiles: reads one latency (ms) per line; prints "n p50 p90 p99 max" (nearest rank).
percentiles() {
  sort -g | awk '{v[NR]=$1} END {
    if (NR == 0) { print "0 - - - -"; exit }
    split("50 90 99", q, " ")
    printf "%d", NR
    for (i = 1; i <= 3; i++) { r = int((q[i] * NR + 99) / 100); if (r < 1) r = 1; printf " %.2f", v[r] }
    printf " %.2f\n", v[NR] }'
}
