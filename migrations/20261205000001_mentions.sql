-- Issue 41: mentions (src/mentions.rs). `@username` in a tweet's text is resolved to user ids
-- when the tweet is posted (or edited), in the order of first use: a later rename or a new
-- account taking a freed name does not change whom a tweet mentions (Twitter's
-- `entities.user_mentions`, Mastodon's `mentions`). The public `mentions` are those users'
-- objects, hydrated at read time like the author, so a renamed user shows renamed.
-- An array on the tweet row: every read of a tweet needs it, and no query looks tweets up by
-- a mentioned user (a mentions timeline would add an index or a table).
alter table tweets add column mentioned_user_ids bigint[] not null default '{}';

-- The mentioned user is notified once per tweet (an edit that mentions them again does not
-- notify twice), unless they mute or block the author.
alter table notifications drop constraint notifications_verb_check;
alter table notifications add constraint notifications_verb_check
    check (verb in ('liked your tweet', 'liked your comment', 'commented on your tweet',
                    'followed you', 'retweeted your tweet', 'mentioned you'));
