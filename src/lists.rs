//! Lists (Twitter lists; Mastodon's `feed:list:<id>`): CRUD, membership, and the list timeline,
//! kept like a newsfeed. Every SQL statement on `lists`, `list_members` and `list_feeds` lives
//! here, with the three jobs that keep a list's timeline:
//!
//! - **fan-out** ([`fn@fanout`]): a new tweet gets one `list_feeds` row in every list that contains
//!   its author, in batches of `CHIRP_FANOUT_BATCH_SIZE` lists, merged into the cached list
//!   timelines. It is the second part of the tweet's fan-out job, after the followers'
//!   newsfeeds (so lists never delay a newsfeed), and costs one row per list that contains the
//!   author, whatever the size of those lists.
//! - **backfill** ([`backfill`]): a new member's newest `CHIRP_CACHE_LIST_LIMIT` tweets are
//!   copied in.
//! - **unmerge** ([`unmerge`]): a removed member's tweets are deleted.
//!
//! The races are those of newsfeeds and are handled the same way (see [`crate::newsfeeds`]):
//! the fan-out locks the membership rows it reads (`for share`), so a removal waits for it and
//! its unmerge sees the rows; merges are guarded by the list's removal generation; backfill and
//! unmerge are the shared steps of [`crate::fanout`] on the (list, member) pair. The read path is the generic one of [`crate::timeline`]
//! (`Timeline::List`).

use std::collections::HashMap;

use anyhow::Context;
use serde::Serialize;
use sqlx::{PgConnection, PgPool};

use crate::cache::{Cache, Update};
use crate::db;
use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::fanout::{self, Pair};
use crate::jobs::{self, Job, Worker};
use crate::pagination::{Page, PageRequest};
use crate::time::{self, Timestamp};
use crate::timeline::{FeedRow, ListEntry, Timeline};
use crate::users::{self, User};

/// Most characters of a list name (Twitter's limit).
pub const MAX_NAME_CHARS: usize = 25;
/// Most characters of a list description.
pub const MAX_DESCRIPTION_CHARS: usize = 100;

/// A list as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ListRow {
    pub id: i64,
    pub owner_id: i64,
    pub name: String,
    pub description: String,
    pub members_count: i64,
    pub created_at: Timestamp,
}

/// The public `List` object.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct List {
    pub id: i64,
    pub name: String,
    pub description: String,
    pub owner: User,
    pub members_count: i64,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "time::serialize")]
    pub created_at: Timestamp,
}

/// A member of a list or circle: `{"user": User, "created_at"}` (when they joined).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Member {
    pub user: User,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "time::serialize")]
    pub created_at: Timestamp,
}

/// What adding a member did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    /// A new member since this time.
    New(Timestamp),
    /// Already a member; nothing changed.
    Duplicate,
}

macro_rules! list_columns {
    () => {
        "id, owner_id, name, description, members_count, created_at"
    };
}

/// Validates a list's name (1–25 characters after trimming) and description (at most 100).
///
/// # Errors
/// The field errors, by field.
pub fn validate(name: Option<String>, description: Option<String>) -> ApiResult<(String, String)> {
    validate_named(name, description, MAX_NAME_CHARS, MAX_DESCRIPTION_CHARS)
}

/// Validates the `name` (1 to `max_name` characters after trimming) and `description` (at most
/// `max_description`, absent: empty) of a named group: a list or a circle.
///
/// # Errors
/// The field errors, by field.
pub fn validate_named(
    name: Option<String>,
    description: Option<String>,
    max_name: usize,
    max_description: usize,
) -> ApiResult<(String, String)> {
    let mut errors = FieldErrors::new();
    let too_long = |max: usize| {
        vec![format!(
            "Ensure this field has no more than {max} characters."
        )]
    };
    let name = name.map(|n| n.trim().to_owned()).unwrap_or_default();
    match name.chars().count() {
        0 => errors.insert("name".into(), vec!["This field may not be blank.".into()]),
        n if n > max_name => errors.insert("name".into(), too_long(max_name)),
        _ => None,
    };
    let description = description.map(|d| d.trim().to_owned()).unwrap_or_default();
    if description.chars().count() > max_description {
        errors.insert("description".into(), too_long(max_description));
    }
    if errors.is_empty() {
        Ok((name, description))
    } else {
        Err(ApiError::Validation(errors))
    }
}

