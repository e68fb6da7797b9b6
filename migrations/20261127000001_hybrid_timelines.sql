-- Hybrid timelines (Twitter's push/pull split; Silberstein et al., "Feeding Frenzy", SIGMOD
-- 2010): the tweets of an author with more than CHIRP_FANOUT_PULL_ABOVE followers are not
-- fanned out; each reader's newsfeed merges them in at read time (see src/hybrid.rs).

-- From when the author's tweets are pulled (null: pushed). A compose that finds the author
-- above the threshold sets it to 'infinity' (pending) and `has_pulled`; the author's next
-- compose, which started after that commit, sets it to its own time plus
-- CHIRP_FANOUT_PULL_SETTLE_MS, so every process has re-read the set of pulled authors since
-- `has_pulled` committed before a tweet is pulled. A compose that finds the author below
-- CHIRP_FANOUT_PULL_BELOW clears it (hysteresis).
alter table users add column pull_from timestamptz;
-- Whether the author ever had, or is about to have, pulled tweets: a newsfeed reads the pulled
-- tweets of the followees so marked. Never cleared (a pulled tweet stays pulled).
alter table users add column has_pulled boolean not null default false;
create index users_has_pulled_idx on users (id) where has_pulled;

-- A pulled tweet has no newsfeed rows but its author's own (and a follow's backfill's).
alter table tweets add column pulled boolean not null default false;
create index tweets_pulled_idx on tweets (user_id, created_at desc) where pulled;

-- The time from which the follower's newsfeed shows the followee's pulled tweets by pull;
-- older ones are copied by the follow's backfill, stamped above the newsfeed's head as in pure
-- fan-out. Null (friendships from before this migration): all of them.
alter table friendships add column visible_from timestamptz;

-- The newest pulled tweet's time (one row): the pull clock. Every writer of newsfeed entries
-- stamps them above it and, last before its commit, takes the advisory lock `pull-clock`
-- shared and checks that they still lie above it (else it retries) and below the database's
-- time; a pulled tweet is stamped under the lock held exclusively, above both. So whoever sees
-- an entry, pushed or pulled, sees every older one (docs/decisions/0004-hybrid-timelines.md).
create table pull_clock (
    id boolean     primary key default true check (id),
    at timestamptz not null default '-infinity'
);
insert into pull_clock default values;

-- The pull clock's two sides, one round trip each (a volatile function's statements each take
-- a fresh snapshot, so the read after the lock sees every pulled tweet committed before it).
-- An entry writer, last before its commit: takes the lock shared and reads the clock and the
-- database's time (its entries must lie above the one and below the other).
create function pull_clock_share(out at timestamptz, out clock timestamptz)
language plpgsql volatile as $$
begin
    perform pg_advisory_xact_lock_shared(hashtextextended('pull-clock', 0));
    select p.at, clock_timestamp() into at, clock from pull_clock p;
end $$;

-- A pulled compose: takes the lock exclusively and stamps its tweet above the newest pulled
-- tweet, the database's time and `floor` (the author's newest tweet plus 1 µs, or later).
create function pull_clock_stamp(floor timestamptz) returns timestamptz
language plpgsql volatile as $$
declare
    stamped timestamptz;
begin
    perform pg_advisory_xact_lock(hashtextextended('pull-clock', 0));
    update pull_clock
       set at = greatest(at + interval '1 microsecond',
                         date_trunc('microseconds', clock_timestamp()) + interval '1 microsecond',
                         floor)
    returning at into stamped;
    return stamped;
end $$;
