//! Tweets: creation with the fan-out job ([`mod@create`]), deletion from every listing
//! ([`mod@delete`]), edits ([`mod@edit`]), loading one tweet through the cache, and the SQL behind the user-tweets timeline.

use serde::Serialize;
use serde_json::value::RawValue;
use sqlx::{PgConnection, PgPool};

use crate::cache::objects::{Cached, CachedTweet, CachedUser};
use crate::cache::{Cache, Update};
use crate::circles;
use crate::error::ApiResult;
use crate::model::{Place, TweetCounts, TweetRecord, UserCounts, UserRecord};
use crate::time::{self, Timestamp};
use crate::timeline::{AuthorBody, FeedRow, Item, ListEntry, TweetBody};
use crate::users::{self, User};

/// Most characters of a tweet or comment, after trimming.
pub const MAX_CONTENT_CHARS: usize = 280;

/// Above this many readers, a tweet delete does not remove the tweet from each cached newsfeed
/// in the request: the tombstone hides it, and each reader's next read drops the entry.
pub const MAX_EAGER_REMOVALS: usize = 1000;

/// How long after posting a tweet's text can be edited (Twitter's and Mastodon's edit window
/// is of the same order).
pub const EDIT_WINDOW: chrono::TimeDelta = chrono::TimeDelta::hours(1);

/// The public `Tweet` object.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Tweet {
    pub id: i64,
    pub user: User,
    #[schema(value_type = String, format = DateTime)]
    #[serde(serialize_with = "time::serialize")]
    pub created_at: Timestamp,
    pub content: String,
    pub comments_count: i64,
    pub likes_count: i64,
    /// Its direct replies ([`crate::replies`]).
    pub replies_count: i64,
    pub has_liked: bool,
    /// The circle the tweet was posted into, or null.
    pub circle_id: Option<i64>,
    /// URLs of its photos, in upload order.
    pub photo_urls: Vec<String>,
    /// `[lon, lat]` in degrees, or null.
    pub coordinates: Option<Vec<f64>>,
    /// `{"full_name", "bbox": [sw_lon, sw_lat, ne_lon, ne_lat]}`, or null.
    pub place: Option<Place>,
    /// When its text was last edited (`PATCH /api/tweets/{id}/`), or null.
    #[schema(value_type = Option<String>, format = DateTime)]
    #[serde(serialize_with = "time::serialize_option")]
    pub edited_at: Option<Timestamp>,
    /// The `#tags` of its text: lowercase, without `#`, without repeats, in order of first use
    /// ([`crate::hashtags::parse`]).
    pub hashtags: Vec<String>,
    /// The users its text mentions (`@username`, resolved when it was posted or last edited),
    /// in order of first mention, as they are now ([`crate::mentions`]).
    pub mentions: Vec<User>,
    /// The tweet this one replies to (it may have been deleted since), or null.
    pub in_reply_to_tweet_id: Option<i64>,
    /// The author of the tweet this one replies to, or null.
    pub in_reply_to_user_id: Option<i64>,
    /// Its live retweets ([`crate::retweets`]).
    pub retweets_count: i64,
    /// Whether the caller retweeted it (false for anonymous callers).
    pub has_retweeted: bool,
    /// A retweet's retweeted tweet (Twitter's `retweeted_status`, Mastodon's `reblog`), or null.
    #[schema(no_recursion)]
    pub retweeted_tweet: Option<Box<Tweet>>,
    /// A retweet's retweeted tweet's id (absent on other tweets).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retweeted_tweet_id: Option<i64>,
    /// The ids behind `mentions` (not public): [`complete`] hydrates them.
    #[serde(skip)]
    pub mentioned_user_ids: Vec<i64>,
}