/// Creates a list owned by `owner`.
///
/// # Errors
/// 400 on `name` if the owner has a list of that name already.
pub async fn create(db: &PgPool, owner: i64, name: &str, description: &str) -> ApiResult<ListRow> {
    let sql = concat!(
        "insert into lists (owner_id, name, description, created_at) values ($1, $2, $3, $4)
         returning ",
        list_columns!(),
        ""
    );
    let created = db::with_unique_timestamp(&["lists_created_at_key"], |created_at| {
        sqlx::query_as::<_, ListRow>(sql)
            .bind(owner)
            .bind(name)
            .bind(description)
            .bind(created_at)
            .fetch_one(db)
    })
    .await;
    match created {
        Err(e) if db::violates(&e, "lists_owner_name_key") => Err(ApiError::field(
            "name",
            "You already have a list with this name.",
        )),
        other => Ok(other?),
    }
}

/// List `id`, if it exists.
pub async fn get(db: &PgPool, id: i64) -> sqlx::Result<Option<ListRow>> {
    sqlx::query_as(concat!(
        "select ",
        list_columns!(),
        " from lists where id = $1"
    ))
    .bind(id)
    .fetch_optional(db)
    .await
}

/// A page of the lists `owner` owns, newest first.
pub async fn by_owner(db: &PgPool, owner: i64, req: &PageRequest) -> sqlx::Result<Vec<ListRow>> {
    sqlx::query_as(concat!(
        "select ",
        list_columns!(),
        " from lists where owner_id = $1
           and created_at < coalesce($2, 'infinity') and created_at > coalesce($3, '-infinity')
         order by created_at desc limit $4"
    ))
    .bind(owner)
    .bind(req.lt)
    .bind(req.gt)
    .bind(req.want() as i64)
    .fetch_all(db)
    .await
}

/// `List` objects for rows, with their owners loaded through the user cache.
pub async fn objects(db: &PgPool, cache: &Cache, rows: Vec<ListRow>) -> sqlx::Result<Vec<List>> {
    let owners: Vec<i64> = rows.iter().map(|r| r.owner_id).collect();
    let users = users::load_many(db, cache, &owners).await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            let owner = users.get(&r.owner_id)?.clone().into();
            Some(List {
                id: r.id,
                name: r.name,
                description: r.description,
                owner,
                members_count: r.members_count,
                created_at: r.created_at,
            })
        })
        .collect())
}

/// Locks list `id` for a change by `me` (its owner).
///
/// # Errors
/// 404 if there is no such list, 403 if `me` does not own it.
async fn lock_owned(tx: &mut PgConnection, me: i64, id: i64) -> ApiResult<()> {
    let owner: Option<i64> =
        sqlx::query_scalar("select owner_id from lists where id = $1 for no key update")
            .bind(id)
            .fetch_optional(tx)
            .await?;
    match owner {
        None => Err(ApiError::NotFound),
        Some(owner) if owner != me => Err(ApiError::Forbidden),
        Some(_) => Ok(()),
    }
}

