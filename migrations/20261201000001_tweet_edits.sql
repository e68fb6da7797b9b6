-- Issue 40: edits (src/tweets.rs `edit`). A tweet's row holds its current text; each edit
-- bumps `edit_version` (0: never edited; the cached tweet object's version, so a slow reader
-- can not put back an older text: src/cache/objects.rs) and keeps the text it replaces in
-- `tweet_edits`, so the history is those rows and then the tweet itself.
alter table tweets
    add column edited_at    timestamptz,
    add column edit_version bigint not null default 0;

create table tweet_edits (
    tweet_id   bigint      not null references tweets (id) on delete cascade,
    -- the version this text was (0: as posted)
    version    bigint      not null,
    content    text        not null,
    -- when this text was written (the tweet's created_at for version 0, else the edit's time)
    created_at timestamptz not null,
    primary key (tweet_id, version)
);
