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