/// What a new tweet says besides its author: text (validated), circle, photos and location.
#[derive(Debug, Clone, Default)]
pub struct NewTweet {
    pub content: String,
    pub circle_id: Option<i64>,
    pub photo_urls: Vec<String>,
    /// `[lon, lat]` in degrees.
    pub coordinates: Option<[f64; 2]>,
    pub place: Option<Place>,
    /// The tweet it replies to ([`crate::replies`]), checked by [`create()`].
    pub in_reply_to_tweet_id: Option<i64>,
    /// The tweet it retweets ([`crate::retweets::retweet`]; the text is empty), checked by
    /// [`create()`].
    pub retweeted_tweet_id: Option<i64>,
}

impl Tweet {
    /// A tweet object from its parts.
    pub fn new(record: TweetRecord, user: User, counts: &TweetCounts, has_liked: bool) -> Self {
        Tweet {
            id: record.id,
            user,
            created_at: record.created_at,
            likes_count: counts.likes,
            comments_count: counts.comments,
            replies_count: counts.replies,
            has_liked,
            circle_id: record.circle_id,
            photo_urls: record.photo_urls,
            coordinates: record.coordinates,
            place: record.place.map(|p| p.0),
            edited_at: record.edited_at,
            hashtags: crate::hashtags::parse(&record.content),
            mentions: Vec::new(),
            in_reply_to_tweet_id: record.in_reply_to_tweet_id,
            in_reply_to_user_id: record.in_reply_to_user_id,
            retweets_count: counts.retweets,
            has_retweeted: false,
            retweeted_tweet: None,
            retweeted_tweet_id: record.retweeted_tweet_id,
            mentioned_user_ids: record.mentioned_user_ids,
            content: record.content,
        }
    }

    /// A tweet object from a hydrated timeline item; `None` if its cached fields do not parse.
    pub fn from_item(item: Item) -> Option<Self> {
        let record = item.tweet.into_record()?;
        let mut tweet = Tweet::new(
            record,
            item.author.into_record()?.into(),
            &item.counts,
            item.has_liked,
        );
        tweet.has_retweeted = item.has_retweeted;
        tweet.mentions = (item.mentions.into_iter())
            .filter_map(|u| Some(u.into_record()?.into()))
            .collect();
        if let Some(retweeted) = item.retweeted {
            tweet.retweeted_tweet = Some(Box::new(Tweet::from_item(*retweeted)?));
        }
        Some(tweet)
    }
}

/// Completes a tweet object built from its row ([`Tweet::new`]): `has_retweeted` for `viewer`,
/// a retweet's retweeted tweet ([`crate::retweets::complete`]) and the mentioned users of both
/// ([`crate::mentions::complete`]).
///
/// # Errors
/// 404 if a retweet's retweeted tweet is gone; Postgres failed.
pub async fn complete(
    db: &PgPool,
    cache: &Cache,
    viewer: Option<i64>,
    tweet: Tweet,
) -> ApiResult<Tweet> {
    let mut tweet = crate::retweets::complete(db, cache, viewer, tweet).await?;
    crate::mentions::complete(db, cache, &mut tweet).await?;
    Ok(tweet)
}

/// Completes hydrated timeline items as [`complete`] does a tweet object: retweeted tweets and
/// `has_retweeted` ([`crate::retweets::attach`]), then the mentioned users
/// ([`crate::mentions::attach`]). Every page of tweets passes here before it is written.
///
/// # Errors
/// Postgres failed.
pub async fn complete_page(
    db: &PgPool,
    cache: &Cache,
    viewer: Option<i64>,
    items: Vec<Item>,
) -> sqlx::Result<Vec<Item>> {
    let items = crate::retweets::attach(db, cache, viewer, items).await?;
    crate::mentions::attach(db, cache, items).await
}

