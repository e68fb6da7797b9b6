-- Issue 41: replies and threads (src/replies.rs). A reply names the tweet it answers and that
-- tweet's author (Twitter v1.1's `in_reply_to_status_id` / `in_reply_to_user_id`, Mastodon's
-- `in_reply_to_id` / `in_reply_to_account_id`): plain columns, not foreign keys, so a reply
-- keeps them when the tweet it answers is deleted (as Twitter's does) and a delete never
-- locks the rows of the replies to it. `thread_id` is the thread's first tweet (its root),
-- set on replies only. `replies_count` counts direct replies; it moves with `counts_version`
-- like the other counts.
alter table tweets
    add column in_reply_to_tweet_id bigint,
    add column in_reply_to_user_id  bigint,
    add column thread_id            bigint,
    add column replies_count        bigint not null default 0;

-- A thread's replies, oldest first (its cached shape, the context view).
create index tweets_thread_idx on tweets (thread_id, created_at) where thread_id is not null;

-- One row per thread that has (or had) a reply, kept when its root is deleted: every change to
-- the thread's replies (one posted or deleted) locks it, after the author's row and before any
-- tweet row, and bumps `version`, the version of the thread's cached shape
-- (`{p}:{t<root>}:thread`, src/cache/threads.rs), written with SET_IF_NEWER like the counts,
-- so a reader that loaded an older shape can not put it back.
-- docs/decisions/0025-replies-and-threads.md.
create table threads (
    root_id bigint primary key,
    version bigint not null default 0
);
