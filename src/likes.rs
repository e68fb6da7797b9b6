//! Likes on tweets and comments, with exact counters.
//!
//! A like is a row in `tweet_likes` / `comment_likes` (primary key: object, user), so liking twice
//! is a no-op. The object's `likes_count` moves in the same transaction, and only when a row was
//! actually inserted or deleted; the tweet's new counts are then written through to Redis
//! (see `cache::counts`). Comments are read from Postgres, which carries their count.

use std::collections::HashSet;

use serde::Serialize;
use sqlx::PgPool;

use anyhow::Context;

use crate::cache::liked::LikedAmong;
use crate::cache::{Cache, Update};
use crate::error::{ApiError, ApiResult};
use crate::notifications::{self, Verb};
use crate::time::{self, Timestamp};
use crate::tweets::TweetRow;
use crate::users::{self, User};

/// What is liked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Tweet(i64),
    Comment(i64),
}

impl Target {
    /// From the API's `content_type` (`tweet` or `comment`, any case) and `object_id`.
    ///
    /// # Errors
    /// 400 naming `content_type` for another value.
    pub fn parse(content_type: &str, object_id: i64) -> ApiResult<Self> {
        match content_type.trim().to_ascii_lowercase().as_str() {
            "tweet" => Ok(Target::Tweet(object_id)),
            "comment" => Ok(Target::Comment(object_id)),
            _ => Err(ApiError::field(
                "content_type",
                "Must be \"tweet\" or \"comment\".",
            )),
        }
    }
}

/// The public like object: `{"user": User, "created_at"}`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Like {
    pub user: User,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "time::serialize")]
    pub created_at: Timestamp,
}

fn no_such_object() -> ApiError {
    ApiError::field("object_id", "No such object.")
}

/// Locks the liked object against deletion for the transaction, with the lock its counter
/// update needs anyway (taken first, so a concurrent delete of it can not deadlock with us);
/// returns its owner and the object, `None` if it does not exist. A retweet stands for its
/// retweeted tweet (Twitter's and Mastodon's rule: a like of a retweet likes the tweet it
/// shows; [`crate::status_of`]).
async fn lock_object(
    tx: &mut sqlx::PgConnection,
    target: Target,
) -> sqlx::Result<Option<(i64, Target)>> {
    match target {
        Target::Tweet(id) => {
            let sql = concat!(
                "select user_id, id from tweets where id = ",
                crate::status_of!("$1"),
                " for no key update"
            );
            let found: Option<(i64, i64)> = sqlx::query_as(sql).bind(id).fetch_optional(tx).await?;
            Ok(found.map(|(owner, id)| (owner, Target::Tweet(id))))
        }
        Target::Comment(id) => sqlx::query_scalar::<_, i64>(
            "select user_id from comments where id = $1 for no key update",
        )
        .bind(id)
        .fetch_optional(tx)
        .await
        .map(|owner| owner.map(|o| (o, target))),
    }
}

/// Moves the object's `likes_count` by `by`; for a tweet, returns the cache updates.
async fn shift_likes(
    tx: &mut sqlx::PgConnection,
    target: Target,
    by: i64,
) -> sqlx::Result<Vec<Update>> {
    match target {
        Target::Tweet(id) => {
            let row: TweetRow = sqlx::query_as(concat!(
                "update tweets set likes_count = likes_count + $2, counts_version = counts_version + 1 where id = $1",
                crate::returning_tweet_row!()
            ))
            .bind(id)
            .bind(by)
            .fetch_one(tx)
            .await?;
            Ok(row.counts_updates())
        }
        Target::Comment(id) => {
            sqlx::query("update comments set likes_count = likes_count + $2 where id = $1")
                .bind(id)
                .bind(by)
                .execute(tx)
                .await?;
            Ok(Vec::new())
        }
    }
}