/// A tweet object in a response: typed, or spliced together from the cached JSON members of
/// the tweet ([`crate::cache::objects::CachedTweet`]), its author and its counts without parsing
/// or re-escaping anything (the warm timeline path). Both give the same JSON object (member
/// order aside); [`TweetJson::write`] copies a spliced one as it is.
#[derive(Debug)]
pub enum TweetJson {
    Typed(Box<Tweet>),
    /// `{"user":…,"comments_count":…,"likes_count":…,"replies_count":…,"has_liked":…,
    /// "retweets_count":…,"has_retweeted":…,"retweeted_tweet":…,"mentions":[…],` and the
    /// tweet's members.
    Spliced {
        user: UserJson,
        /// The mentioned users ([`crate::mentions::attach`]), in order.
        mentions: Box<[UserJson]>,
        counts: TweetCounts,
        has_liked: bool,
        has_retweeted: bool,
        /// A retweet's retweeted tweet ([`crate::retweets::attach`]).
        retweeted: Option<Box<TweetJson>>,
        tweet: CachedTweet,
    },
}

/// The author of a spliced tweet: a cached user's public members (shared with the page's other
/// items by this author, not copied), or JSON serialised for it.
#[derive(Debug)]
pub enum UserJson {
    Head(CachedUser),
    Json(String),
}

impl UserJson {
    /// The public `User` of a hydrated user; `None` if a cached one is corrupt.
    fn of(user: AuthorBody) -> Option<Self> {
        Some(match user {
            AuthorBody::Cached(u) if u.public_head().is_some() => UserJson::Head(u),
            AuthorBody::Cached(u) => {
                UserJson::Json(serde_json::to_string(&User::from(u.record()?)).ok()?)
            }
            AuthorBody::Record(u) => UserJson::Json(serde_json::to_string(&User::from(*u)).ok()?),
        })
    }

    /// Appends the `User` object to `out`.
    fn write(&self, out: &mut Vec<u8>) {
        match self {
            UserJson::Head(u) => {
                // `of` builds `Head` only for a user that has a public head.
                out.extend_from_slice(u.public_head().unwrap_or("{").as_bytes());
                out.push(b'}');
            }
            UserJson::Json(json) => out.extend_from_slice(json.as_bytes()),
        }
    }
}

impl TweetJson {
    /// The tweet object of a hydrated timeline item; `None` if its cached fields are corrupt.
    pub fn from_item(item: Item) -> Option<Self> {
        let TweetBody::Cached(tweet) = item.tweet else {
            return Tweet::from_item(item).map(|t| TweetJson::Typed(Box::new(t)));
        };
        let retweeted = match item.retweeted {
            Some(original) => Some(Box::new(TweetJson::from_item(*original)?)),
            None => None,
        };
        let mentions = (item.mentions.into_iter())
            .map(UserJson::of)
            .collect::<Option<_>>()?;
        Some(TweetJson::Spliced {
            user: UserJson::of(item.author)?,
            mentions,
            counts: item.counts,
            has_liked: item.has_liked,
            has_retweeted: item.has_retweeted,
            retweeted,
            tweet,
        })
    }

    /// When the tweet was posted.
    pub fn created_at(&self) -> Timestamp {
        match self {
            TweetJson::Typed(t) => t.created_at,
            TweetJson::Spliced { tweet, .. } => tweet.created_at,
        }
    }

    /// The tweet's `created_at` as its JSON string's text, when the tweet is spliced from the
    /// cache: its members hold it formatted (`"id":17,"created_at":"…"` lead them), so a newsfeed
    /// item, whose time is its tweet's, copies it instead of formatting it again (chrono's
    /// formatting was 4 % of a warm newsfeed page; callgrind).
    pub fn created_at_text(&self) -> Option<&str> {
        let TweetJson::Spliced { tweet, .. } = self else {
            return None;
        };
        // Found by position, then checked: searching the text for `,` and `"` cost about 350
        // instructions per item, 3 % of a warm newsfeed page (callgrind). The id (positive)
        // fixes where its comma is, and the format (`time::format`) the text's length.
        const LEAD: &[u8] = b",\"created_at\":\"";
        const TEXT: usize = "2026-11-21T09:16:11.005227Z".len();
        let members = tweet.members.as_bytes();
        let comma = "\"id\":".len() + tweet.id.checked_ilog10()? as usize + 1;
        let (start, end) = (comma + LEAD.len(), comma + LEAD.len() + TEXT);
        if !members.starts_with(b"\"id\":")
            || members.get(comma..start)? != LEAD
            || members.get(end) != Some(&b'"')
        {
            return None;
        }
        tweet.members.get(start..end)
    }