/// Deletes list `id` of `me`, its members and its timeline, and drops its cached timeline.
///
/// # Errors
/// 404 if there is no such list, 403 if `me` does not own it.
pub async fn delete(db: &PgPool, cache: &Cache, me: i64, id: i64) -> ApiResult<()> {
    let mut tx = db.begin().await?;
    lock_owned(&mut tx, me, id).await?;
    sqlx::query("delete from lists where id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await
        .context("deleting the list")?;
    let update = Update::Invalidate {
        list: Timeline::List(id).key(),
    };
    let staged = cache.stage(&mut tx, &[update]).await?;
    tx.commit().await.context("committing the list delete")?;
    cache.finish(db, staged).await;
    Ok(())
}

/// `me` adds `user` to list `id`; queues the backfill of the member's tweets.
///
/// # Errors
/// 404 / 403 as [`delete`]; 400 on `user_id` if there is no such user.
pub async fn add_member(db: &PgPool, me: i64, id: i64, user: i64) -> ApiResult<Added> {
    db::with_unique_timestamp(&["list_members_created_at_key"], |created_at| async move {
        let mut tx = db.begin().await?;
        if let Err(e) = lock_owned(&mut tx, me, id).await {
            return Ok(Err(e));
        }
        if !users::exists(&mut *tx, user).await? {
            return Ok(Err(ApiError::field("user_id", "User does not exist.")));
        }
        let inserted: Option<Timestamp> = sqlx::query_scalar(
            "insert into list_members (list_id, user_id, created_at) values ($1, $2, $3)
                 on conflict (list_id, user_id) do nothing returning created_at",
        )
        .bind(id)
        .bind(user)
        .bind(created_at)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(created_at) = inserted else {
            return Ok(Ok(Added::Duplicate));
        };
        shift_members(&mut tx, id, 1).await?;
        jobs::enqueue(
            &mut tx,
            &Job::ListBackfill {
                list: id,
                member: user,
            },
        )
        .await?;
        tx.commit().await?;
        Ok(Ok(Added::New(created_at)))
    })
    .await
    .context("adding the list member")?
}

/// `me` removes `user` from list `id`; queues the unmerge. Returns rows deleted (0 or 1).
///
/// # Errors
/// 404 / 403 as [`delete`].
pub async fn remove_member(db: &PgPool, me: i64, id: i64, user: i64) -> ApiResult<u64> {
    let mut tx = db.begin().await?;
    lock_owned(&mut tx, me, id).await?;
    let deleted = sqlx::query("delete from list_members where list_id = $1 and user_id = $2")
        .bind(id)
        .bind(user)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if deleted > 0 {
        shift_members(&mut tx, id, -1).await?;
        jobs::enqueue(
            &mut tx,
            &Job::ListUnmerge {
                list: id,
                member: user,
            },
        )
        .await?;
    }
    tx.commit().await.context("committing the member removal")?;
    Ok(deleted)
}

async fn shift_members(tx: &mut PgConnection, id: i64, by: i64) -> sqlx::Result<()> {
    sqlx::query("update lists set members_count = members_count + $2 where id = $1")
        .bind(id)
        .bind(by)
        .execute(tx)
        .await
        .map(|_| ())
}

/// A page of list `id`'s members, newest member first.
pub async fn members(
    db: &PgPool,
    cache: &Cache,
    id: i64,
    req: &PageRequest,
) -> sqlx::Result<Page<Member>> {
    let rows: Vec<(i64, Timestamp)> = sqlx::query_as(
        "select user_id, created_at from list_members where list_id = $1
           and created_at < coalesce($2, 'infinity') and created_at > coalesce($3, '-infinity')
         order by created_at desc limit $4",
    )
    .bind(id)
    .bind(req.lt)
    .bind(req.gt)
    .bind(req.want() as i64)
    .fetch_all(db)
    .await?;
    member_page(db, cache, rows, req).await
}

/// A page of `Member`s from `(user_id, created_at)` rows (shared with circles).
pub async fn member_page(
    db: &PgPool,
    cache: &Cache,
    rows: Vec<(i64, Timestamp)>,
    req: &PageRequest,
) -> sqlx::Result<Page<Member>> {
    let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let people = users::load_many(db, cache, &ids).await?;
    let items = rows
        .into_iter()
        .filter_map(|(id, created_at)| {
            Some(Member {
                user: people.get(&id)?.clone().into(),
                created_at,
            })
        })
        .collect();
    Ok(Page::from_items(items, req))
}

/// `select … from list_feeds f join tweets t join users u` with the columns of a [`FeedRow`].
macro_rules! list_feed_rows {
    () => {
        concat!(
            "select f.tweet_id as entry_id, f.created_at,",
            crate::feed_row_columns!(),
            "from list_feeds f join tweets t on t.id = f.tweet_id join users u on u.id = t.user_id "
        )
    };
}

/// The newest `limit` entries of list `id`'s timeline older than `lt` (if given), for filling
/// the cache.
pub async fn feed_entries(
    db: &PgPool,
    id: i64,
    lt: Option<Timestamp>,
    limit: usize,
) -> sqlx::Result<Vec<ListEntry>> {
    let sql = "select f.tweet_id as id, f.tweet_id, t.user_id as author_id, f.created_at
         from list_feeds f join tweets t on t.id = f.tweet_id
         where f.list_id = $1 and f.created_at < coalesce($2, 'infinity')
         order by f.created_at desc limit $3";
    crate::timeline::fetch_entries(db, sql, id, lt, limit).await
}

/// A page of list `id`'s timeline strictly between the cursors, hydrated in the same query.
pub async fn feed_page(
    db: &PgPool,
    id: i64,
    lt: Option<Timestamp>,
    gt: Option<Timestamp>,
    limit: usize,
) -> sqlx::Result<Vec<FeedRow>> {
    let sql = concat!(
        list_feed_rows!(),
        "where f.list_id = $1
           and f.created_at < coalesce($2, 'infinity') and f.created_at > coalesce($3, '-infinity')
         order by f.created_at desc limit $4"
    );
    crate::timeline::fetch_page(db, sql, id, lt, gt, limit).await
}

/// Rows of list `id`'s timeline older than `gt` that arrived after it (a backfill or late
/// fan-out), newest first, at most `limit`. Two index ranges whose cost follows what they
/// return, not the list's length: the rows created in the second before `gt` (the primary
/// key), and the rows that arrived more than a second after their tweet (the partial index
/// `list_feeds_late_idx`, whose predicate `late` repeats; materialized, so that the planner
/// can not trade it for a backward walk of the primary key that stops at the limit, which
/// reads half the list when there are fewer late rows than the limit). The page is joined to
/// its tweets and authors after the limit.
pub async fn late_arrivals(
    db: &PgPool,
    id: i64,
    gt: Timestamp,
    limit: usize,
) -> sqlx::Result<Vec<FeedRow>> {
    sqlx::query_as(LATE_ARRIVALS)
        .bind(id)
        .bind(gt)
        .bind(limit as i64)
        .fetch_all(db)
        .await
}

/// The statement of [`late_arrivals`] (`$1` list, `$2` gt, `$3` limit), public so a test can
/// look at its plan.
pub const LATE_ARRIVALS: &str = concat!(
    "with late as materialized (
         select tweet_id, created_at from list_feeds
         where list_id = $1 and arrived_at > $2
           and arrived_at - created_at > interval '1 second'
           and created_at < $2 - interval '1 second'
     ), newest as (
         select tweet_id, created_at from (
             select tweet_id, created_at from list_feeds
             where list_id = $1 and created_at >= $2 - interval '1 second' and created_at < $2
               and arrived_at > $2
             union all
             select tweet_id, created_at from late
         ) rows
         order by created_at desc limit $3
     )
     select f.tweet_id as entry_id, f.created_at,",
    crate::feed_row_columns!(),
    "from newest f join tweets t on t.id = f.tweet_id join users u on u.id = t.user_id
     order by f.created_at desc"
);

