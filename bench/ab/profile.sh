#!/usr/bin/env bash
# Instructions per request of several chirp builds on the A/B harness's data, with callgrind
# (scripts/profile): repeatable to a fraction of a percent, where requests/s and CPU time on a
# shared 2-core machine swing by ±20 % from run to run.
#
#   bench/ab/profile.sh X [X ...]     e.g. bench/ab/profile.sh A A B C B C
#
# Seeds one database (chirp_ab_prof) through the API with the FIRST build listed (seed.py: 200
# users, 20 follows and 10 tweets each), then for each build in order runs `scripts/profile`
# on the warm newsfeed first page of the 200 seeded users, on each one's warm first page of
# another's tweets (logged in) and on `GET /livez`, and prints
# instructions per request. List older builds first: a newer build migrates the database
# forward, and an older one then refuses to start. Builds as in run.sh (/tmp/ab-X-target).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
command -v wrk >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
first="$1"
DB=chirp_ab_prof
export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$DB" CHIRP_REDIS_PREFIX=abprof
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"
psql -h 127.0.0.1 -U postgres -X -q -c "drop database if exists \"$DB\" with (force)"
redis-cli --scan --pattern "abprof*" | xargs -r redis-cli unlink >/dev/null
PORT=18194
CHIRP_LISTEN="127.0.0.1:$PORT" CHIRP_RATE_LIMITS=off RUST_LOG=warn \
  "/tmp/ab-$first-target/release/chirp" serve > /tmp/ab-prof-seed.log 2>&1 &
spid=$!
trap 'kill "$spid" 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do curl -fs "http://127.0.0.1:$PORT/livez" >/dev/null 2>&1 && break; sleep 0.1; done
mkdir -p .local/bench
python3 "$here/seed.py" "$PORT" /tmp/ab-prof-tokens.txt
for _ in $(seq 1 600); do
  [ "$(psql "$DATABASE_URL" -X -qtA -c 'select count(*) from jobs')" = 0 ] && break; sleep 0.2
done
kill "$spid"; wait "$spid" 2>/dev/null || true
awk 'NF { printf "GET\t/api/newsfeeds/\t%s\t\n", $1 }' /tmp/ab-prof-tokens.txt > .local/bench/ab-feed.tsv
# Logged-in readers of another user's tweets (a held head, the reader's likes read ahead).
psql "$DATABASE_URL" -X -qtA -c "select id from users where username like 'abuser%' order by id" \
  > /tmp/ab-prof-ids.txt
paste /tmp/ab-prof-tokens.txt <(tail -n +2 /tmp/ab-prof-ids.txt; head -n 1 /tmp/ab-prof-ids.txt) \
  | awk -F'\t' 'NF == 2 { printf "GET\t/api/tweets/?user_id=%s\t%s\t\n", $2, $1 }' \
  > .local/bench/ab-tweets.tsv
for _ in $(seq 1 200); do printf 'GET\t/livez\t\t\n'; done > .local/bench/ab-livez.tsv
for X in "$@"; do
  for row in ab-feed ab-tweets ab-livez; do
    # scripts/profile ends on `| head` (a SIGPIPE under pipefail): only its first line counts.
    out="$(CHIRP_BIN="/tmp/ab-$X-target/release/chirp" scripts/profile "$row.tsv" "${PROFILE_SECONDS:-10}" || true)"
    per="$(echo "$out" | sed -n 's/.* \([0-9]*\) per request$/\1/p')"
    echo "$(date -u +%FT%TZ) build $X $row: $per instructions per request"
  done
done