    /// Appends the JSON object to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        match self {
            // Serialising a `Tweet` into memory can not fail.
            TweetJson::Typed(t) => {
                let _ = serde_json::to_writer(&mut *out, t);
            }
            TweetJson::Spliced {
                user,
                mentions,
                counts,
                has_liked,
                has_retweeted,
                retweeted,
                tweet,
            } => {
                out.extend_from_slice(b"{\"user\":");
                user.write(out);
                out.extend_from_slice(b",\"comments_count\":");
                out.extend_from_slice(itoa::Buffer::new().format(counts.comments).as_bytes());
                out.extend_from_slice(b",\"likes_count\":");
                out.extend_from_slice(itoa::Buffer::new().format(counts.likes).as_bytes());
                out.extend_from_slice(b",\"replies_count\":");
                out.extend_from_slice(itoa::Buffer::new().format(counts.replies).as_bytes());
                out.extend_from_slice(if *has_liked {
                    b",\"has_liked\":true,"
                } else {
                    b",\"has_liked\":false,"
                });
                out.extend_from_slice(b"\"retweets_count\":");
                out.extend_from_slice(itoa::Buffer::new().format(counts.retweets).as_bytes());
                out.extend_from_slice(if *has_retweeted {
                    b",\"has_retweeted\":true,\"retweeted_tweet\":"
                } else {
                    b",\"has_retweeted\":false,\"retweeted_tweet\":"
                });
                match retweeted {
                    Some(original) => original.write(out),
                    None => out.extend_from_slice(b"null"),
                }
                out.extend_from_slice(b",\"mentions\":[");
                for (i, mentioned) in mentions.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    mentioned.write(out);
                }
                out.extend_from_slice(b"],");
                out.extend_from_slice(tweet.members.as_bytes());
                out.push(b'}');
            }
        }
    }
}

impl Serialize for TweetJson {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            TweetJson::Typed(t) => t.serialize(s),
            TweetJson::Spliced { .. } => {
                let mut out = Vec::new();
                self.write(&mut out);
                let json = String::from_utf8(out).map_err(serde::ser::Error::custom)?;
                RawValue::from_string(json)
                    .map_err(serde::ser::Error::custom)?
                    .serialize(s)
            }
        }
    }
}

/// The `returning` clause that reads a tweet row with its counts after changing them.
#[macro_export]
macro_rules! returning_tweet_row {
    () => {
        " returning id, user_id, content, created_at, circle_id, photo_urls, coordinates, place,
                    edited_at, edit_version, in_reply_to_tweet_id, in_reply_to_user_id,
                retweeted_tweet_id, mentioned_user_ids, likes_count, comments_count, replies_count, retweets_count,
                counts_version"
    };
}

mod create;
mod delete;
mod edit;
pub use create::{INSERT, PREDECESSORS, create};
pub use delete::{delete, delete_retweet};
pub use edit::{TweetVersion, edit, history};

/// A tweet row with its counters, as read from Postgres.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TweetRow {
    #[sqlx(flatten)]
    pub record: TweetRecord,
    #[sqlx(flatten)]
    pub counts: TweetCounts,
}

impl TweetRow {
    /// The write-through cache updates for these counts: the tweet's counts, and its score in
    /// its circle's rank if it was posted into one.
    pub fn counts_updates(&self) -> Vec<Update> {
        let mut updates = vec![Update::TweetCounts {
            id: self.record.id,
            counts: self.counts,
        }];
        updates.extend(circles::score_update(&self.record, &self.counts));
        updates
    }
}

/// A tweet's count of the tweets that link to it: its direct replies ([`crate::replies`]) or
/// its retweets ([`crate::retweets`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Linked {
    Replies,
    Retweets,
}

