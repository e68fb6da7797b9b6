//! Notifications (course parity, django-notifications' model): a like on your tweet or comment,
//! a comment on your tweet, a new follower, a retweet of your tweet and a mention
//! ([`crate::mentions`]) each notify you, never for your own actions.
//! They are inserted in the transaction of the write that causes them, so a like that commits
//! has its notification and one that rolls back has none; like, cancel, like again notifies
//! once (a unique index), as does follow, unfollow, follow again. Unread counts are counted in
//! Postgres from a partial index, so they are exact under any concurrency.

use serde::Serialize;
use sqlx::{PgConnection, PgPool};

use crate::cache::Cache;
use crate::db;
use crate::error::{ApiError, ApiResult};
use crate::pagination::{Page, PageRequest};
use crate::time::{self, Timestamp};
use crate::users::{self, User};

/// Why a user is notified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    LikedTweet,
    LikedComment,
    CommentedTweet,
    Followed,
    /// A retweet of the recipient's tweet ([`crate::retweets`]).
    RetweetedTweet,
    /// A tweet that mentions the recipient ([`crate::mentions`]).
    Mentioned,
}

impl Verb {
    /// The `verb` and `target_type` of the contract.
    fn texts(self) -> (&'static str, &'static str) {
        match self {
            Verb::LikedTweet => ("liked your tweet", "tweet"),
            Verb::LikedComment => ("liked your comment", "comment"),
            Verb::CommentedTweet => ("commented on your tweet", "tweet"),
            Verb::Followed => ("followed you", "user"),
            Verb::RetweetedTweet => ("retweeted your tweet", "tweet"),
            Verb::Mentioned => ("mentioned you", "tweet"),
        }
    }
}

/// The public `Notification` object.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Notification {
    pub id: i64,
    pub verb: String,
    pub actor: User,
    pub target_type: String,
    pub target_id: i64,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "time::serialize")]
    pub created_at: Timestamp,
    pub unread: bool,
}

#[derive(Debug, sqlx::FromRow)]
struct Row {
    id: i64,
    actor_id: i64,
    verb: String,
    target_type: String,
    target_id: i64,
    created_at: Timestamp,
    unread: bool,
}

/// Notifies `recipient` that `actor` did `verb` to `target` (a tweet, comment or user id),
/// inside the caller's transaction; nothing if they are the same user or if this like or
/// follow notified before. A timestamp that collides with another process's for the same
/// recipient is retried in a savepoint.
pub async fn notify(
    tx: &mut PgConnection,
    recipient: i64,
    actor: i64,
    verb: Verb,
    target: i64,
) -> sqlx::Result<()> {
    if recipient == actor {
        return Ok(());
    }
    let (text, target_type) = verb.texts();
    let sql = if verb == Verb::CommentedTweet {
        "insert into notifications (recipient_id, actor_id, verb, target_type, target_id, created_at)
         values ($1, $2, $3, $4, $5, $6)"
    } else {
        "insert into notifications (recipient_id, actor_id, verb, target_type, target_id, created_at)
         values ($1, $2, $3, $4, $5, $6)
         on conflict (recipient_id, actor_id, verb, target_id) where verb <> 'commented on your tweet'
         do nothing"
    };
    let mut tries = 0;
    loop {
        let mut savepoint = sqlx::Connection::begin(&mut *tx).await?;
        let inserted = sqlx::query(sql)
            .bind(recipient)
            .bind(actor)
            .bind(text)
            .bind(target_type)
            .bind(target)
            .bind(time::next_timestamp())
            .execute(&mut *savepoint)
            .await;
        match inserted {
            Err(e) if tries < 8 && db::violates(&e, "notifications_recipient_created_key") => {
                savepoint.rollback().await?;
                tries += 1;
            }
            Err(e) => return Err(e),
            Ok(_) => return savepoint.commit().await,
        }
    }
}

/// Deletes the notifications about a tweet that is being deleted, and about its comments (in
/// the delete's transaction, before the comments go).
pub async fn forget_tweet(tx: &mut PgConnection, id: i64) -> sqlx::Result<()> {
    sqlx::query(
        "delete from notifications
         where (target_type = 'tweet' and target_id = $1)
            or (target_type = 'comment' and target_id in (select id from comments where tweet_id = $1))",
    )
    .bind(id)
    .execute(tx)
    .await
    .map(|_| ())
}

