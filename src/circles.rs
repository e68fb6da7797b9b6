//! Circles: communities that tweets are posted into, each with its tweets as one more cached
//! timeline (`Timeline::Circle`, read straight from `tweets` by `circle_id`) and a daily rank
//! (the per-circle feeds and the per-circle daily rank with 30-day expiry of the NSQ + Redis
//! feed design). Every SQL statement on `circles` and `circle_members` lives here.
//!
//! **Rank.** The rank of a circle on a UTC day lists the tweets posted into it that day by score
//! = `likes_count + comments_count`, ties newest first. Postgres is the truth (the counters are
//! exact, see [`crate::likes`]); Redis caches each (circle, day) as a sorted set with a 30-day
//! TTL ([`crate::cache::rank`]). A tweet's creation, and every like, cancel and comment on it,
//! writes its new score through with the `counts_version` it committed with, so a write that
//! reaches Redis late can not put back an older score, and a missing rank is never created by a
//! write (no blind `INCR`): it is rebuilt from Postgres by the next reader, guarded by the same
//! generations as a timeline fill.

use chrono::{Datelike, Duration, NaiveDate, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};

use crate::cache::rank::{RankEntry, parse_rank_member, rank_key, rank_member};
use crate::cache::{Cache, Guard, Update};
use crate::db;
use crate::error::{ApiError, ApiResult};
use crate::lists::{Added, Member, member_page, validate_named};
use crate::model::{TweetCounts, TweetRecord};
use crate::pagination::{Page, PageRequest};
use crate::time::{self, Timestamp};
use crate::timeline::{self, FeedRow, ListEntry, Timeline};
use crate::tweets::Tweet;
use crate::users::{self, User};

/// Most characters of a circle name.
pub const MAX_NAME_CHARS: usize = 50;
/// Most characters of a circle description.
pub const MAX_DESCRIPTION_CHARS: usize = 280;
/// How many days back a rank can be asked for (the rank's TTL).
pub const RANK_DAYS: i64 = 30;
/// Most entries of one rank page.
pub const MAX_RANK_LIMIT: usize = 100;

/// A circle as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct CircleRow {
    pub id: i64,
    pub owner_id: i64,
    pub name: String,
    pub description: String,
    pub members_count: i64,
    pub tweets_count: i64,
    pub created_at: Timestamp,
}

/// The public `Circle` object.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Circle {
    pub id: i64,
    pub name: String,
    pub description: String,
    pub owner: User,
    pub members_count: i64,
    pub tweets_count: i64,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "time::serialize")]
    pub created_at: Timestamp,
    /// Whether the caller is a member (false for anonymous callers).
    pub is_member: bool,
}

/// One place of a rank: `{"rank", "score", "tweet"}`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Ranked {
    /// 1, 2, 3, … (ties broken newest first).
    pub rank: usize,
    /// `likes_count + comments_count`.
    pub score: i64,
    pub tweet: Tweet,
}

macro_rules! circle_columns {
    () => {
        "id, owner_id, name, description, members_count, tweets_count, created_at"
    };
}

/// Validates a circle's name (1–50 characters after trimming) and description (at most 280).
///
/// # Errors
/// The field errors, by field.
pub fn validate(name: Option<String>, description: Option<String>) -> ApiResult<(String, String)> {
    validate_named(name, description, MAX_NAME_CHARS, MAX_DESCRIPTION_CHARS)
}

/// Creates a circle owned by `owner`, who is its first member.
///
/// # Errors
/// 400 on `name` if a circle of that name (case-insensitive) exists.
pub async fn create(
    db: &PgPool,
    owner: i64,
    name: &str,
    description: &str,
) -> ApiResult<CircleRow> {
    let sql = concat!(
        "insert into circles (owner_id, name, description, members_count, created_at)
         values ($1, $2, $3, 1, $4) returning ",
        circle_columns!(),
        ""
    );
    let created = db::with_unique_timestamp(
        &["circles_created_at_key", "circle_members_created_at_key"],
        |created_at| async move {
            let mut tx = db.begin().await?;
            let row: CircleRow = sqlx::query_as(sql)
                .bind(owner)
                .bind(name)
                .bind(description)
                .bind(created_at)
                .fetch_one(&mut *tx)
                .await?;
            sqlx::query(
                "insert into circle_members (circle_id, user_id, created_at) values ($1, $2, $3)",
            )
            .bind(row.id)
            .bind(owner)
            .bind(created_at)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(row)
        },
    )
    .await;
    match created {
        Err(e) if db::violates(&e, "circles_name_key") => Err(ApiError::field(
            "name",
            "A circle with this name already exists.",
        )),
        other => Ok(other?),
    }
}

