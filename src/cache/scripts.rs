//! Lua scripts: each list operation runs atomically inside Redis.
//!
//! A cached list is a sorted set scored by `created_at` in microseconds (as the home timelines of
//! Redis in Action ch. 8 and Mastodon's FeedManager are). The member `#` with score `-inf` marks a
//! *complete* list: it holds every item, not only the newest window. Trimming removes the lowest
//! ranks first, so a list that grows past the limit loses the marker before any real entry and
//! stops claiming completeness. An incomplete list holds exactly the items not older than its
//! lowest entry (its *floor*); everything older is read from Postgres.

use std::sync::LazyLock;

use redis::Script;

/// `RANGE list max min count` → nil if the list is not cached, else
/// `[complete "1"|"0", floor score or "", member, score, member, score, ...]` with the newest
/// `count` entries strictly between `min` and `max` (`+inf` / `-inf` for no bound).
pub static RANGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local out = {'0', ''}
if redis.call('ZSCORE', KEYS[1], '#') then
  out[1] = '1'
else
  out[2] = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
end
local max = ARGV[1] == '+inf' and '+inf' or '(' .. ARGV[1]
local min = ARGV[2] == '-inf' and '-inf' or '(' .. ARGV[2]
local count = tonumber(ARGV[3])
local items = redis.call('ZRANGE', KEYS[1], max, min, 'BYSCORE', 'REV', 'LIMIT', 0, count + 1, 'WITHSCORES')
local n = 0
for i = 1, #items, 2 do
  if items[i] ~= '#' and n < count then
    out[#out + 1] = items[i]
    out[#out + 1] = items[i + 1]
    n = n + 1
  end
end
return out
"#,
    )
});

/// `FILL list gen | expected_gen ttl complete score member ...` → 1 if stored. Stores a freshly
/// loaded list only if it is still absent and nobody wrote to it since `expected_gen` was read
/// (before the Postgres load), so a load can never overwrite or miss a concurrent write, and
/// concurrent loads never leave duplicates.
pub static FILL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if (redis.call('GET', KEYS[2]) or '') ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if ARGV[3] == '1' then redis.call('ZADD', KEYS[1], '-inf', '#') end
local i = 4
while i <= #ARGV do
  local last = math.min(i + 999, #ARGV)
  redis.call('ZADD', KEYS[1], unpack(ARGV, i, last))
  i = last + 1
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"#,
    )
});

/// `MERGE list gen | expected_gen|'*' ttl limit score member ...`: adds entries to a cached list
/// (never creates one), skipping entries below the floor of an incomplete list, then trims to
/// `limit` and bumps the generation. With an expected generation other than `*`, a list written
/// since then is invalidated instead (the safe answer to a race with an unfollow or delete).
pub static MERGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local ttl = ARGV[2]
if ARGV[1] ~= '*' and (redis.call('GET', KEYS[2]) or '') ~= ARGV[1] then
  redis.call('DEL', KEYS[1])
elseif redis.call('EXISTS', KEYS[1]) == 1 then
  local complete = redis.call('ZSCORE', KEYS[1], '#')
  local floor = nil
  if not complete then floor = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]) end
  for i = 4, #ARGV, 2 do
    if complete or tonumber(ARGV[i]) > floor then
      redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i + 1])
    end
  end
  local n = redis.call('ZCARD', KEYS[1])
  local real = n
  if complete then real = n - 1 end
  local limit = tonumber(ARGV[3])
  if real > limit then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - limit - 1) end
  redis.call('EXPIRE', KEYS[1], ttl)
end
redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ttl)
return 1
"#,
    )
});

/// `REMOVE list gen | ttl member ...`: removes entries and bumps the generation.
pub static REMOVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local i = 2
while i <= #ARGV do
  local last = math.min(i + 999, #ARGV)
  redis.call('ZREM', KEYS[1], unpack(ARGV, i, last))
  i = last + 1
end
redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[1])
return 1
"#,
    )
});

/// `INVALIDATE list gen | ttl`: drops a list and bumps its generation.
pub static INVALIDATE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
redis.call('DEL', KEYS[1])
redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[1])
return 1
"#,
    )
});

/// `SET_IF_NEWER key | version value ttl`: stores a versioned object (`"{version}|..."`) unless
/// the cached one is as new or newer, so a slow reader can not put back an old profile.
pub static SET_IF_NEWER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local cur = redis.call('GET', KEYS[1])
if cur then
  local v = tonumber(string.match(cur, '^(%d+)|'))
  if v and v >= tonumber(ARGV[1]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
return 1
"#,
    )
});

/// `SET_FILL set gen | expected_gen ttl member ...`: stores a set loaded from Postgres (with the
/// member `#`, so an empty set exists too) unless it exists or was written since `expected_gen`.
pub static SET_FILL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if (redis.call('GET', KEYS[2]) or '') ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SADD', KEYS[1], '#')
local i = 3
while i <= #ARGV do
  local last = math.min(i + 999, #ARGV)
  redis.call('SADD', KEYS[1], unpack(ARGV, i, last))
  i = last + 1
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"#,
    )
});

/// `SET_CHANGE set gen | add|rem ttl member`: adds to or removes from a cached set (never
/// creating one) and bumps its generation.
pub static SET_CHANGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('EXISTS', KEYS[1]) == 1 then
  if ARGV[1] == 'add' then redis.call('SADD', KEYS[1], ARGV[3]) else redis.call('SREM', KEYS[1], ARGV[3]) end
end
redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"#,
    )
});

/// Every script, for `SCRIPT LOAD` after Redis lost its script cache (restart, `SCRIPT FLUSH`).
pub fn all() -> [&'static Script; 8] {
    [
        &RANGE,
        &FILL,
        &MERGE,
        &REMOVE,
        &INVALIDATE,
        &SET_IF_NEWER,
        &SET_FILL,
        &SET_CHANGE,
    ]
}
