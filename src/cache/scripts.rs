//! Lua scripts: each list or set operation runs atomically inside Redis, on one owner's keys
//! (one hash tag, so one Redis Cluster slot).
//!
//! A cached list is a sorted set ordered by `created_at` (as the home timelines of Redis in
//! Action ch. 8 and Mastodon's FeedManager are): a timeline scores whole seconds and orders one
//! second's entries by the sub-second prefix of their members ([`super::lists::pack_entry`]); a
//! chat backlog scores message ids. The member `#` with score `-inf` marks a
//! *complete* list: it holds every item, not only the newest window. It is always the lowest
//! rank, so a script (or the read path's `MULTI`, [`super::Cache::range`]) finds it (or the
//! floor) with `ZRANGE 0 0`, which is O(1) also on a listpack-encoded set, where `ZSCORE` would
//! scan the whole list. Trimming removes the lowest ranks first, so a list that grows past the
//! limit loses the marker before any real entry and stops claiming completeness. An incomplete list holds exactly the items not older than its
//! lowest entry (its *floor*); everything older is read from Postgres.
//!
//! **Generations.** Each list (and liked set) has a hash `{list}:gen` with two counters: `w`,
//! bumped by every write (but [`EXTEND`], which adds only below what the list held), and `r`,
//! bumped by every removal or invalidation. A loader creates the
//! hash with [`BEGIN_LOAD`] *before* its Postgres snapshot and [`FILL`] stores the load only if
//! neither counter moved, so a load never loses a concurrent write. A fan-out merge is guarded by
//! `r` alone (read under the followers lock): merges do not conflict with merges, only with an
//! unmerge or delete that may have removed what the merge would add. Writes bump the hash only
//! if the list or the hash exists (cached or being loaded): a fan-out to followers whose feed is
//! not cached creates no key.

use std::sync::LazyLock;

use redis::Script;

/// Lua helpers shared by the scripts that write generations. A generation hash is created with
/// both counters at the server's current time in µs (a nonce), never at 0, so a hash that was
/// evicted or expired and created again can not repeat values a loader or a merge guard saw
/// before (no ABA).
const GENERATIONS: &str = r#"
local function ensure_gen(gen)
  if redis.call('EXISTS', gen) == 0 then
    local t = redis.call('TIME')
    local nonce = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
    redis.call('HSET', gen, 'w', nonce, 'r', nonce)
  end
end
local function bump(gen, ttl, removal)
  ensure_gen(gen)
  if removal then redis.call('HINCRBY', gen, 'r', 1) end
  redis.call('HINCRBY', gen, 'w', 1)
  redis.call('EXPIRE', gen, ttl)
end
"#;

/// `each_chunk(cmd, key, from)`: `cmd key ARGV[from] …` over the rest of `ARGV`, 1,000 arguments
/// a call (Lua's `unpack` is limited by its stack).
const EACH_CHUNK: &str = r#"
local function each_chunk(cmd, key, from)
  local i = from
  while i <= #ARGV do
    local last = math.min(i + 999, #ARGV)
    redis.call(cmd, key, unpack(ARGV, i, last))
    i = last + 1
  end
end
"#;

/// `trim(list, limit, complete)`: removes a list's lowest entries beyond `limit` real entries
/// (the marker of a `complete` list, the lowest of all, goes first).
const TRIM: &str = r#"
local function trim(list, limit, complete)
  local n = redis.call('ZCARD', list)
  local real = n
  if complete then real = n - 1 end
  if real > tonumber(limit) then redis.call('ZREMRANGEBYRANK', list, 0, n - tonumber(limit) - 1) end
end
"#;

/// `BEGIN_LOAD gen | ttl` → `"w:r"`: creates the generation hash if missing (so writes from now
/// on bump it) and returns its counters, to hand to [`FILL`] / [`SET_FILL`] after the load.
pub static BEGIN_LOAD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r#"{GENERATIONS}
ensure_gen(KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[1])
local g = redis.call('HMGET', KEYS[1], 'w', 'r')
return g[1] .. ':' .. g[2]
"#
    ))
});

/// Shared by the fills: does the generation hash still hold `expected` (`"w:r"`)?
const SAME_GENERATION: &str = r#"
local function same_generation(gen, expected)
  local g = redis.call('HMGET', gen, 'w', 'r')
  if not g[1] or not g[2] then return false end
  return (g[1] .. ':' .. g[2]) == expected
end
"#;