/// Circle `id`, if it exists.
pub async fn get(db: &PgPool, id: i64) -> sqlx::Result<Option<CircleRow>> {
    sqlx::query_as(concat!(
        "select ",
        circle_columns!(),
        " from circles where id = $1"
    ))
    .bind(id)
    .fetch_optional(db)
    .await
}

/// A page of every circle, newest first.
pub async fn all(db: &PgPool, req: &PageRequest) -> sqlx::Result<Vec<CircleRow>> {
    sqlx::query_as(concat!(
        "select ",
        circle_columns!(),
        " from circles
         where created_at < coalesce($1, 'infinity') and created_at > coalesce($2, '-infinity')
         order by created_at desc limit $3"
    ))
    .bind(req.lt)
    .bind(req.gt)
    .bind(req.want() as i64)
    .fetch_all(db)
    .await
}

/// `Circle` objects for rows, with owners from the user cache and `is_member` for `viewer`.
pub async fn objects(
    db: &PgPool,
    cache: &Cache,
    rows: Vec<CircleRow>,
    viewer: Option<i64>,
) -> sqlx::Result<Vec<Circle>> {
    let owners: Vec<i64> = rows.iter().map(|r| r.owner_id).collect();
    let users = users::load_many(db, cache, &owners).await?;
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    let joined: Vec<i64> =
        match viewer {
            Some(v) if !ids.is_empty() => sqlx::query_scalar(
                "select circle_id from circle_members where user_id = $1 and circle_id = any($2)",
            )
            .bind(v)
            .bind(&ids)
            .fetch_all(db)
            .await?,
            _ => Vec::new(),
        };
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            Some(Circle {
                owner: users.get(&r.owner_id)?.clone().into(),
                is_member: joined.contains(&r.id),
                id: r.id,
                name: r.name,
                description: r.description,
                members_count: r.members_count,
                tweets_count: r.tweets_count,
                created_at: r.created_at,
            })
        })
        .collect())
}

async fn lock_circle(tx: &mut PgConnection, id: i64) -> ApiResult<()> {
    let found: Option<i64> =
        sqlx::query_scalar("select id from circles where id = $1 for no key update")
            .bind(id)
            .fetch_optional(tx)
            .await?;
    found.map(|_| ()).ok_or(ApiError::NotFound)
}

/// `me` joins circle `id`.
///
/// # Errors
/// 404 if there is no such circle.
pub async fn join(db: &PgPool, me: i64, id: i64) -> ApiResult<Added> {
    db::with_unique_timestamp(
        &["circle_members_created_at_key"],
        |created_at| async move {
            let mut tx = db.begin().await?;
            if let Err(e) = lock_circle(&mut tx, id).await {
                return Ok(Err(e));
            }
            let inserted: Option<Timestamp> = sqlx::query_scalar(
                "insert into circle_members (circle_id, user_id, created_at) values ($1, $2, $3)
                 on conflict (circle_id, user_id) do nothing returning created_at",
            )
            .bind(id)
            .bind(me)
            .bind(created_at)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(created_at) = inserted else {
                return Ok(Ok(Added::Duplicate));
            };
            shift_members(&mut tx, id, 1).await?;
            tx.commit().await?;
            Ok(Ok(Added::New(created_at)))
        },
    )
    .await?
}