/// Deletes the notifications about a comment that is being deleted (in its transaction).
pub async fn forget_comment(tx: &mut PgConnection, id: i64) -> sqlx::Result<()> {
    sqlx::query("delete from notifications where target_type = 'comment' and target_id = $1")
        .bind(id)
        .execute(tx)
        .await
        .map(|_| ())
}

/// A page of `me`'s notifications, newest first (only unread ones with `unread_only`), but
/// those caused by accounts `me` must not see ([`crate::blocks`]: read in the same query, so a
/// mute hides them from the moment it answers).
pub async fn list(
    db: &PgPool,
    cache: &Cache,
    me: i64,
    unread_only: bool,
    req: &PageRequest,
) -> sqlx::Result<Page<Notification>> {
    let rows: Vec<Row> = sqlx::query_as(concat!(
        "select id, actor_id, verb, target_type, target_id, created_at, unread from notifications
         where recipient_id = $1 and (unread or not $2)
           and created_at < coalesce($3, 'infinity') and created_at > coalesce($4, '-infinity')
           and actor_id not in (",
        crate::hidden_accounts_of!("$1"),
        ") order by created_at desc limit $5",
    ))
    .bind(me)
    .bind(unread_only)
    .bind(req.lt)
    .bind(req.gt)
    .bind(req.want() as i64)
    .fetch_all(db)
    .await?;
    Ok(Page::from_items(objects(db, cache, rows).await?, req))
}

async fn objects(db: &PgPool, cache: &Cache, rows: Vec<Row>) -> sqlx::Result<Vec<Notification>> {
    let actors: Vec<i64> = rows.iter().map(|r| r.actor_id).collect();
    let people = users::load_many(db, cache, &actors).await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            Some(Notification {
                actor: people.get(&r.actor_id)?.clone().into(),
                id: r.id,
                verb: r.verb,
                target_type: r.target_type,
                target_id: r.target_id,
                created_at: r.created_at,
                unread: r.unread,
            })
        })
        .collect())
}

/// How many of `me`'s notifications are unread.
pub async fn unread_count(db: &PgPool, me: i64) -> sqlx::Result<i64> {
    sqlx::query_scalar(concat!(
        "select count(*) from notifications where recipient_id = $1 and unread
           and actor_id not in (",
        crate::hidden_accounts_of!("$1"),
        ")",
    ))
    .bind(me)
    .fetch_one(db)
    .await
}

/// Marks every notification of `me` read; returns how many of those `me` may see (not by an
/// account `me` mutes or blocks or that blocks `me`) were unread: the unread count before.
pub async fn mark_all_read(db: &PgPool, me: i64) -> sqlx::Result<u64> {
    // Those of hidden accounts too (an unmute does not bring them back unread), but the count
    // is of those `me` could see, as the unread count was.
    let n: i64 = sqlx::query_scalar(concat!(
        "with marked as (
             update notifications set unread = false where recipient_id = $1 and unread
             returning actor_id)
         select count(*) from marked where actor_id not in (",
        crate::hidden_accounts_of!("$1"),
        ")",
    ))
    .bind(me)
    .fetch_one(db)
    .await?;
    Ok(n.max(0) as u64)
}

/// Sets notification `id` of `me` read or unread.
///
/// # Errors
/// 404 if there is no such notification of `me` (someone else's is not revealed), or it is by
/// an account hidden from `me` (as in the listing).
pub async fn set_unread(
    db: &PgPool,
    cache: &Cache,
    me: i64,
    id: i64,
    unread: bool,
) -> ApiResult<Notification> {
    let row: Option<Row> = sqlx::query_as(concat!(
        "update notifications set unread = $3 where id = $1 and recipient_id = $2
           and actor_id not in (",
        crate::hidden_accounts_of!("$2"),
        ") returning id, actor_id, verb, target_type, target_id, created_at, unread",
    ))
    .bind(id)
    .bind(me)
    .bind(unread)
    .fetch_optional(db)
    .await?;
    let row = row.ok_or(ApiError::NotFound)?;
    objects(db, cache, vec![row])
        .await?
        .pop()
        .ok_or(ApiError::NotFound)
}
