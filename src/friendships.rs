//! Friendships: follow and unfollow (with their newsfeed backfill and unmerge jobs), and the
//! followers / followings listings.

use std::collections::{HashMap, HashSet};

use anyhow::Context;
use serde::Serialize;
use sqlx::PgPool;

use crate::cache::{Cache, Update};
use crate::db;
use crate::error::{ApiError, ApiResult};
use crate::jobs::{self, Job};
use crate::notifications::{self, Verb};
use crate::pagination::{Page, PageRequest};
use crate::time::{self, Timestamp};
use crate::users::{self, User, UserCountsRow};

/// The public `Friendship` object: the other user, when the friendship began, and whether the
/// caller follows that user.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Friendship {
    pub user: User,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "time::serialize")]
    pub created_at: Timestamp,
    pub has_followed: bool,
}

/// What a follow did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Followed {
    /// A new friendship, begun at this time.
    New(Timestamp),
    /// Already following; nothing changed.
    Duplicate,
}

async fn check_target(db: &PgPool, me: i64, target: i64) -> ApiResult<()> {
    if !users::exists(db, target).await? {
        return Err(ApiError::NotFound);
    }
    if me == target {
        return Err(ApiError::field("user_id", "You can not follow yourself."));
    }
    Ok(())
}

/// Shifts both users' counts in one statement (rows lock in id order: no deadlock between
/// opposite follows); returns the cache updates for both.
async fn shift_counts(
    tx: &mut sqlx::PgConnection,
    follower: i64,
    followee: i64,
    by: i64,
) -> sqlx::Result<Vec<Update>> {
    let rows: Vec<UserCountsRow> = sqlx::query_as(concat!(
        "update users set
            followings_count = followings_count + case when id = $1 then $3 else 0 end,
            followers_count = followers_count + case when id = $2 then $3 else 0 end,
            counts_version = counts_version + 1
         where id = any(array[$1, $2]::bigint[])",
        crate::returning_user_counts!()
    ))
    .bind(follower)
    .bind(followee)
    .bind(by)
    .fetch_all(tx)
    .await?;
    Ok(rows.iter().map(UserCountsRow::update).collect())
}

/// `me` follows `target`; queues the newsfeed backfill.
///
/// # Errors
/// 404 if `target` does not exist, 400 if it is `me`.
#[tracing::instrument(name = "friendships::follow", skip(db, cache))]
pub async fn follow(db: &PgPool, cache: &Cache, me: i64, target: i64) -> ApiResult<Followed> {
    check_target(db, me, target).await?;
    let outcome =
        db::with_unique_timestamp(&["friendships_created_at_key"], |created_at| async move {
            let mut tx = db.begin().await?;
            let inserted: Option<Timestamp> = sqlx::query_scalar(
                "insert into friendships (from_user_id, to_user_id, created_at) values ($1, $2, $3)
             on conflict (from_user_id, to_user_id) do nothing returning created_at",
            )
            .bind(me)
            .bind(target)
            .bind(created_at)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(created_at) = inserted else {
                return Ok((Some(Followed::Duplicate), None));
            };
            let updates = shift_counts(&mut tx, me, target, 1).await?;
            // Both users' rows are locked now: a block of either committed before is seen
            // here (and refuses), one after deletes this friendship (crate::blocks).
            if crate::blocks::blocked_either_way(&mut tx, me, target).await? {
                return Ok((None, None));
            }
            notifications::notify(&mut tx, target, me, Verb::Followed, target).await?;
            let job = Job::Backfill {
                follower: me,
                followee: target,
            };
            jobs::enqueue(&mut tx, &job).await?;
            let staged = cache.stage(&mut tx, &updates).await?;
            // From here the followee's pulled tweets are pulled; older ones are the backfill's
            // (crate::hybrid): the pull clock's time and the database's, read holding the
            // clock shared until the commit.
            sqlx::query(
                "update friendships set visible_from = (
                     select greatest(clock, at + interval '1 microsecond') from pull_clock_share())
                 where from_user_id = $1 and to_user_id = $2",
            )
            .bind(me)
            .bind(target)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok((Some(Followed::New(created_at)), Some(staged)))
        })
        .await
        .context("inserting the friendship")?;
    match outcome {
        (_, Some(staged)) => cache.finish(db, staged).await,
        // The follow that made it may not have reached the cache yet (its process stopped
        // after the commit): this answer promises it, so it shows everywhere now.
        (Some(Followed::Duplicate), None) => {
            crate::cache::outbox::settle(cache, db).await;
        }
        (_, None) => {}
    }
    outcome.0.ok_or(ApiError::Forbidden)
}

