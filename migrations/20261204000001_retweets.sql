-- Issue 41: retweets (src/retweets.rs). A retweet is a tweet row of the retweeter that names
-- the retweeted tweet (Twitter v1.1's `retweeted_status`, Mastodon's `reblog`): empty text,
-- never pulled, at most one per user and tweet. A retweet of a retweet names the original.
-- Not a foreign key (as the reply ids): the original's delete deletes its retweets through
-- the normal delete path, which also moves each retweeter's count and cached lists.
-- `retweets_count` counts live retweets; it moves with `counts_version` like the other counts.
alter table tweets
    add column retweeted_tweet_id bigint,
    add column retweets_count     bigint not null default 0;

-- One retweet per user and tweet; also "which of these did the viewer retweet" (has_retweeted).
create unique index tweets_retweeter_idx on tweets (user_id, retweeted_tweet_id)
    where retweeted_tweet_id is not null;
-- Every retweet of a tweet (its delete, the next candidate after an unretweet).
create index tweets_retweeted_idx on tweets (retweeted_tweet_id, created_at)
    where retweeted_tweet_id is not null;

-- The status a newsfeed row shows: the retweeted tweet for a retweet's row, null (the row's
-- own tweet) otherwise. A status appears at most once in a reader's newsfeed, however many
-- of the reader's followings retweet it: the first entry that reached the newsfeed stays
-- (docs/decisions/0026-retweets.md). The unique index is the rule's last line of defence and
-- the lookup every writer makes under the reader's head lock.
alter table newsfeeds add column status_id bigint;
create unique index newsfeeds_status_idx on newsfeeds (user_id, (coalesce(status_id, tweet_id)));

-- A retweet notifies the retweeted tweet's author once (retweet, undo, retweet again: once,
-- as a like).
alter table notifications drop constraint notifications_verb_check;
alter table notifications add constraint notifications_verb_check
    check (verb in ('liked your tweet', 'liked your comment', 'commented on your tweet',
                    'followed you', 'retweeted your tweet'));
