-- A user's likes, for loading the cached liked set (has_liked) and for the Postgres fallback of
-- has_liked, which asks `user_id = $1 and tweet_id = any($2)`.
create index tweet_likes_user_idx on tweet_likes (user_id, tweet_id);