/// `FILL list gen | expected ttl complete score member ...` → 1 if stored. Stores a freshly
/// loaded list only if it is still absent and nothing was written to it since [`BEGIN_LOAD`]
/// returned `expected`, so a load can never overwrite or miss a concurrent write, and concurrent
/// loads never leave duplicates.
pub static FILL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r#"{SAME_GENERATION}{EACH_CHUNK}
if not same_generation(KEYS[2], ARGV[1]) then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if ARGV[3] == '1' then redis.call('ZADD', KEYS[1], '-inf', '#') end
each_chunk('ZADD', KEYS[1], 4)
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"#
    ))
});

/// `EXTEND list gen | expected ttl limit floor_score floor_member complete score member ...` → 1
/// if stored: grows an incomplete cached timeline downwards with entries loaded from Postgres
/// below its lowest entry, the rest of its window after a page-sized first fill ([`FILL`];
/// the miss path of [`crate::timeline`]). Stored only if the list still exists with the lowest
/// entry `(floor_score, floor_member)` and nothing was written to it since [`BEGIN_LOAD`]
/// returned `expected`: the loaded entries are then exactly what lies below that entry, and
/// the list again holds every item at or above its (new) lowest entry. `complete` = 1 adds the
/// marker (nothing older exists); the list is trimmed to `limit` as a merge trims it. It adds
/// only below what the list showed, so it bumps no generation.
pub static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r#"{SAME_GENERATION}{EACH_CHUNK}{TRIM}
if not same_generation(KEYS[2], ARGV[1]) then return 0 end
local lowest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if lowest[1] ~= ARGV[5] or tonumber(lowest[2]) ~= tonumber(ARGV[4]) then return 0 end
if ARGV[6] == '1' then redis.call('ZADD', KEYS[1], '-inf', '#') end
each_chunk('ZADD', KEYS[1], 7)
trim(KEYS[1], ARGV[3], ARGV[6] == '1')
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"#
    ))
});

/// `above(a, b)`: whether member `a` sorts after member `b` in a sorted set of one score (by
/// their bytes, as Redis compares them; Lua's `<` on strings follows the server's locale).
const ABOVE: &str = r#"
local function above(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return #a > #b
end
"#;

/// `entry_time(score, member)`: a timeline entry's time in µs since the score epoch (score ×
/// 10⁶ + the member's sub-second prefix: [`super::lists::pack_entry`]); `list_newest(list,
/// gen)`: the time a cached list is known current at (its newest entry or removal mark).
const ENTRY_TIME: &str = r#"
local function entry_time(score, m)
  local sub = 0
  local b1 = string.byte(m, 1)
  if b1 >= 128 and #m >= 3 then
    sub = (b1 - 128) * 65536 + string.byte(m, 2) * 256 + string.byte(m, 3)
  end
  return tonumber(score) * 1000000 + sub
end

-- `list_newest(list, gen)`: the time (µs) a cached list is known current at: its newest entry
-- or its removal mark `h` ([`REMOVE`]), whichever is later; nil if it has neither.
local function list_newest(list, gen)
  local top = redis.call('ZRANGE', list, -1, -1, 'WITHSCORES')
  local newest = nil
  if top[1] and top[1] ~= '#' then newest = entry_time(top[2], top[1]) end
  local marked = tonumber(redis.call('HGET', gen, 'h') or '')
  if marked and (newest == nil or marked > newest) then newest = marked end
  return newest
end
"#;

/// `MERGE list gen | guard ttl limit after score member ...` → 1 if applied, 0 if the list was
/// dropped instead. Adds entries to a cached list (never creates one), skipping entries below
/// the floor of an incomplete list (its lowest entry, in the set's order: score, then member
/// bytes; a timeline scores whole seconds and its members start with the sub-second part, see
/// [`super::lists::pack_entry`]), trims it to `limit` and bumps `w`. `guard` is `*` (no guard)
/// or the removal generation `r` read when the merge was planned (`""` if there was none): if a
/// removal landed since, the list is dropped instead (the safe answer to a race with an unfollow
/// or a delete). `after` is `""` or the time of the entry the merged one follows in its
/// timeline (µs since the score epoch: score × 10⁶ + the member's sub-second prefix), its
/// *predecessor*: if the list's newest entry is older, the list lacks an entry whose own merge
/// has not landed yet (two writers' cache steps reached Redis out of order), and a reader that
/// saw this entry without that one would refresh past it: the list is dropped instead. The
/// list's newest is its newest entry or its removal mark `h` ([`REMOVE`]), whichever is later.
pub static MERGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r#"{GENERATIONS}{ABOVE}{ENTRY_TIME}{TRIM}
local ttl = ARGV[2]
local has_gen = redis.call('EXISTS', KEYS[2]) == 1
if ARGV[1] ~= '*' and (redis.call('HGET', KEYS[2], 'r') or '') ~= ARGV[1] then
  if redis.call('DEL', KEYS[1]) == 1 or has_gen then bump(KEYS[2], ttl, false) end
  return 0
end
if ARGV[4] ~= '' and redis.call('EXISTS', KEYS[1]) == 1 then
  local newest = list_newest(KEYS[1], KEYS[2])
  if newest == nil or newest < tonumber(ARGV[4]) then
    redis.call('DEL', KEYS[1])
    bump(KEYS[2], ttl, false)
    return 0
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  local lowest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  local complete = lowest[1] == '#'
  local floor, floor_member = nil, lowest[1]
  if not complete then floor = tonumber(lowest[2]) end
  for i = 5, #ARGV, 2 do
    local score = tonumber(ARGV[i])
    if complete or score > floor or (score == floor and above(ARGV[i + 1], floor_member)) then
      redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i + 1])
    end
  end
  trim(KEYS[1], ARGV[3], complete)
  redis.call('EXPIRE', KEYS[1], ttl)
  bump(KEYS[2], ttl, false)