/// Moves tweet `id`'s `linked` count by `by` (with its `counts_version`, so the cached counts
/// take it: exact like `likes_count`), in the caller's transaction; its row after, or `None`
/// if there is no such tweet (any more).
///
/// # Errors
/// Postgres failed.
pub async fn shift_linked(
    tx: &mut PgConnection,
    linked: Linked,
    id: i64,
    by: i64,
) -> sqlx::Result<Option<TweetRow>> {
    let sql = match linked {
        Linked::Replies => concat!(
            "update tweets set replies_count = replies_count + $2,
                               counts_version = counts_version + 1 where id = $1",
            crate::returning_tweet_row!()
        ),
        Linked::Retweets => concat!(
            "update tweets set retweets_count = retweets_count + $2,
                               counts_version = counts_version + 1 where id = $1",
            crate::returning_tweet_row!()
        ),
    };
    sqlx::query_as(sql)
        .bind(id)
        .bind(by)
        .fetch_optional(tx)
        .await
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

/// Moves a user's `tweets_count` by `by`, returning the new counts for the cache.
async fn shift_tweets_count(
    tx: &mut PgConnection,
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

/// The list entry `id` (a newsfeed row, or the tweet itself) of `tweet`: its member holds the
/// sub-second part of the tweet's time.
fn entry_of(id: i64, tweet_id: i64, tweet: &TweetRecord) -> ListEntry {
    ListEntry {
        id,
        tweet_id,
        author_id: tweet.user_id,
        created_at: tweet.created_at,
        shift: 0,
    }
}

/// Tweets with their counts by id (any order; unknown ids are absent).
pub async fn rows_by_ids(db: &PgPool, ids: &[i64]) -> sqlx::Result<Vec<TweetRow>> {
    sqlx::query_as(
        "select id, user_id, content, created_at, circle_id, photo_urls, coordinates, place,
                edited_at, edit_version, in_reply_to_tweet_id, in_reply_to_user_id,
                retweeted_tweet_id, mentioned_user_ids, likes_count, comments_count, replies_count, retweets_count,
                counts_version
         from tweets where id = any($1)",
    )
    .bind(ids)
    .fetch_all(db)
    .await
}

/// The SQL of a user's tweets (`$1`) for the cache, newest `$3` first below `$2` (if not
/// null), with `$filter` (`""`, or
/// `" and pulled"` for the pulled ones, a literal so the partial index serves it).
macro_rules! user_tweet_entries {
    ($filter:literal) => {
        concat!(
            "select id, id as tweet_id, user_id as author_id, created_at from tweets
             where user_id = $1",
            $filter,
            " and created_at < coalesce($2, 'infinity') order by created_at desc limit $3"
        )
    };
}

/// The SQL of a hydrated page of a user's tweets (`$1`) strictly between the cursors (`$2`,
/// `$3`), `$4` at most, with `$filter` as in [`user_tweet_entries`].
macro_rules! user_tweet_page {
    ($filter:literal) => {
        concat!(
            "select t.id as entry_id, t.created_at,",
            crate::feed_row_columns!(),
            "from tweets t join users u on u.id = t.user_id
             where t.user_id = $1",
            $filter,
            " and t.created_at < coalesce($2, 'infinity') and t.created_at > coalesce($3, '-infinity')
             order by t.created_at desc limit $4"
        )
    };
}

/// The newest `limit` entries of user `user_id`'s tweets older than `lt` (if given), for
/// filling the cache.
pub async fn timeline_entries(
    db: &PgPool,
    user_id: i64,
    lt: Option<Timestamp>,
    limit: usize,
) -> sqlx::Result<Vec<ListEntry>> {
    let sql = user_tweet_entries!("");
    crate::timeline::fetch_entries(db, sql, user_id, lt, limit).await
}

/// The newest `limit` pulled tweets of user `user_id` older than `lt` (if given), to fill the
/// cache (see [`crate::hybrid`]).
pub async fn pulled_entries(
    db: &PgPool,
    user_id: i64,
    lt: Option<Timestamp>,
    limit: usize,
) -> sqlx::Result<Vec<ListEntry>> {
    let sql = user_tweet_entries!(" and pulled");
    crate::timeline::fetch_entries(db, sql, user_id, lt, limit).await
}

/// A page of user `user_id`'s pulled tweets strictly between the cursors, hydrated in the
/// same query (past the cached window of [`crate::timeline::Timeline::Pulled`]).
pub async fn pulled_page(
    db: &PgPool,
    user_id: i64,
    lt: Option<Timestamp>,
    gt: Option<Timestamp>,
    limit: usize,
) -> sqlx::Result<Vec<FeedRow>> {
    let sql = user_tweet_page!(" and t.pulled");
    crate::timeline::fetch_page(db, sql, user_id, lt, gt, limit).await
}

/// A page of user `user_id`'s tweets strictly between the cursors, hydrated in the same query.
pub async fn timeline_page(
    db: &PgPool,
    user_id: i64,
    lt: Option<Timestamp>,
    gt: Option<Timestamp>,
    limit: usize,
) -> sqlx::Result<Vec<FeedRow>> {
    let sql = user_tweet_page!("");
    crate::timeline::fetch_page(db, sql, user_id, lt, gt, limit).await
}

/// Tweet `id`, its counts and its author, from the caches where possible.
pub async fn load(
    db: &PgPool,
    cache: &Cache,
    id: i64,
) -> sqlx::Result<Option<(TweetRecord, TweetCounts, UserRecord)>> {
    load_version(db, cache, id, 0).await
}

/// [`load`], of edit version `min_version` or later: a cached object of an older text (an
/// edit committed and its cache step has not run yet) is read from Postgres instead.
pub async fn load_version(
    db: &PgPool,
    cache: &Cache,
    id: i64,
    min_version: i64,
) -> sqlx::Result<Option<(TweetRecord, TweetCounts, UserRecord)>> {
    let (tweet, counts) = match cache.get_tweets(&[id]).await {
        Ok((mut t, mut c)) => (t.pop().unwrap_or(Cached::Miss), c.pop().flatten()),
        Err(_) => (Cached::Miss, None),
    };
    let cached = match (tweet, counts) {
        (Cached::Deleted, _) => return Ok(None),
        (Cached::Hit(t), Some(c)) => t
            .record()
            .filter(|t| t.edit_version >= min_version)
            .map(|t| (t, c)),
        _ => None,
    };
    let (record, counts) = match cached {
        Some(found) => found,
        _ => match rows_by_ids(db, &[id]).await?.pop() {
            // No tombstone for a missing id: it may be one that is not assigned yet.
            None => return Ok(None),
            Some(row) => {
                cache
                    .put_tweets(&[(row.record.clone(), row.counts)], &[])
                    .await;
                (row.record, row.counts)
            }
        },
    };
    let author = users::load_many(db, cache, &[record.user_id])
        .await?
        .remove(&record.user_id);
    Ok(author.map(|a| (record, counts, a)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spliced_tweet_gives_its_created_at_as_formatted_text() {
        for (id, micros) in [
            (17, 1_763_900_000_123_456),
            (i64::MAX, 1_763_900_000_000_000),
        ] {
            let created_at = crate::time::from_micros(micros);
            let record = TweetRecord {
                id,
                user_id: 42,
                content: "a, \"quoted\" tweet".to_owned(),
                created_at,
                circle_id: None,
                photo_urls: Vec::new(),
                coordinates: None,
                place: None,
                edited_at: None,
                edit_version: 0,
                in_reply_to_tweet_id: None,
                in_reply_to_user_id: None,
                retweeted_tweet_id: None,
                mentioned_user_ids: Vec::new(),
            };
            let spliced = TweetJson::Spliced {
                user: UserJson::Json("{}".to_owned()),
                mentions: Box::new([]),
                counts: TweetCounts::default(),
                has_liked: false,
                has_retweeted: false,
                retweeted: None,
                tweet: CachedTweet::of(&record),
            };
            let text = crate::time::format(&created_at);
            assert_eq!(spliced.created_at_text(), Some(text.as_str()), "{id}");
        }
    }
}
