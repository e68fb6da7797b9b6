//! Tweets: creation (with the fan-out job), deletion (removed from every listing), and the SQL
//! behind the user-tweets listing.

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::cache::counts::{Counts, CountsOf};
use crate::cache::objects::Cached;
use crate::cache::timeline::{FeedRow, Item, ListEntry};
use crate::cache::{Cache, Expect, ListKey, Update};
use crate::db;
use crate::error::{ApiError, ApiResult};
use crate::jobs;
use crate::time::{self, Timestamp};
use crate::users::{self, User, UserCounts, UserRecord};

/// Most characters of a tweet or comment, after trimming.
pub const MAX_CONTENT_CHARS: usize = 280;

/// A tweet as stored and cached (the tweet object cache holds this as JSON).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, Serialize, Deserialize)]
pub struct TweetRecord {
    pub id: i64,
    pub user_id: i64,
    pub content: String,
    pub created_at: Timestamp,
}

/// The public `Tweet` object.
#[derive(Debug, Clone, Serialize)]
pub struct Tweet {
    pub id: i64,
    pub user: User,
    #[serde(serialize_with = "time::serialize")]
    pub created_at: Timestamp,
    pub content: String,
    pub comments_count: i64,
    pub likes_count: i64,
    pub has_liked: bool,
}

impl Tweet {
    /// A tweet object from its parts.
    pub fn new(record: TweetRecord, user: User, counts: &Counts, has_liked: bool) -> Self {
        Tweet {
            id: record.id,
            user,
            created_at: record.created_at,
            content: record.content,
            likes_count: counts.get(0),
            comments_count: counts.get(1),
            has_liked,
        }
    }

    /// A tweet object from a hydrated timeline item.
    pub fn from_item(item: Item) -> Self {
        let has_liked = item.has_liked;
        let counts = Counts {
            version: 0,
            values: vec![item.likes_count, item.comments_count],
        };
        Tweet::new(item.tweet, item.author.into(), &counts, has_liked)
    }
}

/// The `returning` clause that reads a tweet row with its counts after changing them.
#[macro_export]
macro_rules! returning_tweet_row {
    () => {
        " returning id, user_id, content, created_at, likes_count, comments_count, counts_version"
    };
}

/// A tweet row with its counters, as read from Postgres.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TweetRow {
    #[sqlx(flatten)]
    pub record: TweetRecord,
    pub likes_count: i64,
    pub comments_count: i64,
    pub counts_version: i64,
}

impl TweetRow {
    /// `[likes_count, comments_count]` with their version.
    pub fn counts(&self) -> Counts {
        Counts {
            version: self.counts_version,
            values: vec![self.likes_count, self.comments_count],
        }
    }

    /// The write-through cache update for these counts.
    pub fn counts_update(&self) -> Update {
        Update::Counts(CountsOf::Tweet(self.record.id), self.counts())
    }
}

/// Validates tweet or comment text: 1 to 280 characters after trimming.
pub fn validate_content(raw: &str) -> Result<String, String> {
    let content = raw.trim();
    match content.chars().count() {
        0 => Err("This field may not be blank.".into()),
        n if n > MAX_CONTENT_CHARS => Err(format!(
            "Ensure this field has no more than {MAX_CONTENT_CHARS} characters."
        )),
        _ => Ok(content.to_owned()),
    }
}

/// Creates a tweet. One transaction inserts the tweet, the author's own newsfeed row, the
/// author's count and the fan-out job; then the author's cached lists get the entry at once
/// (read your writes) and the worker is woken to fan out to followers.
pub async fn create(
    db: &PgPool,
    cache: &Cache,
    author: i64,
    content: &str,
) -> sqlx::Result<TweetRecord> {
    let (tweet, newsfeed_id, author_counts) = db::with_unique_timestamp("tweets_created_at_key", |created_at| async move {
        let mut tx = db.begin().await?;
        let tweet: TweetRecord = sqlx::query_as(
            "insert into tweets (user_id, content, created_at) values ($1, $2, $3)
             returning id, user_id, content, created_at",
        )
        .bind(author)
        .bind(content)
        .bind(created_at)
        .fetch_one(&mut *tx)
        .await?;
        let newsfeed_id: i64 = sqlx::query_scalar(
            "insert into newsfeeds (user_id, tweet_id, created_at) values ($1, $2, $3) returning id",
        )
        .bind(author)
        .bind(tweet.id)
        .bind(created_at)
        .fetch_one(&mut *tx)
        .await?;
        let author_counts = shift_tweets_count(&mut tx, author, 1).await?;
        jobs::enqueue_fanout(&mut tx, tweet.id).await?;
        tx.commit().await?;
        Ok((tweet, newsfeed_id, author_counts))
    })
    .await?;
    let score = time::to_micros(tweet.created_at);
    let entry = ListEntry {
        id: newsfeed_id,
        tweet_id: tweet.id,
        author_id: author,
        created_at: tweet.created_at,
    };
    cache
        .apply(
            db,
            vec![
                Update::Merge(
                    ListKey::UserTweets(author),
                    Expect::Any,
                    vec![(score, tweet.id.to_string())],
                ),
                Update::Merge(
                    ListKey::Newsfeed(author),
                    Expect::Any,
                    vec![(score, entry.newsfeed_member())],
                ),
                Update::TweetCreated(tweet.clone()),
                author_counts.update(),
            ],
        )
        .await;
    Ok(tweet)
}

