//! Plain data shared by the cache and the features: the tweet and user objects as stored and
//! cached, and their versioned counts. This module imports nothing of chirp but `time`, so the
//! cache (a leaf) and every feature can use it.

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// A tweet as stored and cached ([`crate::cache::objects::CachedTweet`]). Its text changes only
/// by an edit, which bumps `edit_version` (the cached object's version); once deleted, its
/// cache key holds a tombstone.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, Serialize, Deserialize)]
pub struct TweetRecord {
    pub id: i64,
    pub user_id: i64,
    pub content: String,
    pub created_at: Timestamp,
    /// The circle the tweet was posted into, if any (absent in objects cached before circles).
    #[sqlx(default)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circle_id: Option<i64>,
    /// URLs of the tweet's photos, in upload order (absent in objects cached before photos).
    #[sqlx(default)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub photo_urls: Vec<String>,
    /// Exact location `[lon, lat]` in degrees (WGS 84), if the tweet has one.
    #[sqlx(default)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinates: Option<Vec<f64>>,
    /// The place the tweet was posted from, if any.
    #[sqlx(default)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub place: Option<sqlx::types::Json<Place>>,
    /// When its text was last edited; `None` if never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited_at: Option<Timestamp>,
    /// How many times it was edited (0: as posted): the version of its cached object.
    #[serde(default)]
    pub edit_version: i64,
    /// The tweet this one replies to (it may have been deleted since), if it is a reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to_tweet_id: Option<i64>,
    /// The author of the tweet this one replies to, if it is a reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to_user_id: Option<i64>,
    /// The tweet this one retweets, if it is a retweet ([`crate::retweets`]; its text is
    /// empty). Last among the cached members, so a reader finds it without parsing them.
    #[sqlx(default)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retweeted_tweet_id: Option<i64>,
    /// The users its text mentions (`@username`), resolved when it was posted or last edited,
    /// in order of first mention ([`crate::mentions`]). Not among the cached members (the
    /// public `mentions` are user objects, hydrated at read time): a cached tweet keeps them
    /// beside ([`crate::cache::objects::CachedTweet::mentions`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mentioned_user_ids: Vec<i64>,
}

/// A named place with its bounding box (Twitter v1.1's `place`, its `bounding_box` polygon
/// reduced to the box): `bbox` is `[sw_lon, sw_lat, ne_lon, ne_lat]` in degrees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Place {
    pub full_name: String,
    pub bbox: [f64; 4],
}

/// The columns of a [`UserRecord`] in `users`, as a string literal for `concat!`: the one list
/// every statement that reads a record names, so a new field is added once.
#[macro_export]
macro_rules! user_record_columns {
    () => {
        "id, username, nickname, avatar_url, version, created_at"
    };
}

/// A user as stored and cached: the public fields plus `version`, bumped by every profile edit,
/// so a cached copy is only ever replaced by a newer one.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, Serialize, Deserialize)]
pub struct UserRecord {
    pub id: i64,
    pub username: String,
    pub nickname: Option<String>,
    pub avatar_url: Option<String>,
    pub version: i64,
    pub created_at: Timestamp,
}

/// A tweet's counters with their version (`counts_version`, bumped by every change), as an
/// `update … returning` or a load gives them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct TweetCounts {
    #[sqlx(rename = "likes_count")]
    pub likes: i64,
    #[sqlx(rename = "comments_count")]
    pub comments: i64,
    /// Direct replies ([`crate::replies`]).
    #[sqlx(rename = "replies_count")]
    pub replies: i64,
    /// Live retweets ([`crate::retweets`]).
    #[sqlx(rename = "retweets_count")]
    pub retweets: i64,
    #[sqlx(rename = "counts_version")]
    pub version: i64,
}

/// A user's profile counters with their version (`counts_version`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct UserCounts {
    #[sqlx(rename = "followers_count")]
    pub followers: i64,
    #[sqlx(rename = "followings_count")]
    pub followings: i64,
    #[sqlx(rename = "tweets_count")]
    pub tweets: i64,
    #[sqlx(rename = "counts_version")]
    pub version: i64,
}
