-- Exact refresh (docs/API.md "Refresh and resume are exact"): a newsfeed entry's `created_at`
-- is its place in the reader's newsfeed, not always its tweet's time. Every entry that arrives
-- in a newsfeed takes a time above every entry that newsfeed ever showed: its tweet's
-- `created_at` when that is newer (nearly always), else just above the newsfeed's head (a
-- follow's backfill, a fan-out that landed behind a newer tweet). Writers of one newsfeed take
-- its head row's lock to stamp their entries, so entries become visible in the order of their
-- times and a `created_at__gt` refresh from the newest entry a client holds returns exactly
-- what it has not seen.
create table feed_heads (
    user_id bigint      primary key references users (id) on delete cascade,
    head    timestamptz not null, -- the newest entry time this newsfeed ever had
    prev    timestamptz           -- scratch: the head before a write (its cache merge's predecessor)
) with (fillfactor = 50);         -- every fan-out rewrites its followers' rows: room for HOT updates
insert into feed_heads (user_id, head)
select user_id, max(created_at) from newsfeeds group by user_id;

comment on column newsfeeds.created_at is
    'the entry''s time in its reader''s newsfeed: its tweet''s created_at, or later if it arrived behind newer entries (see feed_heads)';