elseif has_gen then
  bump(KEYS[2], ttl, false)
end
return 1
"#
    ))
});

/// `REMOVE list gen | ttl mark member ...`: removes entries and bumps `r` and `w` (if the list or
/// its generation exists). `mark` is `""` or the time (µs, as [`MERGE`]'s `after`) the removal
/// moved its newsfeed's head to ([`crate::newsfeeds::mark_removals`]): stored as the
/// generation's `h` (the newest time the list is known current at, entries or not), which
/// [`MERGE`]'s predecessor check takes as the list's newest. A list whose removal has not
/// landed (its writer stopped after the commit; the relay drops the list later) lacks that
/// mark, so a later merge drops it instead of adding an entry beside a removed one. A marked
/// removal has a predecessor too, the head 1 µs before its mark: a list older than that (an
/// earlier removal or merge has not landed) is dropped rather than marked current.
pub static REMOVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r#"{GENERATIONS}{EACH_CHUNK}{ENTRY_TIME}
local cached = redis.call('EXISTS', KEYS[1]) == 1
if cached and ARGV[2] ~= '' then
  local newest = list_newest(KEYS[1], KEYS[2])
  if newest == nil or newest < tonumber(ARGV[2]) - 1 then
    redis.call('DEL', KEYS[1])
    bump(KEYS[2], ARGV[1], true)
    return 1
  end
end
if cached then each_chunk('ZREM', KEYS[1], 3) end
if cached or redis.call('EXISTS', KEYS[2]) == 1 then
  bump(KEYS[2], ARGV[1], true)
  if ARGV[2] ~= '' and tonumber(redis.call('HGET', KEYS[2], 'h') or '0') < tonumber(ARGV[2]) then
    redis.call('HSET', KEYS[2], 'h', ARGV[2])
  end
end
return 1
"#
    ))
});

/// `INVALIDATE list gen | ttl`: drops a list or set and bumps `r` and `w` (if either existed).
pub static INVALIDATE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r#"{GENERATIONS}
if redis.call('DEL', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then
  bump(KEYS[2], ARGV[1], true)
end
return 1
"#
    ))
});

/// `SET_IF_NEWER key | version value ttl`: stores a versioned object (`"{version}|..."`) unless
/// the cached one is as new or newer, so a slow reader can not put back an old profile or count.
/// A cached *floor* `"{version}|"` (no payload; readers take it for a miss, see
/// [`super::update::Repair::SetIfNewer`]) refuses only older versions; a tombstone `-` (a
/// deleted tweet's object) refuses every version.
pub static SET_IF_NEWER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r#"{SET_VERSIONED}
return set_versioned(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
"#
    ))
});

/// `SET_IF_NEWER_EACH key... | ttl version value ...` → how many were stored: [`SET_IF_NEWER`]
/// of each key with its `version` and `value`, in one call (a cold page stores a few dozen
/// objects; one script call each was most of the Redis time of a cold page). On a cluster its
/// keys must share a slot: the caller groups them ([`super::Cache::pipe_put_versioned_many`]).
pub static SET_IF_NEWER_EACH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r#"{SET_VERSIONED}
local n = 0
for i = 1, #KEYS do
  n = n + set_versioned(KEYS[i], ARGV[2 * i], ARGV[2 * i + 1], ARGV[1])
end
return n
"#
    ))
});

