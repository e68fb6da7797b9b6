-- A true transactional outbox: every write records the repairs of its cache updates in the same
-- transaction (one row per write, `repairs` a JSON array of {"op": "invalidate"|"tombstone"|
-- "set_if_newer"|"delete", "key": ..., ...}); the post-commit step deletes the row once Redis
-- confirmed, and the relay applies whatever rows remain (see src/cache/update.rs and outbox.rs).
create table cache_outbox_v2 (
    id         bigint generated always as identity primary key,
    repairs    jsonb       not null,
    created_at timestamptz not null default now()
);
-- Rows an earlier version left: lists are invalidated, objects deleted, as before.
insert into cache_outbox_v2 (repairs, created_at)
select jsonb_build_array(jsonb_build_object(
           'op', case when is_list then 'invalidate' else 'delete' end, 'key', key)),
       created_at
from cache_outbox order by id;
drop table cache_outbox;
alter table cache_outbox_v2 rename to cache_outbox;
alter index cache_outbox_v2_pkey rename to cache_outbox_pkey;

-- The epoch fence (src/cache/epoch.rs): per Redis key prefix, the epoch chirp last wrote to
-- `{prefix}:epoch` and the run_id of the Redis server it wrote it to.
create table cache_epoch (
    prefix       text   primary key,
    epoch        bigint not null,
    redis_run_id text   not null
);

-- The jobs table's kinds stay; unmerge and backfill now serialize per (follower, followee) with
-- an advisory lock (src/newsfeeds.rs), which needs no schema.

-- When a newsfeed row arrived (fan-out, backfill; written from chirp's clock, like created_at), so that a `created_at__gt` refresh also
-- returns rows that arrived after the client's newest item although their tweet is older (a
-- fan-out that finished late). Rows that existed before, and imported ones, have none: they are
-- not late for anyone. Only rows with an arrival time are indexed.
alter table newsfeeds add column arrived_at timestamptz;
alter table newsfeeds alter column arrived_at set default clock_timestamp();
create index newsfeeds_user_arrived_idx on newsfeeds (user_id, arrived_at) where arrived_at is not null;