/// `user` likes `target`; liking again changes nothing and answers the first like. A like
/// racing the same user's cancel answers whichever state it finds, never an error.
///
/// # Errors
/// 400 naming `object_id` if the object does not exist.
#[tracing::instrument(name = "likes::like", skip(db, cache, user), fields(user = user.id))]
pub async fn like(db: &PgPool, cache: &Cache, user: &User, target: Target) -> ApiResult<Like> {
    let mut tx = db.begin().await?;
    let (owner, target) = lock_object(&mut tx, target)
        .await?
        .ok_or_else(no_such_object)?;
    // A block either way refuses (crate::blocks): this statement sees every block committed
    // before it (read committed); one committed after it leaves this like, as any like made
    // before a block.
    if owner != user.id && crate::blocks::blocked_either_way(&mut tx, owner, user.id).await? {
        return Err(ApiError::Forbidden);
    }
    let (insert, existing) = match target {
        Target::Tweet(_) => (
            "insert into tweet_likes (tweet_id, user_id, created_at) values ($1, $2, $3)
             on conflict do nothing returning created_at",
            "select created_at from tweet_likes where tweet_id = $1 and user_id = $2",
        ),
        Target::Comment(_) => (
            "insert into comment_likes (comment_id, user_id, created_at) values ($1, $2, $3)
             on conflict do nothing returning created_at",
            "select created_at from comment_likes where comment_id = $1 and user_id = $2",
        ),
    };
    let (Target::Tweet(id) | Target::Comment(id)) = target;
    // `on conflict do nothing` sees a conflicting row that a concurrent cancel may delete
    // before our read of it: then insert again (the object lock makes a third round unlikely).
    let mut found = None;
    for _ in 0..3 {
        let inserted: Option<Timestamp> = sqlx::query_scalar(insert)
            .bind(id)
            .bind(user.id)
            .bind(time::next_timestamp())
            .fetch_optional(&mut *tx)
            .await
            .context("inserting the like")?;
        if let Some(at) = inserted {
            found = Some((at, true));
            break;
        }
        let existing: Option<Timestamp> = sqlx::query_scalar(existing)
            .bind(id)
            .bind(user.id)
            .fetch_optional(&mut *tx)
            .await?;
        if let Some(at) = existing {
            found = Some((at, false));
            break;
        }
    }
    let (created_at, inserted) =
        found.ok_or_else(|| anyhow::anyhow!("like kept racing a cancel"))?;
    let mut updates: Vec<Update> = Vec::new();
    if inserted {
        updates.extend(shift_likes(&mut tx, target, 1).await?);
        let verb = match target {
            Target::Tweet(_) => Verb::LikedTweet,
            Target::Comment(_) => Verb::LikedComment,
        };
        notifications::notify(&mut tx, owner, user.id, verb, id).await?;
        if let Target::Tweet(tweet) = target {
            updates.push(Update::Liked {
                user: user.id,
                tweet,
                liked: true,
            });
        }
    }
    let staged = cache.stage(&mut tx, &updates).await?;
    tx.commit().await.context("committing the like")?;
    cache.finish(db, staged).await;
    if !inserted {
        // The like that made it may not have reached the cache yet (its process stopped
        // after the commit): this answer promises it, so it shows everywhere now.
        crate::cache::outbox::settle(cache, db).await;
    }
    Ok(Like {
        user: user.clone(),
        created_at,
    })
}

/// `user` takes back a like of `target`; returns rows deleted (0 or 1).
///
/// # Errors
/// 400 naming `object_id` if the object does not exist.
#[tracing::instrument(name = "likes::cancel", skip(db, cache))]
pub async fn cancel(db: &PgPool, cache: &Cache, user: i64, target: Target) -> ApiResult<u64> {
    let mut tx = db.begin().await?;
    let Some((_, target)) = lock_object(&mut tx, target).await? else {
        return Err(no_such_object());
    };
    let sql = match target {
        Target::Tweet(_) => "delete from tweet_likes where tweet_id = $1 and user_id = $2",
        Target::Comment(_) => "delete from comment_likes where comment_id = $1 and user_id = $2",
    };
    let (Target::Tweet(id) | Target::Comment(id)) = target;
    let deleted = sqlx::query(sql)
        .bind(id)
        .bind(user)
        .execute(&mut *tx)
        .await
        .context("deleting the like")?
        .rows_affected();
    let mut updates: Vec<Update> = Vec::new();
    if deleted > 0 {
        updates.extend(shift_likes(&mut tx, target, -1).await?);
        if let Target::Tweet(tweet) = target {
            updates.push(Update::Liked {
                user,
                tweet,
                liked: false,
            });
        }
    }
    let staged = cache.stage(&mut tx, &updates).await?;
    tx.commit().await.context("committing the cancel")?;
    cache.finish(db, staged).await;
    if deleted == 0 {
        // Asked for again: the cancel that made it may not have reached the cache yet.
        crate::cache::outbox::settle(cache, db).await;
    }
    Ok(deleted)
}

