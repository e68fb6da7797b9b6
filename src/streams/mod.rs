//! Streaming: live tweets pushed to clients (Redis in Action ch. 8's streaming API; Twitter's
//! v1.1 `statuses/filter`, `statuses/sample` and user streams).
//!
//! **Delivery.** A write publishes, after its commit, one message on the Redis pub/sub topic
//! `{p}:{bus}:streams` ([`publish_created`], [`publish_arrivals`], [`publish_deleted`]). Every
//! process holds one subscription to it ([`Hub`]) and hands each message to its own clients,
//! each through a bounded queue: a client that lets [`crate::config::Config::stream_buffer`]
//! events pile up is marked FALLING_BEHIND and dropped from the hub, so a slow reader costs
//! bounded memory and never slows the others. When the subscription breaks (Redis down), every
//! stream ends with an `unavailable` error event; clients reconnect and resume.
//!
//! **Resume (`streaming/user`).** The writers of one newsfeed take turns on its head row
//! ([`crate::newsfeeds::stamp`]): each takes the lock, stamps its rows' entry times above
//! every earlier one, inserts them and commits before the next one can. So the rows of one
//! newsfeed commit in the order of their entry times, Postgres's order: once a row is visible,
//! every row before it has committed. A [`Cursor`] is a *base* entry time (every row up to it
//! was delivered, or predates the stream) and the rows delivered above it (pub/sub can bring
//! them out of order). No process's clock is in it. A live stream *settles* its cursor from
//! Postgres every heartbeat and whenever [`RECENT_MAX`] rows wait above its base: it reads the
//! rows after its base ([`catch_up_page`]), sends any it lacks (a publish that never came, a
//! follow's backfill) and moves its base to the last row read, so its memory and its token stay
//! bounded however fast rows arrive. A resuming stream subscribes first, then reads the missed
//! rows the same way, and skips live events it has sent already: no gap, nothing twice at the
//! seam, whatever the processes' clocks say. (Tweets that large accounts' followers pull,
//! [`crate::hybrid`], are not newsfeed rows and are not streamed.)
mod filter;
mod hub;
mod resume;

pub use filter::{Filter, Predicates, words};
pub use hub::{Client, Ended, Event, Hub, HubStats, Registration};
pub use resume::{CATCH_UP_PAGE, CaughtUp, Cursor, Token, catch_up_page, legacy_catch_up};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::cache::Cache;
use crate::model::TweetRecord;
use crate::time::{self, Timestamp};
use crate::tweets::Tweet;

/// The pub/sub topic of stream events.
pub const TOPIC: &str = "streams";

/// Most delivered rows a `streaming/user` cursor holds above its base: reaching it settles the
/// cursor from Postgres ([`Cursor::full`]), and a token lists at most this many ids.
pub const RECENT_MAX: usize = 256;

/// Most readers named in one delete message.
const READERS_PER_MESSAGE: usize = 5000;

/// What the public predicates look at, as published.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct About {
    pub tweet_id: i64,
    pub user_id: i64,
    pub text: String,
    /// The tweet's `edit_version` (a late arrival of an older text is replaced by the edit
    /// the hub saw, see [`Hub`]).
    #[serde(default)]
    pub version: i64,
    /// `[lon, lat]`.
    pub coordinates: Option<[f64; 2]>,
    /// The place's `[sw_lon, sw_lat, ne_lon, ne_lat]`.
    pub bbox: Option<[f64; 4]>,
}

impl About {
    fn of(record: &TweetRecord) -> Self {
        About {
            tweet_id: record.id,
            user_id: record.user_id,
            text: record.content.clone(),
            version: record.edit_version,
            coordinates: record
                .coordinates
                .as_deref()
                .and_then(|c| <[f64; 2]>::try_from(c).ok()),
            bbox: record.place.as_ref().map(|p| p.bbox),
        }
    }
}

/// One message on [`TOPIC`].
#[derive(Debug, Serialize, Deserialize)]
struct Wire {
    about: About,
    /// The Tweet object of a new tweet or an arrival; `None` for a delete.
    #[serde(default)]
    tweet: Option<Box<RawValue>>,
    /// A new tweet (for `statuses/*`), not only an arrival in some newsfeeds.
    #[serde(default)]
    public: bool,
    /// Arrivals: `(reader, newsfeed row id, entry time µs)`.
    #[serde(default)]
    rows: Vec<(i64, i64, i64)>,
    /// Deletes and edits: the readers whose newsfeed had the tweet.
    #[serde(default)]
    readers: Vec<i64>,
    /// An edit: the text it replaced (`tweet` is the edited Tweet object).
    #[serde(default)]
    edit: Option<String>,
}

