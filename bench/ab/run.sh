#!/usr/bin/env bash
# One run of a same-session A/B of two chirp builds: run.sh A|B|C RUN_NO.
# Fresh database + Redis prefix, start the build's `chirp serve`, seed 200 users (20 follows and
# 10 tweets each) through the API, then wrk -t1 -c32 15 s (after 5 s warm-up) on
# POST /api/tweets/, GET /api/newsfeeds/ and GET /livez, recording requests/s, percentiles and
# the server's CPU seconds. Build X first:
#   git worktree add /tmp/ab-X <commit> && (cd /tmp/ab-X && CARGO_TARGET_DIR=/tmp/ab-X-target cargo build --release --locked)
# Logs go to $AB_LOGS (default /tmp/ab-logs). Alternate the builds (A B A B ...).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
X="$1"; N="$2"
case "$X" in
  A) PORT=18191 ;;
  B) PORT=18192 ;;
  C) PORT=18193 ;;
  *) echo "A, B or C"; exit 2 ;;
esac
DB="chirp_ab_$X"; PREFIX="ab$X"; BIN="${AB_BIN_ROOT:-/tmp}/ab-$X-target/release/chirp"
BASE="http://127.0.0.1:$PORT"
L=${AB_LOGS:-/tmp/ab-logs}/$X-run$N; mkdir -p "$L"
TOK=${AB_LOGS:-/tmp/ab-logs}/tokens-$X-run$N.txt
command -v wrk >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
sql() { psql -h 127.0.0.1 -U postgres -d "$DB" -X -q -tA -c "$1"; }
now() { date -u +%FT%T.%3NZ; }
log() { echo "[$(now)] $X run$N: $*" | tee -a "$L/run.log"; }
cpu() { awk '{print $14+$15}' /proc/$1/stat; }   # utime+stime in clock ticks

# fresh state
psql -h 127.0.0.1 -U postgres -X -q -c "drop database if exists \"$DB\" with (force)"
redis-cli --scan --pattern "$PREFIX*" | xargs -r redis-cli unlink >/dev/null
log "dropped $DB, redis keys left under $PREFIX*: $(redis-cli --scan --pattern "$PREFIX*" | wc -l)"

# start
DATABASE_URL="postgres://postgres@127.0.0.1:5432/$DB" CHIRP_REDIS_PREFIX="$PREFIX" \
  CHIRP_LISTEN="127.0.0.1:$PORT" CHIRP_RATE_LIMITS=off RUST_LOG=warn "$BIN" serve > "$L/server.log" 2>&1 &
SPID=$!; echo "$SPID" > "$L/server.pid"
trap 'kill "$SPID" 2>/dev/null || true' EXIT  # a failed step must not leave the server running
for i in $(seq 1 300); do
  curl -fs "$BASE/livez" >/dev/null 2>&1 && break
  kill -0 "$SPID" 2>/dev/null || { log "server died"; cat "$L/server.log"; exit 1; }
  sleep 0.1
done
log "server pid $SPID up on $PORT"

# seed
python3 "$here/seed.py" "$PORT" "$TOK" | tee -a "$L/run.log"
wait_jobs() {  # waits for jobs=0, prints seconds waited
  local t0=$(date +%s.%N) c
  for i in $(seq 1 3000); do
    c=$(sql "select count(*) from jobs"); [ "$c" = 0 ] && break; sleep 0.1
  done
  echo "$(echo "$(date +%s.%N) - $t0" | bc)"
}
log "seed jobs drained after $(wait_jobs) s; counts: users=$(sql 'select count(*) from users') follows=$(sql 'select count(*) from friendships') tweets=$(sql 'select count(*) from tweets') newsfeeds=$(sql 'select count(*) from newsfeeds') outbox=$(sql 'select count(*) from cache_outbox')"

measure() {  # name method path [post] url
  local name=$1 method=$2 path=$3 post=${4:-}
  wrk -t1 -c32 -d5s --latency -s "$here/wrk.lua" "$BASE$path" -- "$TOK" "$method" "$path" $post > "$L/$name-warmup.txt" 2>&1
  local c0=$(cpu $SPID)
  wrk -t1 -c32 -d15s --latency -s "$here/wrk.lua" "$BASE$path" -- "$TOK" "$method" "$path" $post > "$L/$name.txt" 2>&1
  local c1=$(cpu $SPID)
  log "$name: $(grep RESULT "$L/$name.txt") | wrk: $(grep -E 'Requests/sec' "$L/$name.txt" | tr -s ' ') | non2xx: $(grep -E 'Non-2xx' "$L/$name.txt" || echo none) | sockerr: $(grep -E 'Socket errors' "$L/$name.txt" || echo none) | chirp_cpu_s=$(echo "scale=2; ($c1-$c0)/$(getconf CLK_TCK)" | bc) | warmup: $(grep RESULT "$L/$name-warmup.txt")"
}

measure write POST /api/tweets/ post
log "after write: jobs=$(sql 'select count(*) from jobs') outbox=$(sql 'select count(*) from cache_outbox') tweets=$(sql 'select count(*) from tweets')"
log "write jobs drained after $(wait_jobs) s; newsfeeds=$(sql 'select count(*) from newsfeeds') outbox=$(sql 'select count(*) from cache_outbox')"
measure read GET /api/newsfeeds/
log "after read: jobs=$(sql 'select count(*) from jobs')"
measure livez GET /livez
log "end: jobs=$(sql 'select count(*) from jobs') outbox=$(sql 'select count(*) from cache_outbox') redis_keys=$(redis-cli --scan --pattern "$PREFIX*" | wc -l) server_log_lines=$(wc -l < "$L/server.log")"

# Leases: a lapse under load would send reads to Postgres (terms counts the grants after one).
log "leases: $(curl -fs "$BASE/healthz" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("memory", d.get("lease"), "hand-offs", d.get("hand_off_lease"), "recoveries", d.get("cache", {}).get("recoveries"))')"
kill "$SPID"; wait "$SPID" || true
log "server stopped"
