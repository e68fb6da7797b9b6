-- Issue 41: hashtags (src/hashtags.rs). A tweet's hashtags are a function of its text
-- (`hashtags::parse`); these tables index them for the hashtag timelines and the trends.
--
-- `hashtags` holds one row per tag ever used (lowercase), never deleted: its id names the
-- tag's cached timeline (`{p}:{h9}:items`), and a post locks the rows of its tags while it
-- takes its time, so one tag's tweets commit in the order of their times (exact refresh, as a
-- circle's: docs/decisions/0024-hashtag-timelines-and-trends.md).
create table hashtags (
    id   bigserial primary key,
    name text not null unique
);

-- One row per (tag, tweet): the tag's timeline and the trends' window counts. `user_id` and
-- `created_at` are the tweet's (copied, so the trends read this table alone).
create table tweet_hashtags (
    hashtag_id bigint      not null references hashtags (id),
    tweet_id   bigint      not null references tweets (id) on delete cascade,
    user_id    bigint      not null,
    created_at timestamptz not null,
    primary key (hashtag_id, created_at, tweet_id)
);
create index tweet_hashtags_tweet_idx on tweet_hashtags (tweet_id);
-- The trends: every row of a window, by time, with what the counts need.
create index tweet_hashtags_created_idx on tweet_hashtags (created_at) include (hashtag_id, user_id);
