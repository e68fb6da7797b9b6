#!/usr/bin/env bash
# What muted accounts cost a warm newsfeed page (issue 40): instructions per request of one
# build, with callgrind (scripts/profile), alternating readers who mute nobody and readers who
# mute N accounts each, on the database bench/ab/profile.sh seeded (run it first).
#
#   bench/ab/mutes.sh X [ROUNDS] [N]     e.g. bench/ab/mutes.sh F 2 1000
#
# "N muted" gives each of the 200 seeded readers N mutes of N extra accounts made here (no
# tweets: the pages stay the same, so the figure is the cost of the hidden set itself: its
# lookup, its size in memory and Redis, and the filter), then drops every cached hidden set, so
# each reader's first page loads the new one. "0 muted" deletes them again.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
X="$1"; rounds="${2:-2}"; n="${3:-1000}"
export DATABASE_URL="postgres://postgres@127.0.0.1:5432/chirp_ab_prof" CHIRP_REDIS_PREFIX=abprof
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"
[ -s .local/bench/ab-feed.tsv ] || { echo "mutes: run bench/ab/profile.sh first" >&2; exit 1; }
sql() { psql "$DATABASE_URL" -X -q -v ON_ERROR_STOP=1 -c "$1"; }
drop_hidden() { redis-cli -u "$REDIS_URL" --scan --pattern "abprof:*:hidden" | xargs -r redis-cli -u "$REDIS_URL" unlink >/dev/null; }
sql "insert into users (username, email, password_hash, created_at)
     select 'muted' || g, 'muted' || g || '@example.com', '-', now() + g * interval '1 microsecond'
     from generate_series(1, $n) g on conflict do nothing"
for round in $(seq 1 "$rounds"); do
  for muted in 0 "$n"; do
    sql "delete from mutes"
    if [ "$muted" != 0 ]; then
      sql "insert into mutes (user_id, target_id, created_at)
           select r.id, m.id, now() + (r.id * $n + m.rn) * interval '1 microsecond'
           from users r
           cross join (select id, row_number() over (order by id) rn from users
                       where username like 'muted%' limit $muted) m
           where r.username not like 'muted%'"
    fi
    sql "update users set hidden_version = hidden_version + 1"
    drop_hidden
    out="$(CHIRP_BIN="/tmp/ab-$X-target/release/chirp" scripts/profile ab-feed.tsv "${PROFILE_SECONDS:-10}" || true)"
    per="$(echo "$out" | sed -n 's/.* \([0-9]*\) per request$/\1/p')"
    echo "$(date -u +%FT%TZ) build $X round $round, $muted muted: $per instructions per request"
  done
done
sql "delete from mutes"
drop_hidden