/// Most likes a user's liked set may hold to be cached; beyond it has_liked is asked of Postgres.
pub const MAX_CACHED_LIKES: usize = 10_000;

/// Which of `tweet_ids` `viewer` liked (none if anonymous): one Redis round trip on the viewer's
/// cached liked set; on a miss the set is loaded (one indexed query) and cached, guarded by its
/// generation like the timelines; without Redis, or for a viewer with more than
/// [`MAX_CACHED_LIKES`] likes (remembered by a marker in the set), one indexed query for the
/// page.
pub async fn liked_tweets(
    db: &PgPool,
    cache: &Cache,
    viewer: Option<i64>,
    tweet_ids: &[i64],
) -> sqlx::Result<HashSet<i64>> {
    let Some(user) = viewer else {
        return Ok(HashSet::new());
    };
    if tweet_ids.is_empty() {
        return Ok(HashSet::new());
    }
    let cached = match cache.available() {
        true => cache.liked_among(user, tweet_ids).await.ok(),
        false => None,
    };
    liked_given(db, cache, user, tweet_ids, cached).await
}

/// Which of `tweet_ids` `user` liked, given what the cached liked set said (`None`: Redis could
/// not be asked): the set's answer, else a load of the set on a miss, else one indexed query.
pub async fn liked_given(
    db: &PgPool,
    cache: &Cache,
    user: i64,
    tweet_ids: &[i64],
    cached: Option<LikedAmong>,
) -> sqlx::Result<HashSet<i64>> {
    match cached {
        Some(LikedAmong::Liked(liked)) => Ok(liked),
        Some(LikedAmong::Miss) => load_liked_set(db, cache, user, tweet_ids).await,
        Some(LikedAmong::TooMany) | None => liked_tweets_in_db(db, user, tweet_ids).await,
    }
}

/// Which of `tweet_ids` `user` liked, from Postgres alone: one indexed query. A retweet mark
/// among them ([`crate::retweets::retweet_mark`]) is answered from the user's retweets.
pub async fn liked_tweets_in_db(
    db: &PgPool,
    user: i64,
    tweet_ids: &[i64],
) -> sqlx::Result<HashSet<i64>> {
    liked(
        db,
        Some(user),
        tweet_ids,
        "select tweet_id from tweet_likes where user_id = $1 and tweet_id = any($2)
         union all
         select -retweeted_tweet_id - 2 from tweets
         where user_id = $1 and retweeted_tweet_id = any(select -m - 2 from unnest($2::bigint[]) m where m < -2)",
    )
    .await
}

/// Loads `user`'s liked set from Postgres and caches it (guarded by its generation), for when
/// the caller found it missing from the cache; returns which of `tweet_ids` are in it. A user
/// with more than [`MAX_CACHED_LIKES`] likes gets the "too many" marker instead, so later pages
/// go straight to the per-page query.
pub async fn load_liked_set(
    db: &PgPool,
    cache: &Cache,
    user: i64,
    tweet_ids: &[i64],
) -> sqlx::Result<HashSet<i64>> {
    let Ok(generation) = cache.begin_load_liked(user).await else {
        return liked_tweets_in_db(db, user, tweet_ids).await;
    };
    let set = liked_set(db, user).await?;
    cache.fill_liked(user, &generation, set.as_deref()).await;
    liked_among_set(db, user, tweet_ids, set.as_deref()).await
}

