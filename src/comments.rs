//! Comments on tweets: create, edit, delete (each moving the tweet's exact `comments_count`) and
//! the paginated listing per tweet.

use serde::Serialize;
use sqlx::PgPool;

use anyhow::Context;

use crate::cache::Cache;
use crate::db;
use crate::error::{ApiError, ApiResult};
use crate::likes;
use crate::notifications::{self, Verb};
use crate::pagination::{Page, PageRequest};
use crate::time::{self, Timestamp};
use crate::tweets::TweetRow;
use crate::users::{self, User};

/// The public `Comment` object.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Comment {
    pub id: i64,
    pub tweet_id: i64,
    pub user: User,
    pub content: String,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "time::serialize")]
    pub created_at: Timestamp,
    pub likes_count: i64,
    pub has_liked: bool,
}

#[derive(Debug, Clone, sqlx::FromRow)]
struct CommentRow {
    id: i64,
    tweet_id: i64,
    user_id: i64,
    content: String,
    created_at: Timestamp,
    likes_count: i64,
}

/// Turns rows into `Comment`s: authors from the user cache, `has_liked` in one query.
async fn hydrate(
    db: &PgPool,
    read: &PgPool,
    cache: &Cache,
    rows: Vec<CommentRow>,
    viewer: Option<i64>,
) -> sqlx::Result<Vec<Comment>> {
    let author_ids: Vec<i64> = rows.iter().map(|r| r.user_id).collect();
    let comment_ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    let authors = users::load_many(db, cache, &author_ids).await?;
    let liked = likes::liked_comments(read, viewer, &comment_ids).await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            Some(Comment {
                id: r.id,
                tweet_id: r.tweet_id,
                user: authors.get(&r.user_id)?.clone().into(),
                has_liked: liked.contains(&r.id),
                content: r.content,
                created_at: r.created_at,
                likes_count: r.likes_count,
            })
        })
        .collect())
}

/// `author` comments on `tweet_id` (content already validated); a comment on a retweet is a
/// comment on its retweeted tweet.
///
/// # Errors
/// 400 naming `tweet_id` if the tweet does not exist.
pub async fn create(
    db: &PgPool,
    cache: &Cache,
    author: &User,
    tweet_id: i64,
    content: &str,
) -> ApiResult<Comment> {
    let created =
        db::with_unique_timestamp(&["comments_created_at_key"], |created_at| async move {
            let mut tx = db.begin().await?;
            // The lock the count update needs, taken first (the order of tweet deletes). A
            // comment on a retweet goes to the tweet it shows (crate::status_of).
            let found: Option<(i64, i64)> = sqlx::query_as(concat!(
                "select user_id, id from tweets where id = ",
                crate::status_of!("$1"),
                " for no key update"
            ))
            .bind(tweet_id)
            .fetch_optional(&mut *tx)
            .await?;
            let Some((tweet_author, tweet_id)) = found else {
                return Ok(Err(ApiError::field("tweet_id", "No such tweet.")));
            };
            // A block either way refuses (crate::blocks).
            if tweet_author != author.id
                && crate::blocks::blocked_either_way(&mut tx, tweet_author, author.id).await?
            {
                return Ok(Err(ApiError::Forbidden));
            }
            let row: CommentRow = sqlx::query_as(
            "insert into comments (tweet_id, user_id, content, created_at) values ($1, $2, $3, $4)
             returning id, tweet_id, user_id, content, created_at, likes_count",
        )
        .bind(tweet_id)
        .bind(author.id)
        .bind(content)
        .bind(created_at)
        .fetch_one(&mut *tx)
        .await?;
            let tweet = shift_comments(&mut tx, tweet_id, 1).await?;
            notifications::notify(
                &mut tx,
                tweet.record.user_id,
                author.id,
                Verb::CommentedTweet,
                tweet_id,
            )
            .await?;
            let staged = cache.stage(&mut tx, &tweet.counts_updates()).await?;
            tx.commit().await?;
            Ok(Ok((row, staged)))
        })
        .await
        .context("inserting the comment")?;
    let (row, staged) = created?;
    cache.finish(db, staged).await;
    Ok(Comment {
        id: row.id,
        tweet_id: row.tweet_id,
        user: author.clone(),
        content: row.content,
        created_at: row.created_at,
        likes_count: row.likes_count,
        has_liked: false,
    })
}

