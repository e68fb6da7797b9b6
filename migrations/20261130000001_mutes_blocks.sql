-- Issue 40: mutes and blocks (src/blocks.rs). Timelines are filtered at read time by each
-- viewer's hidden set (src/cache/hidden.rs), versioned by users.hidden_version: bumped, with
-- the user's row locked, in the transaction of every mute or block that changes the set.
create table mutes (
    user_id    bigint      not null references users (id) on delete cascade,
    target_id  bigint      not null references users (id) on delete cascade,
    created_at timestamptz not null,
    primary key (user_id, target_id),
    check (user_id <> target_id),
    -- one user's listing never ties (the endless pagination's cursor)
    constraint mutes_user_created_key unique (user_id, created_at)
);

create table blocks (
    user_id    bigint      not null references users (id) on delete cascade,
    target_id  bigint      not null references users (id) on delete cascade,
    created_at timestamptz not null,
    primary key (user_id, target_id),
    check (user_id <> target_id),
    constraint blocks_user_created_key unique (user_id, created_at)
);
-- who blocks a user: part of that user's hidden set
create index blocks_target on blocks (target_id);

alter table users add column hidden_version bigint not null default 0;