/// Moves the author's `tweets_count` by `by`, returning the new counts for the cache.
async fn shift_tweets_count(
    tx: &mut sqlx::PgConnection,
    author: i64,
    by: i64,
) -> sqlx::Result<UserCounts> {
    sqlx::query_as(concat!(
        "update users set tweets_count = tweets_count + $2, counts_version = counts_version + 1 where id = $1",
        crate::returning_user_counts!()
    ))
    .bind(author)
    .bind(by)
    .fetch_one(tx)
    .await
}

/// Deletes tweet `id` of user `me`: the tweet, every newsfeed row of it, and every cached entry
/// (the tweet object becomes a tombstone, so no late reader can bring it back).
///
/// # Errors
/// `NotFound` if there is no such tweet, `Forbidden` if `me` is not its author.
pub async fn delete(db: &PgPool, cache: &Cache, me: i64, id: i64) -> ApiResult<()> {
    let mut tx = db.begin().await?;
    // Locking the row waits for fan-out batches inserting rows for it (they hold a key share).
    let owner: Option<i64> =
        sqlx::query_scalar("select user_id from tweets where id = $1 for update")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
    match owner {
        None => return Err(ApiError::NotFound),
        Some(owner) if owner != me => return Err(ApiError::Forbidden),
        Some(_) => {}
    }
    let readers: Vec<(i64, i64)> =
        sqlx::query_as("delete from newsfeeds where tweet_id = $1 returning id, user_id")
            .bind(id)
            .fetch_all(&mut *tx)
            .await?;
    // Its comments and likes go with it (on delete cascade).
    sqlx::query("delete from tweets where id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let author_counts = shift_tweets_count(&mut tx, me, -1).await?;
    tx.commit().await?;

    let mut updates = vec![
        Update::TweetDeleted(id),
        Update::DropCounts(CountsOf::Tweet(id)),
        author_counts.update(),
        Update::Remove(ListKey::UserTweets(me), vec![id.to_string()]),
    ];
    updates.extend(readers.into_iter().map(|(newsfeed_id, reader)| {
        let entry = ListEntry {
            id: newsfeed_id,
            tweet_id: id,
            author_id: me,
            created_at: Timestamp::default(),
        };
        Update::Remove(ListKey::Newsfeed(reader), vec![entry.newsfeed_member()])
    }));
    cache.apply(db, updates).await;
    Ok(())
}

/// Tweets with their counts by id (any order; unknown ids are absent).
pub async fn rows_by_ids(db: &PgPool, ids: &[i64]) -> sqlx::Result<Vec<TweetRow>> {
    sqlx::query_as(
        "select id, user_id, content, created_at, likes_count, comments_count, counts_version
         from tweets where id = any($1)",
    )
    .bind(ids)
    .fetch_all(db)
    .await
}

/// The newest `limit` entries of user `user_id`'s tweets (for filling the cache).
pub async fn list_entries(db: &PgPool, user_id: i64, limit: usize) -> sqlx::Result<Vec<ListEntry>> {
    sqlx::query_as(
        "select id, id as tweet_id, user_id as author_id, created_at from tweets
         where user_id = $1 order by created_at desc limit $2",
    )
    .bind(user_id)
    .bind(limit as i64)
    .fetch_all(db)
    .await
}

/// A page of user `user_id`'s tweets strictly between the cursors, hydrated in the same query.
pub async fn list_page(
    db: &PgPool,
    user_id: i64,
    lt: Option<Timestamp>,
    gt: Option<Timestamp>,
    limit: usize,
) -> sqlx::Result<Vec<FeedRow>> {
    sqlx::query_as(
        "select t.id as entry_id, t.created_at, t.id as tweet_id, t.content, t.likes_count, t.comments_count,
                u.id as author_id, u.username, u.nickname, u.avatar_url, u.version,
                u.created_at as author_created_at
         from tweets t join users u on u.id = t.user_id
         where t.user_id = $1
           and t.created_at < coalesce($2, 'infinity') and t.created_at > coalesce($3, '-infinity')
         order by t.created_at desc limit $4",
    )
    .bind(user_id)
    .bind(lt)
    .bind(gt)
    .bind(limit as i64)
    .fetch_all(db)
    .await
}

/// Tweet `id`, its counts and its author, from the caches where possible.
pub async fn load(
    db: &PgPool,
    cache: &Cache,
    id: i64,
) -> sqlx::Result<Option<(TweetRecord, Counts, UserRecord)>> {
    let (tweet, counts) = match cache.get_tweets(&[id]).await {
        Ok((mut t, mut c)) => (t.pop().unwrap_or(Cached::Miss), c.pop().flatten()),
        Err(_) => (Cached::Miss, None),
    };
    let (record, counts) = match (tweet, counts) {
        (Cached::Deleted, _) => return Ok(None),
        (Cached::Hit(t), Some(c)) => (t, c),
        _ => match rows_by_ids(db, &[id]).await?.pop() {
            // No tombstone for a missing id: it may be one that is not assigned yet.
            None => return Ok(None),
            Some(row) => {
                cache.put_tweets(std::slice::from_ref(&row), &[]).await;
                let counts = row.counts();
                (row.record, counts)
            }
        },
    };
    let author = users::load_many(db, cache, &[record.user_id])
        .await?
        .remove(&record.user_id);
    Ok(author.map(|a| (record, counts, a)))
}
