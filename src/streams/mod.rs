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
//! seam, whatever the processes' clocks say.
//!
//! **Pulled tweets.** A large account's tweets have no row per follower ([`crate::hybrid`]);
//! they are newsfeed entries all the same (id: the tweet's negated; time: the tweet's), and
//! rows and pulled tweets commit in one order (the pull clock), so a cursor places both, and a
//! catch-up reads both ([`catch_up_page`]). Live, a pulled tweet is one message marked
//! [`Wire::pulled`]. Each process's hub picks the `streaming/user` clients whose user may
//! follow its author (each client holds the pull sources its user follows, [`PullFollows`],
//! read when it opens and at every heartbeat) and asks Postgres which of them follow it now,
//! in one query per pulled tweet and process, in a task of its own; those get it (an
//! unfollowed author's new tweet is not sent). A follow made while the stream is open reaches
//! it at its next settle, as a follow's backfilled rows do.
mod client;
mod filter;
mod hub;
mod resume;

pub use client::{Client, Ended, PullFollows};
pub use filter::{Filter, Predicates, words};
pub use hub::{Event, Hub, HubStats, Registration};
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
    /// The author of the tweet it replies to (a `follow` predicate of theirs keeps it).
    #[serde(default)]
    pub in_reply_to_user_id: Option<i64>,
    /// A retweet's retweeted tweet's author (a stream of a user who mutes or blocks them
    /// leaves it out, as pages do).
    #[serde(default)]
    pub retweeted_user_id: Option<i64>,
    /// The users the tweet mentions ([`crate::mentions`]; a `follow` predicate of theirs keeps
    /// it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mentioned_user_ids: Vec<i64>,
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
            in_reply_to_user_id: record.in_reply_to_user_id,
            retweeted_user_id: None,
            mentioned_user_ids: record.mentioned_user_ids.clone(),
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
    /// A pulled tweet ([`crate::hybrid`]): its entry time (µs, the tweet's). Its new tweet,
    /// edit and delete go to the `streaming/user` clients that follow its author (besides
    /// `rows` and `readers`: the author's own).
    #[serde(default)]
    pulled: Option<i64>,
}

impl Wire {
    /// The entry time (µs) of the pulled tweet `record`, if `pulled`.
    fn pulled_at(record: &TweetRecord, pulled: bool) -> Option<i64> {
        pulled.then(|| time::to_micros(record.created_at))
    }
}

/// Publishes a new tweet (after its commit): to `statuses/*`, as the author's own newsfeed row
/// `own_row` = `(id, entry time)` to the author's `streaming/user` (a retweet of a tweet the
/// author's newsfeed shows has none), and if it is `pulled`
/// ([`crate::hybrid`]) to the `streaming/user` of its author's followers. Best effort: a
/// failure is logged (live clients then miss it; a settle or a resume finds it in Postgres).
pub async fn publish_created(
    cache: &Cache,
    tweet: &Tweet,
    record: &TweetRecord,
    own_row: Option<(i64, Timestamp)>,
    pulled: bool,
) {
    let rows: Vec<(i64, i64, i64)> = own_row
        .map(|(id, at)| (record.user_id, id, time::to_micros(at)))
        .into_iter()
        .collect();
    let pulled = Wire::pulled_at(record, pulled);
    let message = Message {
        tweet: Some(tweet),
        public: true,
        rows: &rows,
        pulled,
        ..Message::default()
    };
    send(cache, About::of(record), message).await;
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
    let message = Message {
        tweet: Some(tweet),
        rows: &rows,
        ..Message::default()
    };
    send(cache, About::of(record), message).await;
}

/// Publishes a delete (after its commit) to `statuses/*`, to the `streaming/user` of each of
/// `readers` (whose newsfeed had the tweet), in messages of at most 5,000 readers, and if the
/// tweet was `pulled` to those of its author's followers.
pub async fn publish_deleted(cache: &Cache, record: &TweetRecord, readers: &[i64], pulled: bool) {
    let pulled = Wire::pulled_at(record, pulled);
    publish_to_readers(cache, About::of(record), None, readers, (None, pulled)).await;
}

/// Publishes an edit (after its commit): `{"event": "edit", "tweet": Tweet}` to `statuses/*`
/// clients whose filter keeps the tweet's new or its `old_text`, to the `streaming/user` of
/// each of `readers` (whose newsfeed has the tweet), in messages of at most 5,000 readers, and
/// if the tweet is `pulled` to those of its author's followers.
pub async fn publish_edited(
    cache: &Cache,
    tweet: &Tweet,
    record: &TweetRecord,
    (old_text, readers): (&str, &[i64]),
    pulled: bool,
) {
    let pulled = Wire::pulled_at(record, pulled);
    let edit = Some(old_text.to_owned());
    publish_to_readers(
        cache,
        About::of(record),
        Some(tweet),
        readers,
        (edit, pulled),
    )
    .await;
}

/// A delete's or an edit's messages: `readers` in chunks of [`READERS_PER_MESSAGE`] (one empty
/// chunk if there are none); only the first message goes to the public streams and to a
/// pulled tweet's followers.
async fn publish_to_readers(
    cache: &Cache,
    about: About,
    tweet: Option<&Tweet>,
    readers: &[i64],
    (edit, pulled): (Option<String>, Option<i64>),
) {
    let mut chunks: Vec<&[i64]> = readers.chunks(READERS_PER_MESSAGE).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    for (i, chunk) in chunks.into_iter().enumerate() {
        let message = Message {
            tweet,
            public: i == 0,
            readers: chunk,
            edit: edit.clone(),
            pulled: pulled.filter(|_| i == 0),
            ..Message::default()
        };
        send(cache, about.clone(), message).await;
    }
}

/// What one [`Wire`] message carries besides its [`About`].
#[derive(Default)]
struct Message<'a> {
    tweet: Option<&'a Tweet>,
    public: bool,
    rows: &'a [(i64, i64, i64)],
    readers: &'a [i64],
    edit: Option<String>,
    pulled: Option<i64>,
}

async fn send(cache: &Cache, mut about: About, message: Message<'_>) {
    if !cache.enabled() {
        return;
    }
    about.retweeted_user_id = (message.tweet)
        .and_then(|t| t.retweeted_tweet.as_ref())
        .map(|o| o.user.id);
    let tweet = match message
        .tweet
        .map(serde_json::value::to_raw_value)
        .transpose()
    {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "serializing a stream event");
            return;
        }
    };
    let wire = Wire {
        about,
        tweet,
        public: message.public,
        rows: message.rows.to_vec(),
        readers: message.readers.to_vec(),
        edit: message.edit,
        pulled: message.pulled,
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