/// `set_versioned(key, version, value, ttl)` → 1 if stored: the rule of [`SET_IF_NEWER`]. A
/// tombstone `-` (a deleted tweet) is final.
const SET_VERSIONED: &str = r#"
local function set_versioned(key, version, value, ttl)
  local cur = redis.call('GET', key)
  if cur == '-' then return 0 end
  if cur then
    local v, rest = string.match(cur, '^(%d+)|(.*)$')
    v = tonumber(v)
    local new = tonumber(version)
    if v and (v > new or (v == new and rest ~= '')) then return 0 end
  end
  redis.call('SET', key, value, 'EX', ttl)
  return 1
end
"#;

/// `SET_FILL set gen | expected ttl member ...`: stores a set loaded from Postgres (with the
/// integer marker `-1`, so an empty set exists too and the set stays an intset) unless it exists
/// or was written since [`BEGIN_LOAD`] returned `expected`.
pub static SET_FILL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r#"{SAME_GENERATION}{EACH_CHUNK}
if not same_generation(KEYS[2], ARGV[1]) then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SADD', KEYS[1], '-1')
each_chunk('SADD', KEYS[1], 3)
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"#
    ))
});

/// `SET_ADD set gen | ttl member`: adds to a cached set (never creating one) and bumps `w` if
/// the set or its generation exists. (A removal invalidates the set instead: an add and a
/// removal that reach Redis out of order then can not leave a wrong member.)
pub static SET_ADD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r#"{GENERATIONS}
local cached = redis.call('EXISTS', KEYS[1]) == 1
if cached then redis.call('SADD', KEYS[1], ARGV[2]) end
if cached or redis.call('EXISTS', KEYS[2]) == 1 then bump(KEYS[2], ARGV[1], false) end
return 1
"#
    ))
});

/// `RANK_RANGE rank | count` → nil if the rank is not cached, else
/// `[member, score, ...]`: the `count` highest scores, ties in reverse member order (members
/// start with the tweet's `created_at`, so ties list the newest first). A rank is a sorted set
/// with the marker `#` at `-inf`, so a day without tweets is cached too.
pub static RANK_RANGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local items = redis.call('ZRANGE', KEYS[1], '+inf', '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, tonumber(ARGV[1]) + 1, 'WITHSCORES')
local out = {}
for i = 1, #items, 2 do
  if items[i] ~= '#' and #out < 2 * tonumber(ARGV[1]) then
    out[#out + 1] = items[i]
    out[#out + 1] = items[i + 1]
  end
end
return out
"#,
    )
});

/// `RANK_SET rank gen ver | ttl member score version`: the versioned write-through of one
/// tweet's score (likes + comments committed with `counts_version` = `version`) into a cached
/// rank: stored only if newer than the version the rank holds for that member (a write-through
/// that reaches Redis late can not put back an older score), never creating a rank (no blind
/// increment of a missing key: a missing rank is rebuilt from Postgres). Bumps `w` if the rank
/// or its generation exists, so a rebuild in flight is refused.
pub static RANK_SET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r#"{GENERATIONS}
local cached = redis.call('EXISTS', KEYS[1]) == 1
if cached then
  local v = tonumber(redis.call('HGET', KEYS[3], ARGV[2]) or '-1')
  if tonumber(ARGV[4]) > v then
    redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
    redis.call('HSET', KEYS[3], ARGV[2], ARGV[4])
    redis.call('EXPIRE', KEYS[3], ARGV[1])
  end
end
if cached or redis.call('EXISTS', KEYS[2]) == 1 then bump(KEYS[2], ARGV[1], false) end
return 1
"#
    ))
});

/// `RANK_FILL rank gen ver | expected ttl score member version ...` → 1 if stored: a rank
/// rebuilt from Postgres, stored with its versions only if it is still absent and nothing was
/// written to it since [`BEGIN_LOAD`] returned `expected`.
pub static RANK_FILL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r#"{SAME_GENERATION}
if not same_generation(KEYS[2], ARGV[1]) then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[3])
redis.call('ZADD', KEYS[1], '-inf', '#')
for i = 3, #ARGV, 3 do
  redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i + 1])
  redis.call('HSET', KEYS[3], ARGV[i + 1], ARGV[i + 2])
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
redis.call('EXPIRE', KEYS[3], ARGV[2])
return 1
"#
    ))
});