/// Deletes every list timeline row of a tweet (in the delete's transaction); returns the lists.
pub async fn delete_for_tweet(tx: &mut PgConnection, tweet_id: i64) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar("delete from list_feeds where tweet_id = $1 returning list_id")
        .bind(tweet_id)
        .fetch_all(tx)
        .await
}

/// List fan-out-on-write: a `list_feeds` row for the tweet in every list that contains its
/// author, one batch of `batch_size` lists per transaction, merged into the cached list
/// timelines. `progress` is the `created_at` of the last membership done. See the module docs.
///
/// # Errors
/// Postgres failed; the job is retried from the last recorded batch.
#[tracing::instrument(name = "lists::fanout", skip(worker))]
pub async fn fanout(
    worker: &Worker,
    job_id: i64,
    tweet_id: i64,
    mut progress: Option<Timestamp>,
) -> anyhow::Result<()> {
    loop {
        let mut tx = worker.db.begin().await?;
        let tweet: Option<(i64, Timestamp)> =
            sqlx::query_as("select user_id, created_at from tweets where id = $1 for key share")
                .bind(tweet_id)
                .fetch_optional(&mut *tx)
                .await
                .context("locking the tweet")?;
        let Some((author, created_at)) = tweet else {
            return Ok(()); // deleted meanwhile
        };
        let batch: Vec<(i64, Timestamp)> = sqlx::query_as(
            "select list_id, created_at from list_members
             where user_id = $1 and created_at > coalesce($2, '-infinity')
             order by created_at limit $3
             for share",
        )
        .bind(author)
        .bind(progress)
        .bind(worker.batch_size as i64)
        .fetch_all(&mut *tx)
        .await
        .context("locking a batch of lists")?;
        let Some(&(_, last)) = batch.last() else {
            return Ok(());
        };
        let lists: Vec<i64> = batch.iter().map(|(l, _)| *l).collect();
        let keys: Vec<_> = lists.iter().map(|l| Timeline::List(*l).key()).collect();
        let guards = worker.cache.removal_generations(&keys).await.ok();
        let inserted: Vec<i64> = sqlx::query_scalar(
            "insert into list_feeds (list_id, tweet_id, created_at, arrived_at)
             select l, $2, $3, clock_timestamp() from unnest($1::bigint[]) as l
             on conflict (list_id, created_at) do update set tweet_id = excluded.tweet_id
             returning list_id",
        )
        .bind(&lists)
        .bind(tweet_id)
        .bind(created_at)
        .fetch_all(&mut *tx)
        .await
        .context("inserting a batch of list timeline rows")?;
        let entry = ListEntry {
            id: tweet_id,
            tweet_id,
            author_id: author,
            created_at,
            shift: 0,
        };
        let index: HashMap<i64, usize> = lists.iter().enumerate().map(|(i, l)| (*l, i)).collect();
        let updates: Vec<Update> = inserted
            .iter()
            .map(|l| {
                let guard = index.get(l).and_then(|i| guards.as_ref()?.get(*i).cloned());
                Timeline::List(*l).guarded_merge(guard, None, &[entry])
            })
            .collect();
        let staged = worker.cache.stage(&mut tx, &updates).await?;
        jobs::save_progress(&mut *tx, job_id, jobs::Part::Lists, last).await?;
        tx.commit()
            .await
            .context("committing a list fan-out batch")?;
        worker.cache.finish(&worker.db, staged).await;
        progress = Some(last);
        if batch.len() < worker.batch_size {
            return Ok(());
        }
    }
}