/// `me` leaves circle `id`; returns rows deleted (0 or 1). Tweets posted into it stay.
///
/// # Errors
/// 404 if there is no such circle.
pub async fn leave(db: &PgPool, me: i64, id: i64) -> ApiResult<u64> {
    let mut tx = db.begin().await?;
    lock_circle(&mut tx, id).await?;
    let deleted = sqlx::query("delete from circle_members where circle_id = $1 and user_id = $2")
        .bind(id)
        .bind(me)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if deleted > 0 {
        shift_members(&mut tx, id, -1).await?;
    }
    tx.commit().await?;
    Ok(deleted)
}

async fn shift_members(tx: &mut PgConnection, id: i64, by: i64) -> sqlx::Result<()> {
    sqlx::query("update circles set members_count = members_count + $2 where id = $1")
        .bind(id)
        .bind(by)
        .execute(tx)
        .await
        .map(|_| ())
}

/// A page of circle `id`'s members, newest member first.
pub async fn members(
    db: &PgPool,
    cache: &Cache,
    id: i64,
    req: &PageRequest,
) -> sqlx::Result<Page<Member>> {
    let rows: Vec<(i64, Timestamp)> = sqlx::query_as(
        "select user_id, created_at from circle_members where circle_id = $1
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

/// Whether `user` may post into circle `id`.
///
/// # Errors
/// 400 on `circle_id` if there is no such circle, 403 if `user` is not a member.
pub async fn check_can_post(db: &PgPool, id: i64, user: i64) -> ApiResult<()> {
    let (exists, member): (bool, bool) = sqlx::query_as(
        "select exists (select 1 from circles where id = $1),
                exists (select 1 from circle_members where circle_id = $1 and user_id = $2)",
    )
    .bind(id)
    .bind(user)
    .fetch_one(db)
    .await?;
    match (exists, member) {
        (false, _) => Err(ApiError::field("circle_id", "Circle does not exist.")),
        (true, false) => Err(ApiError::Forbidden),
        (true, true) => Ok(()),
    }
}

/// Moves circle `id`'s `tweets_count` by `by` (in the tweet's transaction).
pub async fn shift_tweets(tx: &mut PgConnection, id: i64, by: i64) -> sqlx::Result<()> {
    sqlx::query("update circles set tweets_count = tweets_count + $2 where id = $1")
        .bind(id)
        .bind(by)
        .execute(tx)
        .await
        .map(|_| ())
}

/// The cache updates of a tweet posted into a circle: the entry in the circle's tweets and its
/// zero score in the day's rank. Nothing for a tweet outside circles. `newest` is the circle's
/// newest tweet before this one (read under the circle's row lock), the merge's predecessor: a
/// cached list that lacks it is dropped instead ([`Update::Merge`]).
pub fn created_updates(tweet: &TweetRecord, newest: Option<Timestamp>) -> Vec<Update> {
    let Some(circle) = tweet.circle_id else {
        return Vec::new();
    };
    let timeline = Timeline::Circle(circle);
    let entry = entry_of(tweet);
    let mut updates = vec![Update::Merge {
        list: timeline.key(),
        guard: Guard::None,
        after: newest.map(crate::time::to_micros),
        entries: vec![timeline.scored(&entry)],
    }];
    updates.extend(score_update(tweet, &TweetCounts::default()));
    updates
}

/// The cache updates of deleting a circle tweet: out of the circle's tweets and its day's rank.
pub fn deleted_updates(tweet: &TweetRecord) -> Vec<Update> {
    let Some(circle) = tweet.circle_id else {
        return Vec::new();
    };
    let timeline = Timeline::Circle(circle);
    let entry = entry_of(tweet);
    vec![
        Update::Remove {
            list: timeline.key(),
            members: vec![timeline.member(&entry)],
            mark: None,
        },
        Update::Remove {
            list: rank_key(circle, day_number(tweet.created_at.date_naive())),
            members: vec![rank_member(tweet.created_at, tweet.id, tweet.user_id).into_bytes()],
            mark: None,
        },
    ]
}

/// The versioned write-through of a circle tweet's score after its counts changed (see the
/// module docs); `None` outside circles or for a day older than the rank keeps.
pub fn score_update(tweet: &TweetRecord, counts: &TweetCounts) -> Option<Update> {
    let circle = tweet.circle_id?;
    let day = tweet.created_at.date_naive();
    if day < Utc::now().date_naive() - Duration::days(RANK_DAYS + 1) {
        return None;
    }
    Some(Update::RankScore {
        rank: rank_key(circle, day_number(day)),
        member: rank_member(tweet.created_at, tweet.id, tweet.user_id),
        score: counts.likes + counts.comments,
        version: counts.version,
    })
}

fn entry_of(tweet: &TweetRecord) -> ListEntry {
    ListEntry {
        id: tweet.id,
        tweet_id: tweet.id,
        author_id: tweet.user_id,
        created_at: tweet.created_at,
        shift: 0,
    }
}

/// `yyyymmdd` of a day (the rank key's day).
fn day_number(day: NaiveDate) -> u32 {
    day.year().unsigned_abs() * 10_000 + day.month() * 100 + day.day()
}

/// `select … from tweets t join users u` with the columns of a [`FeedRow`].
macro_rules! circle_rows {
    () => {
        concat!(
            "select t.id as entry_id, t.created_at,",
            crate::feed_row_columns!(),
            "from tweets t join users u on u.id = t.user_id "
        )
    };
}

/// The newest `limit` entries of circle `id`'s tweets older than `lt` (if given), for filling
/// the cache.
pub async fn timeline_entries(
    db: &PgPool,
    id: i64,
    lt: Option<Timestamp>,
    limit: usize,
) -> sqlx::Result<Vec<ListEntry>> {
    let sql = "select id, id as tweet_id, user_id as author_id, created_at from tweets
         where circle_id = $1 and created_at < coalesce($2, 'infinity')
         order by created_at desc limit $3";
    crate::timeline::fetch_entries(db, sql, id, lt, limit).await
}

/// A page of circle `id`'s tweets strictly between the cursors, hydrated in the same query.
pub async fn timeline_page(
    db: &PgPool,
    id: i64,
    lt: Option<Timestamp>,
    gt: Option<Timestamp>,
    limit: usize,
) -> sqlx::Result<Vec<FeedRow>> {
    let sql = concat!(
        circle_rows!(),
        "where t.circle_id = $1
           and t.created_at < coalesce($2, 'infinity') and t.created_at > coalesce($3, '-infinity')
         order by t.created_at desc limit $4"
    );
    crate::timeline::fetch_page(db, sql, id, lt, gt, limit).await
}

/// Parses the rank's `date` (`YYYY-MM-DD`, UTC; default today).
///
/// # Errors
/// 400 on `date` if it is malformed, in the future or more than [`RANK_DAYS`] days back.
pub fn parse_day(raw: Option<&str>) -> ApiResult<NaiveDate> {
    let today = Utc::now().date_naive();
    let Some(raw) = raw.map(str::trim).filter(|r| !r.is_empty()) else {
        return Ok(today);
    };
    let day = NaiveDate::parse_from_str(raw, "%Y-%m-%d")
        .map_err(|_| ApiError::field("date", "Date has wrong format. Use YYYY-MM-DD."))?;
    if day > today {
        return Err(ApiError::field("date", "Date is in the future."));
    }
    if day < today - Duration::days(RANK_DAYS) {
        return Err(ApiError::field(
            "date",
            format!("Ranks are kept for {RANK_DAYS} days."),
        ));
    }
    Ok(day)
}

/// The `limit` best tweets of circle `id` posted on UTC day `day`, with their scores; from the
/// cached rank, rebuilt from Postgres on a miss; from Postgres alone if Redis fails.
///
/// # Errors
/// 404 if there is no such circle.
#[tracing::instrument(name = "circles::rank", skip(db, cache))]
pub async fn rank(
    db: &PgPool,
    cache: &Cache,
    id: i64,
    day: NaiveDate,
    limit: usize,
    viewer: Option<i64>,
) -> ApiResult<Vec<Ranked>> {
    if get(db, id).await?.is_none() {
        return Err(ApiError::NotFound);
    }
    let (from, to) = day_bounds(day);
    if cache.available()
        && let Some(scored) = cached_rank(db, cache, id, day, limit).await?
    {
        let entries: Vec<ListEntry> = scored
            .iter()
            .filter_map(|(member, _)| {
                let (created_at, tweet_id, author_id) = parse_rank_member(member)?;
                Some(ListEntry {
                    id: tweet_id,
                    tweet_id,
                    author_id,
                    created_at,
                    shift: 0,
                })
            })
            .collect();
        if let Some(items) = timeline::hydrate_entries(db, cache, &entries, viewer).await? {
            let score_of = |tweet: i64| {
                entries
                    .iter()
                    .zip(&scored)
                    .find(|(e, _)| e.tweet_id == tweet)
                    .map_or(0, |(_, (_, s))| *s)
            };
            return Ok(items
                .into_iter()
                .filter_map(|item| {
                    let score = score_of(item.tweet.id());
                    Some((score, Tweet::from_item(item)?))
                })
                .enumerate()
                .map(|(i, (score, tweet))| Ranked {
                    rank: i + 1,
                    score,
                    tweet,
                })
                .collect());
        }
    }
    let rows: Vec<FeedRow> = sqlx::query_as(concat!(
        circle_rows!(),
        "where t.circle_id = $1 and t.created_at >= $2 and t.created_at < $3
         order by t.likes_count + t.comments_count desc, t.created_at desc limit $4"
    ))
    .bind(id)
    .bind(from)
    .bind(to)
    .bind(limit as i64)
    .fetch_all(db)
    .await?;
    let items = timeline::with_likes(db, cache, rows, viewer).await?;
    Ok(items
        .into_iter()
        .filter_map(|item| {
            let score = item.counts.likes + item.counts.comments;
            Some((score, Tweet::from_item(item)?))
        })
        .enumerate()
        .map(|(i, (score, tweet))| Ranked {
            rank: i + 1,
            score,
            tweet,
        })
        .collect())
}

fn day_bounds(day: NaiveDate) -> (Timestamp, Timestamp) {
    let from = day.and_time(chrono::NaiveTime::MIN).and_utc();
    (from, from + Duration::days(1))
}

/// The best `limit` `(member, score)` of a cached rank, rebuilding it on a miss (one rebuild
/// per rank at a time in this process; the fill is refused if a score was written meanwhile).
/// `None` if Redis failed.
async fn cached_rank(
    db: &PgPool,
    cache: &Cache,
    id: i64,
    day: NaiveDate,
    limit: usize,
) -> sqlx::Result<Option<Vec<(String, i64)>>> {
    let key = rank_key(id, day_number(day));
    if let Ok(Some(hit)) = cache.rank_range(key, limit).await {
        return Ok(Some(hit));
    }
    let Some(flight) = cache.flight(key) else {
        return Ok(None);
    };
    let _loading = flight.acquire().await;
    match cache.rank_range(key, limit).await {
        Ok(Some(hit)) => return Ok(Some(hit)),
        Ok(None) => {}
        Err(_) => return Ok(None),
    }
    let Ok(generation) = cache.begin_load(key).await else {
        return Ok(None);
    };
    let (from, to) = day_bounds(day);
    let rows: Vec<(i64, i64, Timestamp, i64, i64)> = sqlx::query_as(
        "select id, user_id, created_at, likes_count + comments_count, counts_version from tweets
         where circle_id = $1 and created_at >= $2 and created_at < $3",
    )
    .bind(id)
    .bind(from)
    .bind(to)
    .fetch_all(db)
    .await?;
    let mut entries: Vec<RankEntry> = rows
        .into_iter()
        .map(|(tweet, author, at, score, version)| (rank_member(at, tweet, author), score, version))
        .collect();
    if cache.rank_fill(key, &generation, &entries).await.is_err() {
        return Ok(None);
    }
    entries.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
    entries.truncate(limit);
    Ok(Some(
        entries
            .into_iter()
            .map(|(member, score, _)| (member, score))
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn day_numbers_are_yyyymmdd() {
        let day = NaiveDate::from_ymd_opt(2026, 11, 2).unwrap();
        assert_eq!(day_number(day), 20261102);
    }
}