/// `GCRA key | n (field interval_us period_us)*n` → `[allowed 1|0, index of the rate nearest
/// exhaustion, its remaining, its reset µs, retry-after µs]`. A request is allowed only if
/// every rate allows it, and only then are the TATs stored. A rate of `count` per `period` has
/// the emission interval `period / count` and lets `count` requests through at once.
pub static GCRA: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n = tonumber(ARGV[1])
local ok = true
local new = {}
local best, best_rem, best_reset = 0, nil, 0
local retry, maxp = 0, 0
for i = 0, n - 1 do
  local field = ARGV[2 + i * 3]
  local interval = tonumber(ARGV[3 + i * 3])
  local period = tonumber(ARGV[4 + i * 3])
  if period > maxp then maxp = period end
  local tat = tonumber(redis.call('HGET', KEYS[1], field) or '0')
  if tat < now then tat = now end
  local nt = tat + interval
  local rem, reset
  if nt - now > period then
    ok = false
    if nt - period - now > retry then retry = nt - period - now end
    rem, reset = 0, tat - now
  else
    new[field] = nt
    rem, reset = math.floor((period - (nt - now)) / interval), nt - now
  end
  if best_rem == nil or rem < best_rem then best, best_rem, best_reset = i, rem, reset end
end
if ok then
  for field, nt in pairs(new) do redis.call('HSET', KEYS[1], field, string.format('%.0f', nt)) end
  redis.call('PEXPIRE', KEYS[1], math.ceil(maxp / 1000))
end
return {ok and 1 or 0, best, best_rem, best_reset, retry}
"#,
    )
});

/// Every script, for `SCRIPT LOAD` after Redis lost its script cache (restart, `SCRIPT FLUSH`).
pub fn all() -> [&'static Script; 17] {
    [
        &BEGIN_LOAD,
        &FILL,
        &EXTEND,
        &MERGE,
        &REMOVE,
        &INVALIDATE,
        &SET_IF_NEWER,
        &SET_IF_NEWER_EACH,
        &SET_FILL,
        &SET_ADD,
        &RANK_RANGE,
        &RANK_SET,
        &RANK_FILL,
        &GCRA,
        &STREAM_LEASE,
        &HEARTBEAT,
        &PUBLISH_EVICTION,
    ]
}

/// The scripts whose second run is not their first one's result again: the rate limiter
/// charges twice, a heartbeat and an eviction publish twice. A command of theirs whose outcome
/// is unknown (its connection broke, or a cluster node answered its pipeline with a redirect)
/// is never sent again ([`super::conn`]); every other script is safe to run twice (versioned
/// writes, generation-guarded fills; a second generation bump costs a refused fill at most).
pub fn once_only() -> [&'static Script; 3] {
    [&GCRA, &HEARTBEAT, &PUBLISH_EVICTION]
}

/// Lua: `now`, Redis's clock in ms, for the scripts that score entries by expiry (stream
/// leases, the lease registries).
const NOW_MS: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"#;

/// `STREAM_LEASE streams | stream_id limit lease_ms renew` → 1 if the stream holds a lease, 0 if
/// the owner has `limit` live leases already. The sorted set holds stream ids scored by lease
/// expiry (ms, Redis's clock); expired ones are dropped first. `renew` = 1 extends a lease
/// whatever the count (a stream that holds one keeps it).
pub static STREAM_LEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r#"{NOW_MS}
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local lease = tonumber(ARGV[3])
if ARGV[4] ~= '1' and not redis.call('ZSCORE', KEYS[1], ARGV[1])
   and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease)
return 1
"#
    ))
});

/// `HEARTBEAT live… | id ahead_ms channel payload n` → Redis's time in ms: registers process
/// `id` in the first `n` keys, each a registry `live` (a sorted set of process ids scored by
/// expiry, ms of Redis's clock; with none, one other key of the `{bus}` slot routes the script)
/// until `ahead_ms` from now, drops registrations expired a minute ago, then publishes
/// `payload` on `channel` (the heartbeat: [`super::lease`]). The registration comes first, so a
/// process that hears the heartbeat is registered for at least as long as the lease it gains.
/// Registries get no TTL: a `volatile-*` eviction policy can not remove them.
pub static HEARTBEAT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r#"{NOW_MS}
for i = 1, tonumber(ARGV[5]) do
  redis.call('ZADD', KEYS[i], now + tonumber(ARGV[2]), ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - 60000)
end
redis.call('PUBLISH', ARGV[3], ARGV[4])
return now
"#
    ))
});

/// `PUBLISH_EVICTION live | channel payload` → `{receivers, now_ms, {id, expiry_ms, …}}`:
/// publishes an eviction and reads, at the same instant, every registration in `live` that has
/// not expired (the processes that may hold a lease: [`super::lease`]); `receivers` is what
/// `PUBLISH` counted (on a cluster, the subscribers of this node only).
pub static PUBLISH_EVICTION: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r#"{NOW_MS}
local receivers = redis.call('PUBLISH', ARGV[1], ARGV[2])
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
return {{receivers, now, live}}
"#
    ))
});
