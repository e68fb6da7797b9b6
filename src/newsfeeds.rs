//! The SQL behind newsfeed listings (the rows are written by `tweets` and `jobs`).

use sqlx::PgPool;

use crate::cache::timeline::{FeedRow, ListEntry};
use crate::time::Timestamp;

/// The newest `limit` entries of user `user_id`'s newsfeed (for filling the cache).
pub async fn list_entries(db: &PgPool, user_id: i64, limit: usize) -> sqlx::Result<Vec<ListEntry>> {
    sqlx::query_as(
        "select n.id, n.tweet_id, t.user_id as author_id, n.created_at
         from newsfeeds n join tweets t on t.id = n.tweet_id
         where n.user_id = $1 order by n.created_at desc limit $2",
    )
    .bind(user_id)
    .bind(limit as i64)
    .fetch_all(db)
    .await
}

/// A page of user `user_id`'s newsfeed strictly between the cursors, hydrated in the same query.
pub async fn list_page(
    db: &PgPool,
    user_id: i64,
    lt: Option<Timestamp>,
    gt: Option<Timestamp>,
    limit: usize,
) -> sqlx::Result<Vec<FeedRow>> {
    sqlx::query_as(
        "select n.id as entry_id, n.created_at, t.id as tweet_id, t.content, t.likes_count, t.comments_count,
                u.id as author_id, u.username, u.nickname, u.avatar_url, u.version,
                u.created_at as author_created_at
         from newsfeeds n
         join tweets t on t.id = n.tweet_id
         join users u on u.id = t.user_id
         where n.user_id = $1
           and n.created_at < coalesce($2, 'infinity') and n.created_at > coalesce($3, '-infinity')
         order by n.created_at desc limit $4",
    )
    .bind(user_id)
    .bind(lt)
    .bind(gt)
    .bind(limit as i64)
    .fetch_all(db)
    .await
}

/// Fans out the tweets staged in `import_tweets` (the temporary table `chirp import` fills
/// inside its transaction, so call this on that transaction's connection): one newsfeed row
/// for every follower of each staged tweet's author, as `friendships` says, and one for the
/// author, at the tweet's `created_at`. Rows already there are left alone. Returns how many
/// rows were added.
pub async fn fill_from_friendships(conn: &mut sqlx::PgConnection) -> sqlx::Result<u64> {
    sqlx::query(
        "insert into newsfeeds (user_id, tweet_id, created_at)
         select f.from_user_id, t.id, t.created_at
         from import_tweets i join tweets t on t.id = i.id join friendships f on f.to_user_id = t.user_id
         union all
         select t.user_id, t.id, t.created_at from import_tweets i join tweets t on t.id = i.id
         on conflict do nothing",
    )
    .execute(conn)
    .await
    .map(|done| done.rows_affected())
}