/// `me` stops following `target`; queues the newsfeed unmerge. Returns rows deleted (0 or 1).
///
/// # Errors
/// 404 if `target` does not exist, 400 if it is `me`.
#[tracing::instrument(name = "friendships::unfollow", skip(db, cache))]
pub async fn unfollow(db: &PgPool, cache: &Cache, me: i64, target: i64) -> ApiResult<u64> {
    check_target(db, me, target).await?;
    let mut tx = db.begin().await?;
    // Waits for the fan-out batches of `target` in flight (see `newsfeeds::fanout`).
    crate::newsfeeds::lock_followers(&mut tx, target, true).await?;
    let (deleted, updates) = remove_edge(&mut tx, me, target).await?;
    let staged = cache.stage(&mut tx, &updates).await?;
    tx.commit().await.context("committing the unfollow")?;
    cache.finish(db, staged).await;
    if deleted == 0 {
        // Asked for again: the unfollow that made it may not have reached the cache yet.
        crate::cache::outbox::settle(cache, db).await;
    }
    Ok(deleted)
}

/// Deletes the friendship `follower` → `followee` if there is one, with its counts and its
/// newsfeed unmerge job: rows deleted (0 or 1) and the counts' cache updates. The caller holds
/// [`crate::newsfeeds::lock_followers`] of `followee`, exclusive (an unfollow, a block).
///
/// # Errors
/// Postgres failed.
pub async fn remove_edge(
    tx: &mut sqlx::PgConnection,
    follower: i64,
    followee: i64,
) -> sqlx::Result<(u64, Vec<Update>)> {
    let deleted =
        sqlx::query("delete from friendships where from_user_id = $1 and to_user_id = $2")
            .bind(follower)
            .bind(followee)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    if deleted == 0 {
        return Ok((0, Vec::new()));
    }
    let updates = shift_counts(&mut *tx, follower, followee, -1).await?;
    let job = Job::Unmerge { follower, followee };
    jobs::enqueue(&mut *tx, &job).await?;
    Ok((deleted, updates))
}

/// Which listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Who follows the user.
    Followers,
    /// Whom the user follows.
    Followings,
}

/// A page of a user's followers or followings, newest friendship first. The friendships are
/// read from `read` (the replica when it may serve this caller, see [`crate::replica`]); the
/// users from the cache or the primary `db` (a fill must not come from a replica).
///
/// # Errors
/// 404 if the user does not exist.
pub async fn list(
    db: &PgPool,
    read: &PgPool,
    cache: &Cache,
    user: i64,
    direction: Direction,
    req: &PageRequest,
    viewer: Option<i64>,
) -> ApiResult<Page<Friendship>> {
    if !users::exists(read, user).await? {
        return Err(ApiError::NotFound);
    }
    let sql = match direction {
        Direction::Followers => {
            "select from_user_id, created_at from friendships where to_user_id = $1
               and created_at < coalesce($2, 'infinity') and created_at > coalesce($3, '-infinity')
             order by created_at desc limit $4"
        }
        Direction::Followings => {
            "select to_user_id, created_at from friendships where from_user_id = $1
               and created_at < coalesce($2, 'infinity') and created_at > coalesce($3, '-infinity')
             order by created_at desc limit $4"
        }
    };
    let rows: Vec<(i64, Timestamp)> = sqlx::query_as(sql)
        .bind(user)
        .bind(req.lt)
        .bind(req.gt)
        .bind(req.want() as i64)
        .fetch_all(read)
        .await?;
    let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let people: HashMap<i64, crate::model::UserRecord> = users::load_many(db, cache, &ids).await?;
    let followed: HashSet<i64> = match viewer {
        Some(v) if !ids.is_empty() => sqlx::query_scalar(
            "select to_user_id from friendships where from_user_id = $1 and to_user_id = any($2)",
        )
        .bind(v)
        .bind(&ids)
        .fetch_all(read)
        .await?
        .into_iter()
        .collect(),
        _ => HashSet::new(),
    };
    let items = rows
        .into_iter()
        .filter_map(|(id, created_at)| {
            let user = people.get(&id)?.clone().into();
            Some(Friendship {
                user,
                created_at,
                has_followed: followed.contains(&id),
            })
        })
        .collect();
    Ok(Page::from_items(items, req))
}