/// The membership's row (`$2` is in list `$1`): the pair exists while it does. Both the check
/// and the unmerge's delete ask it ([`Pair::remove`]).
macro_rules! membership_row {
    () => {
        "select 1 from list_members where list_id = $1 and user_id = $2"
    };
}

/// The (list timeline, member) pair of a membership, for [`fanout::backfill`] and
/// [`fanout::unmerge`].
fn membership(list: i64, member: i64) -> Pair {
    Pair {
        timeline: Timeline::List(list),
        owner: list,
        source: member,
        lock: "list-member",
        pull_clock: false,
        exists: concat!("select exists (", membership_row!(), ")"),
        head: None,
        copy: "insert into list_feeds (list_id, tweet_id, created_at, arrived_at)
               select $1, t.id, t.created_at, clock_timestamp() from tweets t
               where t.user_id = $2 order by t.created_at desc limit $3
               on conflict (list_id, created_at) do update set tweet_id = excluded.tweet_id
               returning tweet_id as id, tweet_id, $2::bigint as author_id, created_at",
        remove: concat!(
            "delete from list_feeds f using tweets t
             where f.list_id = $1 and t.user_id = $2 and f.tweet_id = t.id
               and not exists (",
            membership_row!(),
            ")
             returning f.tweet_id as id, f.tweet_id, t.user_id as author_id, f.created_at"
        ),
        reveals: None,
        lock_source: None,
    }
}

/// Member backfill: if `member` is still in the list, copies their newest `backfill_limit`
/// tweets into the list's timeline and merges them into the cached list.
///
/// # Errors
/// Postgres failed; the job is retried.
#[tracing::instrument(name = "lists::backfill", skip(worker))]
pub async fn backfill(worker: &Worker, list: i64, member: i64) -> anyhow::Result<()> {
    fanout::backfill(worker, &membership(list, member)).await
}

/// Member unmerge: unless `member` is in the list again, removes their tweets from the list's
/// timeline and from the cached list.
///
/// # Errors
/// Postgres failed; the job is retried.
#[tracing::instrument(name = "lists::unmerge", skip(worker))]
pub async fn unmerge(worker: &Worker, list: i64, member: i64) -> anyhow::Result<()> {
    fanout::unmerge(worker, &membership(list, member)).await
}