async fn shift_comments(
    tx: &mut sqlx::PgConnection,
    tweet_id: i64,
    by: i64,
) -> sqlx::Result<TweetRow> {
    sqlx::query_as(concat!(
        "update tweets set comments_count = comments_count + $2, counts_version = counts_version + 1 where id = $1",
        crate::returning_tweet_row!()
    ))
    .bind(tweet_id)
    .bind(by)
    .fetch_one(tx)
    .await
}

/// Checks that comment `id` exists and belongs to `me`, and locks its tweet, then the comment
/// (the order a tweet delete takes them in: tweet first, then its comments by cascade, so the
/// two can not deadlock); returns the comment's tweet id.
async fn owned(tx: &mut sqlx::PgConnection, me: i64, id: i64) -> ApiResult<i64> {
    let tweet: Option<i64> = sqlx::query_scalar("select tweet_id from comments where id = $1")
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(tweet_id) = tweet else {
        return Err(ApiError::NotFound);
    };
    sqlx::query("select 1 from tweets where id = $1 for no key update")
        .bind(tweet_id)
        .execute(&mut *tx)
        .await?;
    let row: Option<(i64, i64)> =
        sqlx::query_as("select user_id, tweet_id from comments where id = $1 for update")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
    match row {
        // Gone meanwhile (deleted, or with its tweet).
        None => Err(ApiError::NotFound),
        Some((owner, _)) if owner != me => Err(ApiError::Forbidden),
        Some((_, tweet_id)) => Ok(tweet_id),
    }
}

/// `me` edits comment `id` (content already validated).
///
/// # Errors
/// 404 if there is no such comment, 403 if it is not `me`'s.
pub async fn edit(
    db: &PgPool,
    cache: &Cache,
    me: &User,
    id: i64,
    content: &str,
) -> ApiResult<Comment> {
    let mut tx = db.begin().await?;
    owned(&mut tx, me.id, id).await?;
    let row: CommentRow = sqlx::query_as(
        "update comments set content = $2 where id = $1
         returning id, tweet_id, user_id, content, created_at, likes_count",
    )
    .bind(id)
    .bind(content)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    let mut hydrated = hydrate(db, db, cache, vec![row], Some(me.id)).await?;
    hydrated.pop().ok_or(ApiError::NotFound)
}

/// `me` deletes comment `id` (its likes go with it).
///
/// # Errors
/// 404 if there is no such comment, 403 if it is not `me`'s.
pub async fn delete(db: &PgPool, cache: &Cache, me: i64, id: i64) -> ApiResult<()> {
    let mut tx = db.begin().await?;
    let tweet_id = owned(&mut tx, me, id).await?;
    sqlx::query("delete from comments where id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    notifications::forget_comment(&mut tx, id).await?;
    let tweet = shift_comments(&mut tx, tweet_id, -1)
        .await
        .context("moving comments_count")?;
    let staged = cache.stage(&mut tx, &tweet.counts_updates()).await?;
    tx.commit().await.context("committing the comment delete")?;
    cache.finish(db, staged).await;
    Ok(())
}

/// A page of a tweet's comments, newest first.
///
/// # Errors
/// 404 if the tweet does not exist.
pub async fn list(
    db: &PgPool,
    read: &PgPool,
    cache: &Cache,
    tweet_id: i64,
    req: &PageRequest,
    viewer: Option<i64>,
) -> ApiResult<Page<Comment>> {
    let exists: bool = sqlx::query_scalar("select exists (select 1 from tweets where id = $1)")
        .bind(tweet_id)
        .fetch_one(read)
        .await?;
    if !exists {
        return Err(ApiError::NotFound);
    }
    Ok(Page::from_items(
        page(db, read, cache, tweet_id, req, viewer).await?,
        req,
    ))
}

/// Up to `req.want()` comments of a tweet, newest first (no existence check). The comments
/// and the viewer's likes of them are read from `read` (the replica when it may serve this
/// caller, see [`crate::replica`]); their authors from the cache or the primary `db`.
pub async fn page(
    db: &PgPool,
    read: &PgPool,
    cache: &Cache,
    tweet_id: i64,
    req: &PageRequest,
    viewer: Option<i64>,
) -> sqlx::Result<Vec<Comment>> {
    let rows: Vec<CommentRow> = sqlx::query_as(
        "select id, tweet_id, user_id, content, created_at, likes_count from comments
         where tweet_id = $1
           and created_at < coalesce($2, 'infinity') and created_at > coalesce($3, '-infinity')
         order by created_at desc limit $4",
    )
    .bind(tweet_id)
    .bind(req.lt)
    .bind(req.gt)
    .bind(req.want() as i64)
    .fetch_all(read)
    .await?;
    hydrate(db, read, cache, rows, viewer).await
}