/// The rows of user `$1`'s liked set as [`liked_set`] caches it (the tweets it liked, and
/// [`crate::retweets::retweet_mark`]s of its retweets), at most the parameter given (`"$2"`):
/// [`liked_set`]'s statement, also part of a cold newsfeed page's
/// ([`crate::newsfeeds::first_rows_and_liked`]).
#[macro_export]
macro_rules! liked_set_select {
    ($limit:literal) => {
        concat!(
            "(select tweet_id from tweet_likes where user_id = $1
              union all
              select -retweeted_tweet_id - 2 from tweets
              where user_id = $1 and retweeted_tweet_id is not null)
             limit ",
            $limit
        )
    };
}

/// `user`'s liked set as it is cached: the tweets it liked and its retweets, as marks
/// ([`crate::retweets::retweet_mark`]: `has_retweeted`); `None` if it holds more than
/// [`MAX_CACHED_LIKES`] (the set is then cached as "too many"). Load it after
/// [`Cache::begin_load_liked`] (or [`Cache::begin_page_load`]) and store it with the
/// generation that returned.
///
/// # Errors
/// Postgres failed.
pub async fn liked_set(db: &PgPool, user: i64) -> sqlx::Result<Option<Vec<i64>>> {
    let all: Vec<i64> = sqlx::query_scalar(crate::liked_set_select!("$2"))
        .bind(user)
        .bind(MAX_CACHED_LIKES as i64 + 1)
        .fetch_all(db)
        .await?;
    Ok(cacheable_liked_set(all))
}

/// A liked set as [`liked_set`] read it (at most [`MAX_CACHED_LIKES`] + 1 entries): itself, or
/// `None` if it holds too many to cache.
pub fn cacheable_liked_set(all: Vec<i64>) -> Option<Vec<i64>> {
    (all.len() <= MAX_CACHED_LIKES).then_some(all)
}

/// Which of `tweet_ids` `user` liked, given its whole liked set as [`liked_set`] loaded it
/// (`None`, too many to load: one indexed query).
///
/// # Errors
/// Postgres failed.
pub async fn liked_among_set(
    db: &PgPool,
    user: i64,
    tweet_ids: &[i64],
    set: Option<&[i64]>,
) -> sqlx::Result<HashSet<i64>> {
    match set {
        Some(all) => {
            let page: HashSet<i64> = tweet_ids.iter().copied().collect();
            Ok(all.iter().copied().filter(|id| page.contains(id)).collect())
        }
        None => liked_tweets_in_db(db, user, tweet_ids).await,
    }
}

/// Which of `comment_ids` `viewer` liked: one indexed query (none if anonymous).
pub async fn liked_comments(
    db: &PgPool,
    viewer: Option<i64>,
    comment_ids: &[i64],
) -> sqlx::Result<HashSet<i64>> {
    liked(
        db,
        viewer,
        comment_ids,
        "select comment_id from comment_likes where user_id = $1 and comment_id = any($2)",
    )
    .await
}

async fn liked(
    db: &PgPool,
    viewer: Option<i64>,
    ids: &[i64],
    sql: &'static str,
) -> sqlx::Result<HashSet<i64>> {
    let Some(viewer) = viewer else {
        return Ok(HashSet::new());
    };
    if ids.is_empty() {
        return Ok(HashSet::new());
    }
    Ok(sqlx::query_scalar(sql)
        .bind(viewer)
        .bind(ids)
        .fetch_all(db)
        .await?
        .into_iter()
        .collect())
}

/// The newest `limit` likes of a tweet.
pub async fn newest_tweet_likes(
    db: &PgPool,
    cache: &Cache,
    tweet_id: i64,
    limit: i64,
) -> sqlx::Result<Vec<Like>> {
    let rows: Vec<(i64, Timestamp)> = sqlx::query_as(
        "select user_id, created_at from tweet_likes where tweet_id = $1 order by created_at desc limit $2",
    )
    .bind(tweet_id)
    .bind(limit)
    .fetch_all(db)
    .await?;
    let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let people = users::load_many(db, cache, &ids).await?;
    Ok(rows
        .into_iter()
        .filter_map(|(id, created_at)| {
            Some(Like {
                user: people.get(&id)?.clone().into(),
                created_at,
            })
        })
        .collect())
}