/// Publishes a new tweet (after its commit): to `statuses/*` and, as the author's own
/// newsfeed row `own_row` = `(id, entry time)`, to the author's `streaming/user`. Best effort:
/// a failure is logged (live clients then miss it; a settle or a resume finds it in Postgres).
pub async fn publish_created(
    cache: &Cache,
    tweet: &Tweet,
    record: &TweetRecord,
    own_row: (i64, Timestamp),
) {
    let rows = [(record.user_id, own_row.0, time::to_micros(own_row.1))];
    publish(cache, About::of(record), Some(tweet), true, &rows, &[]).await;
}

/// Publishes newsfeed arrivals of a tweet (a fan-out batch, after its commit): `rows` are
/// `(reader, newsfeed row id, entry time)`.
pub async fn publish_arrivals(
    cache: &Cache,
    tweet: &Tweet,
    record: &TweetRecord,
    rows: &[(i64, i64, Timestamp)],
) {
    let rows: Vec<(i64, i64, i64)> = rows
        .iter()
        .map(|(r, id, at)| (*r, *id, time::to_micros(*at)))
        .collect();
    publish(cache, About::of(record), Some(tweet), false, &rows, &[]).await;
}

/// Publishes a delete (after its commit) to `statuses/*` and to the `streaming/user` of each of
/// `readers` (whose newsfeed had the tweet), in messages of at most 5,000 readers.
pub async fn publish_deleted(cache: &Cache, record: &TweetRecord, readers: &[i64]) {
    publish_to_readers(cache, About::of(record), None, readers, None).await;
}

/// Publishes an edit (after its commit): `{"event": "edit", "tweet": Tweet}` to `statuses/*`
/// clients whose filter keeps the tweet's new or its `old_text`, and to the `streaming/user` of
/// each of `readers` (whose newsfeed has the tweet), in messages of at most 5,000 readers.
pub async fn publish_edited(
    cache: &Cache,
    tweet: &Tweet,
    record: &TweetRecord,
    old_text: &str,
    readers: &[i64],
) {
    let edit = Some(old_text.to_owned());
    publish_to_readers(cache, About::of(record), Some(tweet), readers, edit).await;
}

/// A delete's or an edit's messages: `readers` in chunks of [`READERS_PER_MESSAGE`] (one empty
/// chunk if there are none); only the first message goes to the public streams.
async fn publish_to_readers(
    cache: &Cache,
    about: About,
    tweet: Option<&Tweet>,
    readers: &[i64],
    edit: Option<String>,
) {
    let mut chunks: Vec<&[i64]> = readers.chunks(READERS_PER_MESSAGE).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    for (i, chunk) in chunks.into_iter().enumerate() {
        let (about, edit) = (about.clone(), edit.clone());
        send(cache, about, tweet, i == 0, &[], chunk, edit).await;
    }
}

async fn publish(
    cache: &Cache,
    about: About,
    tweet: Option<&Tweet>,
    public: bool,
    rows: &[(i64, i64, i64)],
    readers: &[i64],
) {
    send(cache, about, tweet, public, rows, readers, None).await;
}

async fn send(
    cache: &Cache,
    about: About,
    tweet: Option<&Tweet>,
    public: bool,
    rows: &[(i64, i64, i64)],
    readers: &[i64],
    edit: Option<String>,
) {
    if !cache.enabled() {
        return;
    }
    let tweet = match tweet.map(serde_json::value::to_raw_value).transpose() {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "serializing a stream event");
            return;
        }
    };
    let wire = Wire {
        about,
        tweet,
        public,
        rows: rows.to_vec(),
        readers: readers.to_vec(),
        edit,
    };
    let Ok(text) = serde_json::to_string(&wire) else {
        return;
    };
    if cache.publish(TOPIC, &text).await.is_err() {
        tracing::warn!(
            tweet_id = wire.about.tweet_id,
            "publishing a stream event failed; live streams miss it"
        );
    }
}
