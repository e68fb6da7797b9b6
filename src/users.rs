//! Users and profiles: the `User` and `Profile` objects, user hydration, profile edits.

use std::collections::HashMap;

use anyhow::Context;
use serde::Serialize;
use sqlx::PgPool;

use crate::cache::{Cache, Update};
use crate::model::{UserCounts, UserRecord};
use crate::time::{self, Timestamp};

/// The public `User` object: `{"id", "username", "nickname", "avatar_url"}`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct User {
    pub id: i64,
    pub username: String,
    pub nickname: Option<String>,
    pub avatar_url: Option<String>,
}

impl From<UserRecord> for User {
    fn from(r: UserRecord) -> Self {
        User {
            id: r.id,
            username: r.username,
            nickname: r.nickname,
            avatar_url: r.avatar_url,
        }
    }
}

/// The public `Profile` object: [`User`] plus counts and the sign-up time.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Profile {
    #[serde(flatten)]
    pub user: User,
    pub followers_count: i64,
    pub followings_count: i64,
    pub tweets_count: i64,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "time::serialize")]
    pub created_at: Timestamp,
}

impl Profile {
    fn new(user: UserRecord, counts: UserCounts) -> Self {
        let created_at = user.created_at;
        Profile {
            user: user.into(),
            followers_count: counts.followers,
            followings_count: counts.followings,
            tweets_count: counts.tweets,
            created_at,
        }
    }
}

/// The `returning` clause that reads a user's id and counts after changing them (a macro, so
/// queries stay `&'static str` with `concat!`).
#[macro_export]
macro_rules! returning_user_counts {
    () => {
        " returning id, followers_count, followings_count, tweets_count, counts_version"
    };
}

/// A user's id and counts as an `update ... returning` gives them after a change.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct UserCountsRow {
    pub id: i64,
    #[sqlx(flatten)]
    pub counts: UserCounts,
}

impl UserCountsRow {
    /// The write-through cache update for these counts.
    pub fn update(&self) -> Update {
        Update::UserCounts {
            id: self.id,
            counts: self.counts,
        }
    }
}

/// The profile of user `id`, if it exists: the user object and its counts from the cache, from
/// Postgres for what is not cached.
pub async fn profile(db: &PgPool, cache: &Cache, id: i64) -> sqlx::Result<Option<Profile>> {
    let Some(user) = load_many(db, cache, &[id]).await?.remove(&id) else {
        return Ok(None);
    };
    let counts = match cache.get_user_counts(id).await.ok().flatten() {
        Some(c) => c,
        None => {
            let Some(row) = counts_of(db, id).await? else {
                return Ok(None);
            };
            cache.put_user_counts(id, &row.counts).await;
            row.counts
        }
    };
    Ok(Some(Profile::new(user, counts)))
}

async fn counts_of(db: &PgPool, id: i64) -> sqlx::Result<Option<UserCountsRow>> {
    sqlx::query_as(
        "select id, followers_count, followings_count, tweets_count, counts_version from users where id = $1",
    )
    .bind(id)
    .fetch_optional(db)
    .await
}

/// Whether user `id` exists.
pub async fn exists<'e>(db: impl sqlx::PgExecutor<'e>, id: i64) -> sqlx::Result<bool> {
    sqlx::query_scalar("select exists (select 1 from users where id = $1)")
        .bind(id)
        .fetch_one(db)
        .await
}

/// A profile edit: `Some(None)` clears a field, `None` leaves it.
#[derive(Debug, Default)]
pub struct ProfileEdit {
    pub nickname: Option<Option<String>>,
    pub avatar_url: Option<Option<String>>,
}

/// Applies a profile edit and bumps the user's version, then writes the new user object through
/// to the cache with that version (a reader holding the old version can not put it back). The
/// answer is built from the committed row, so it always shows the edit; with it comes the
/// avatar URL the edit replaced (read from the locked row, never from a cache).
///
/// # Errors
/// Postgres failed.
#[tracing::instrument(name = "users::update_profile", skip(db, cache, edit))]
pub async fn update_profile(
    db: &PgPool,
    cache: &Cache,
    id: i64,
    edit: ProfileEdit,
) -> anyhow::Result<Option<(Profile, Option<String>)>> {
    let mut tx = db.begin().await?;
    // The previous avatar comes from the row the update replaces (locked), not from a cache
    // that may lag: the caller deletes that file.
    let updated: Option<Edited> = sqlx::query_as(
        "with old as (select avatar_url from users where id = $1 for update)
         update users set
            nickname = case when $2 then $3 else nickname end,
            avatar_url = case when $4 then $5 else users.avatar_url end,
            version = version + 1
         from old
         where id = $1
         returning id, username, nickname, users.avatar_url, version, created_at,
                   old.avatar_url as previous_avatar_url",
    )
    .bind(id)
    .bind(edit.nickname.is_some())
    .bind(edit.nickname.flatten())
    .bind(edit.avatar_url.is_some())
    .bind(edit.avatar_url.flatten())
    .fetch_optional(&mut *tx)
    .await
    .context("updating the profile")?;
    let Some(Edited {
        user,
        previous_avatar_url,
    }) = updated
    else {
        return Ok(None);
    };
    let staged = cache
        .stage(&mut tx, &[Update::UserChanged { user: user.clone() }])
        .await?;
    tx.commit().await.context("committing the profile edit")?;
    cache.finish(db, staged).await;
    let counts = match cache.get_user_counts(id).await.ok().flatten() {
        Some(c) => c,
        None => counts_of(db, id)
            .await?
            .map(|r| r.counts)
            .unwrap_or_default(),
    };
    Ok(Some((Profile::new(user, counts), previous_avatar_url)))
}

/// A profile edit's row and the avatar URL it replaced.
#[derive(sqlx::FromRow)]
struct Edited {
    #[sqlx(flatten)]
    user: UserRecord,
    previous_avatar_url: Option<String>,
}

/// Users by id, from the user object cache where possible and from Postgres (one query) for
/// the rest, which are then cached. Unknown ids are absent from the map.
pub async fn load_many(
    db: &PgPool,
    cache: &Cache,
    ids: &[i64],
) -> sqlx::Result<HashMap<i64, UserRecord>> {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let mut found = HashMap::with_capacity(ids.len());
    let mut missing = Vec::new();
    match cache.available() {
        true => match cache.get_users(&ids).await {
            Ok(cached) => {
                for (id, user) in ids.iter().zip(cached) {
                    match user {
                        Some(u) => {
                            found.insert(*id, u);
                        }
                        None => missing.push(*id),
                    }
                }
            }
            Err(_) => missing = ids.clone(),
        },
        false => missing = ids.clone(),
    }
    found.extend(load_uncached(db, cache, &missing).await?);
    Ok(found)
}

/// Users by id from Postgres (one query), then cached: for ids the caller already found
/// missing from the cache.
pub async fn load_uncached(
    db: &PgPool,
    cache: &Cache,
    ids: &[i64],
) -> sqlx::Result<HashMap<i64, UserRecord>> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let rows: Vec<UserRecord> = sqlx::query_as(concat!(
        "select ",
        crate::user_record_columns!(),
        " from users where id = any($1)"
    ))
    .bind(ids)
    .fetch_all(db)
    .await?;
    if cache.available() {
        cache.put_users(&rows).await;
    }
    Ok(rows.into_iter().map(|r| (r.id, r)).collect())
}
