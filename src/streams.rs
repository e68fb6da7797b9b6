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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sqlx::PgPool;
use tokio::sync::{Notify, mpsc};

use crate::cache::Cache;
use crate::cache::pubsub::Subscriber;
use crate::model::TweetRecord;
use crate::newsfeeds;
use crate::time::{self, Timestamp};
use crate::timeline::{self, ListEntry};
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
    /// Deletes: the readers whose newsfeed had the tweet.
    #[serde(default)]
    readers: Vec<i64>,
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
    let about = About::of(record);
    let mut chunks: Vec<&[i64]> = readers.chunks(READERS_PER_MESSAGE).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    for (i, chunk) in chunks.into_iter().enumerate() {
        // Only the first message goes to the public streams.
        publish(cache, about.clone(), None, i == 0, &[], chunk).await;
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

/// What a public stream keeps: a deterministic sample, or predicates OR-ed together.
#[derive(Debug, Clone)]
pub enum Filter {
    /// `statuses/sample`: tweet ids whose `id mod 100` falls in `percent` residues starting
    /// at `offset` (derived from the caller, so a caller always gets the same sample).
    Sample { percent: u8, offset: u8 },
    /// `statuses/filter`.
    Match(Predicates),
}

/// The predicates of `statuses/filter`: a tweet matches when ANY one does.
#[derive(Debug, Clone, Default)]
pub struct Predicates {
    /// Phrases as lists of lowercase words: a phrase matches when all its words are words of
    /// the text.
    pub track: Vec<Vec<String>>,
    /// Authors.
    pub follow: HashSet<i64>,
    /// Boxes `[sw_lon, sw_lat, ne_lon, ne_lat]` (edges included).
    pub locations: Vec<[f64; 4]>,
}

/// The words of `text` as `track` compares them: split on anything but letters, digits, `_`,
/// `#` and `@`, lowercased.
pub fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '#' || c == '@'))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

impl Filter {
    /// The sample of `caller` at `percent` (1–100).
    pub fn sample(caller: i64, percent: u8) -> Self {
        Filter::Sample {
            percent,
            offset: (caller.wrapping_mul(37).rem_euclid(100)) as u8,
        }
    }

    fn keeps(&self, about: &About, text_words: &mut Option<HashSet<String>>) -> bool {
        match self {
            Filter::Sample { percent, offset } => {
                (about.tweet_id.rem_euclid(100) - i64::from(*offset)).rem_euclid(100)
                    < i64::from(*percent)
            }
            Filter::Match(p) => p.matches(about, text_words),
        }
    }
}

impl Predicates {
    /// Whether `about` matches any predicate; `text_words` caches the text's words across
    /// the clients of one message.
    fn matches(&self, about: &About, text_words: &mut Option<HashSet<String>>) -> bool {
        if self.follow.contains(&about.user_id) {
            return true;
        }
        let located = self.locations.iter().any(|b| {
            let point = about
                .coordinates
                .is_some_and(|[lon, lat]| b[0] <= lon && lon <= b[2] && b[1] <= lat && lat <= b[3]);
            let place = about
                .bbox
                .is_some_and(|p| p[0] <= b[2] && b[0] <= p[2] && p[1] <= b[3] && b[1] <= p[3]);
            point || place
        });
        if located {
            return true;
        }
        if self.track.is_empty() {
            return false;
        }
        let set = text_words.get_or_insert_with(|| words(&about.text).collect());
        self.track
            .iter()
            .any(|phrase| phrase.iter().all(|w| set.contains(w)))
    }
}

/// An event queued for one client. The JSON is shared by every client it goes to.
#[derive(Debug, Clone)]
pub enum Event {
    /// `{"event": "tweet", "tweet": Tweet}`; `row` is `(newsfeed row id, entry time µs)` on
    /// `streaming/user`.
    Tweet {
        tweet_id: i64,
        data: Arc<str>,
        row: Option<(i64, i64)>,
    },
    /// `{"event": "delete", "tweet_id", "user_id"}`.
    Delete { tweet_id: i64, data: Arc<str> },
}

/// Why the hub ended a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The client let its queue fill up.
    FallingBehind,
    /// The process lost its Redis subscription.
    Unavailable,
}

/// One connected client of this process.
#[derive(Debug)]
pub struct Client {
    id: u64,
    user_id: i64,
    /// `None`: `streaming/user` (the caller's newsfeed arrivals and deletes).
    filter: Option<Filter>,
    queue: mpsc::Sender<Event>,
    /// 0 while live, else an [`Ended`] code (1 falling behind, 2 unavailable).
    ended: AtomicU8,
    /// Wakes the stream when `ended` is set.
    pub wake: Notify,
}

impl Client {
    /// Why the hub ended this stream, if it did.
    pub fn ended(&self) -> Option<Ended> {
        match self.ended.load(Ordering::Acquire) {
            1 => Some(Ended::FallingBehind),
            2 => Some(Ended::Unavailable),
            _ => None,
        }
    }

    /// Ends the stream (its session sends the last word and stops).
    pub fn end(&self, why: Ended) {
        let code = match why {
            Ended::FallingBehind => 1,
            Ended::Unavailable => 2,
        };
        if self
            .ended
            .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.wake.notify_one();
        }
    }

    /// Queues `event`; a full queue ends the client (FALLING_BEHIND). Returns whether it was
    /// queued.
    fn offer(&self, event: Event, stats: &HubStats) -> bool {
        if self.ended.load(Ordering::Acquire) != 0 {
            return false;
        }
        match self.queue.try_send(event) {
            Ok(()) => {
                stats.queued.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                stats.fell_behind.fetch_add(1, Ordering::Relaxed);
                self.end(Ended::FallingBehind);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }
}

/// Counters of this process's streams, for `/healthz`.
#[derive(Debug, Default)]
pub struct HubStats {
    /// Events queued for clients.
    pub queued: AtomicU64,
    /// Clients cut off as FALLING_BEHIND.
    pub fell_behind: AtomicU64,
    /// Messages received from the subscription.
    pub messages: AtomicU64,
}

#[derive(Debug, Default)]
struct Clients {
    /// `streaming/user` clients by user.
    users: HashMap<i64, Vec<Arc<Client>>>,
    /// `statuses/*` clients by client id.
    public: HashMap<u64, Arc<Client>>,
}

/// This process's stream clients, fed by its one subscription ([`TOPIC`] on the process's
/// [`Subscriber`]).
#[derive(Debug, Default)]
pub struct Hub {
    clients: Mutex<Clients>,
    next_id: AtomicU64,
    /// Bumped each time the subscription breaks.
    generation: AtomicU64,
    /// Messages on their way to the dispatch task ([`Hub::new`]).
    inbox: std::sync::OnceLock<mpsc::Sender<String>>,
    pub stats: HubStats,
}

/// Stream messages waiting for the dispatch task, at most: past this the process cannot keep
/// up, and every stream ends (its clients resume from Postgres) rather than the subscription
/// waiting, which would delay the near caches' evictions behind it.
const INBOX: usize = 8192;

/// A client's place in the hub; dropping it removes the client.
#[derive(Debug)]
pub struct Registration {
    hub: Arc<Hub>,
    pub client: Arc<Client>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut clients = self.hub.lock();
        match self.client.filter {
            Some(_) => {
                clients.public.remove(&self.client.id);
            }
            None => {
                if let Some(list) = clients.users.get_mut(&self.client.user_id) {
                    list.retain(|c| c.id != self.client.id);
                    if list.is_empty() {
                        clients.users.remove(&self.client.user_id);
                    }
                }
            }
        }
    }
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, Clients> {
        self.clients.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many streams this process serves: `(streaming/user, statuses/*)`.
    pub fn counts(&self) -> (usize, usize) {
        let clients = self.lock();
        (
            clients.users.values().map(Vec::len).sum(),
            clients.public.len(),
        )
    }

    /// How many times the subscription broke (a stream registered across a change may have
    /// missed its end).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// A hub that `subscriber` feeds; a break of the subscription ends every stream.
    ///
    /// Matching a message against every client's filter (up to 400 phrases and 25 boxes each)
    /// runs in a task of its own, fed through a bounded queue: the subscriber task only hands
    /// messages over, so near-cache evictions and heartbeats behind them on the same
    /// subscription never wait for it (review of 2026-11-26, finding 9).
    pub fn new(subscriber: &Subscriber) -> Arc<Self> {
        let hub = Arc::new(Hub::default());
        let (on_message, on_lost) = (Arc::downgrade(&hub), Arc::downgrade(&hub));
        subscriber.route(
            TOPIC,
            move |msg| {
                if let Some(hub) = on_message.upgrade() {
                    hub.hand_over(msg);
                }
            },
            move || {
                if let Some(hub) = on_lost.upgrade() {
                    hub.generation.fetch_add(1, Ordering::AcqRel);
                    hub.end_all(Ended::Unavailable);
                }
            },
        );
        hub
    }

    /// Opens the process's subscription if it is not open yet, then waits up to `wait` for it
    /// to stand. Returns whether it stands.
    pub async fn ensure_subscribed(
        subscriber: &Arc<Subscriber>,
        cache: &Cache,
        stop: &tokio::sync::watch::Receiver<bool>,
        wait: Duration,
    ) -> bool {
        if !subscriber.start(cache, stop) {
            return false;
        }
        let deadline = tokio::time::Instant::now() + wait;
        while !subscriber.subscribed() {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// Adds a client of user `user_id` (`filter` `None`: `streaming/user`) with a queue of
    /// `capacity` events.
    pub fn register(
        self: &Arc<Self>,
        user_id: i64,
        filter: Option<Filter>,
        capacity: usize,
    ) -> (Registration, mpsc::Receiver<Event>) {
        let (queue, rx) = mpsc::channel(capacity.max(1));
        let client = Arc::new(Client {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            user_id,
            filter,
            queue,
            ended: AtomicU8::new(0),
            wake: Notify::new(),
        });
        {
            let mut clients = self.lock();
            match client.filter {
                Some(_) => {
                    clients.public.insert(client.id, client.clone());
                }
                None => clients
                    .users
                    .entry(user_id)
                    .or_default()
                    .push(client.clone()),
            }
        }
        let registration = Registration {
            hub: self.clone(),
            client,
        };
        (registration, rx)
    }

    /// Ends every client (the subscription broke).
    fn end_all(&self, why: Ended) {
        let clients = self.lock();
        for c in clients.users.values().flatten() {
            c.end(why);
        }
        for c in clients.public.values() {
            c.end(why);
        }
    }

    /// Hands one message of the topic to the clients it concerns.
    /// Queues a message for the dispatch task (started by the first message, from the
    /// subscriber task). A full queue ends every stream.
    fn hand_over(self: &Arc<Self>, text: &str) {
        let inbox = self.inbox.get_or_init(|| {
            let (tx, mut rx) = mpsc::channel::<String>(INBOX);
            let hub = Arc::downgrade(self);
            tokio::spawn(async move {
                while let Some(text) = rx.recv().await {
                    let Some(hub) = hub.upgrade() else { return };
                    hub.dispatch(&text);
                }
            });
            tx
        });
        if let Err(mpsc::error::TrySendError::Full(_)) = inbox.try_send(text.to_owned()) {
            tracing::warn!("stream dispatch fell {INBOX} messages behind; ending every stream");
            self.generation.fetch_add(1, Ordering::AcqRel);
            self.end_all(Ended::Unavailable);
        }
    }

    fn dispatch(&self, text: &str) {
        self.stats.messages.fetch_add(1, Ordering::Relaxed);
        let wire: Wire = match serde_json::from_str(text) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "unreadable stream message");
                return;
            }
        };
        let data: Arc<str> = match &wire.tweet {
            Some(tweet) => format!(r#"{{"event":"tweet","tweet":{}}}"#, tweet.get()).into(),
            None => format!(
                r#"{{"event":"delete","tweet_id":{},"user_id":{}}}"#,
                wire.about.tweet_id, wire.about.user_id
            )
            .into(),
        };
        let is_delete = wire.tweet.is_none();
        let clients = self.lock();
        if wire.public {
            let mut text_words = None;
            for c in clients.public.values() {
                let keeps = c
                    .filter
                    .as_ref()
                    .is_some_and(|f| f.keeps(&wire.about, &mut text_words));
                if keeps {
                    let event = if is_delete {
                        Event::Delete {
                            tweet_id: wire.about.tweet_id,
                            data: data.clone(),
                        }
                    } else {
                        Event::Tweet {
                            tweet_id: wire.about.tweet_id,
                            data: data.clone(),
                            row: None,
                        }
                    };
                    c.offer(event, &self.stats);
                }
            }
        }
        for (reader, id, at) in &wire.rows {
            for c in clients.users.get(reader).into_iter().flatten() {
                let event = Event::Tweet {
                    tweet_id: wire.about.tweet_id,
                    data: data.clone(),
                    row: Some((*id, *at)),
                };
                c.offer(event, &self.stats);
            }
        }
        for reader in &wire.readers {
            for c in clients.users.get(reader).into_iter().flatten() {
                let event = Event::Delete {
                    tweet_id: wire.about.tweet_id,
                    data: data.clone(),
                };
                c.offer(event, &self.stats);
            }
        }
    }
}

/// A `streaming/user` client's position in its newsfeed; its text form is the opaque resume
/// token (`Last-Event-ID`). See the module docs. Rows are placed by their entry times, which
/// their writers assign under the newsfeed's head lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// A row at the base (its id anchors the token's ids).
    base: i64,
    /// Every row of the newsfeed with an entry time (`created_at`, µs) up to this was
    /// delivered (or predates the stream): a catch-up reads the rows after it.
    base_at_us: i64,
    /// The newest entry time delivered (µs), or the base's: how old a token is.
    newest_us: i64,
    /// Rows delivered above the base: id → entry time (µs; [`UNKNOWN`] for those a token
    /// listed). At most [`RECENT_MAX`]: a full cursor settles before it takes another.
    delivered: BTreeMap<i64, i64>,
}

/// The entry time of a row a token listed (the token does not carry it): such a row stays
/// listed until its resume's catch-up has read the whole newsfeed.
const UNKNOWN: i64 = i64::MAX;

/// What a `Last-Event-ID` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    /// A token of this version: [`Cursor::token`].
    Current(Cursor),
    /// A token made before the cursor followed Postgres's order (`{base}.{floor µs}.{span}.{id
    /// − base}…`): rows up to `base`, rows that arrived (by a process's clock) before
    /// `floor_us` and `skip` were delivered. Read once, at the resume ([`legacy_catch_up`]).
    Legacy {
        base: i64,
        floor_us: i64,
        skip: Vec<i64>,
    },
}

impl Token {
    /// Parses a token made by [`Cursor::token`] (or by an earlier version); `None` if malformed.
    pub fn parse(token: &str) -> Option<Self> {
        let token = token.trim();
        if let Some(rest) = token.strip_prefix('n') {
            return Cursor::parse(rest).map(Token::Current);
        }
        let mut parts = token.split('.');
        let base: i64 = parts.next()?.parse().ok()?;
        let floor_us: i64 = parts.next()?.parse().ok()?;
        let span: i64 = parts.next()?.parse().ok()?;
        if base < 0 || span < 0 {
            return None;
        }
        let skip = deltas(base, parts)?;
        if skip.iter().any(|id| *id <= base) {
            return None;
        }
        Some(Token::Legacy {
            base,
            floor_us,
            skip,
        })
    }

    /// When it was made, near enough (µs): the newest entry it had delivered (a legacy token:
    /// its floor). A stream resumes from at most 30 days back.
    pub fn made_us(&self) -> i64 {
        match self {
            Token::Current(c) => c.newest_us,
            Token::Legacy { floor_us, .. } => *floor_us,
        }
    }
}

/// Ids written as `.{id − base}` (not 0) after a token's head; `None` if malformed or more
/// than [`RECENT_MAX`].
fn deltas<'a>(base: i64, parts: impl Iterator<Item = &'a str>) -> Option<Vec<i64>> {
    let mut ids = Vec::new();
    for p in parts.filter(|p| !p.is_empty()) {
        let delta: i64 = p.parse().ok()?;
        if delta == 0 || ids.len() >= RECENT_MAX {
            return None;
        }
        ids.push(base.checked_add(delta)?);
    }
    Some(ids)
}

impl Cursor {
    /// A cursor after the row `base` whose entry time is `base_at` (µs): a new stream starts
    /// after the newsfeed's newest row ([`crate::newsfeeds::newest_row`]; `(0, 0)` when it has
    /// none), a `since=T` resume after the newest row at or before T (`base_at` = T).
    pub fn after(base: i64, base_at_us: i64) -> Self {
        Cursor {
            base: base.max(0),
            base_at_us,
            newest_us: base_at_us,
            delivered: BTreeMap::new(),
        }
    }

    /// Parses what follows the token's `n`: `{base}.{base_at µs}.{newest − base_at µs}.{id −
    /// base}…`.
    fn parse(token: &str) -> Option<Self> {
        let mut parts = token.split('.');
        let base: i64 = parts.next()?.parse().ok()?;
        let base_at_us: i64 = parts.next()?.parse().ok()?;
        let span: i64 = parts.next()?.parse().ok()?;
        if base < 0 || span < 0 {
            return None;
        }
        let delivered = deltas(base, parts)?
            .into_iter()
            .map(|id| (id, UNKNOWN))
            .collect();
        Some(Cursor {
            base,
            base_at_us,
            newest_us: base_at_us.checked_add(span)?,
            delivered,
        })
    }

    /// The resume token: `n{base}.{base_at µs}.{newest − base_at µs}.{id − base}…`, every
    /// delivered row above the base listed (at most [`RECENT_MAX`]).
    pub fn token(&self) -> String {
        let mut out = format!(
            "n{}.{}.{}",
            self.base,
            self.base_at_us,
            self.newest_us.saturating_sub(self.base_at_us)
        );
        for id in self.delivered.keys() {
            let _ = write!(out, ".{}", id - self.base);
        }
        out
    }

    /// Whether the row `id` with entry time `at_us` was delivered already.
    pub fn seen(&self, id: i64, at_us: i64) -> bool {
        at_us <= self.base_at_us || self.delivered.contains_key(&id)
    }

    /// Records the live delivery of row `id` whose entry time is `at_us`.
    pub fn advance(&mut self, id: i64, at_us: i64) {
        if at_us > self.base_at_us {
            self.delivered.insert(id, at_us);
            self.newest_us = self.newest_us.max(at_us);
        }
    }

    /// Whether [`RECENT_MAX`] rows wait above the base: settle before taking another.
    pub fn full(&self) -> bool {
        self.delivered.len() >= RECENT_MAX
    }

    /// The entry time (µs) a catch-up reads after: the base's.
    pub fn base_at_us(&self) -> i64 {
        self.base_at_us
    }

    /// Every row of the newsfeed up to row `id` (entry time `at_us`) has been delivered: a
    /// catch-up read it, in newsfeed order, after all the rows before it. It becomes the base.
    pub fn settle(&mut self, id: i64, at_us: i64) {
        if at_us <= self.base_at_us {
            return;
        }
        self.base = id;
        self.base_at_us = at_us;
        self.newest_us = self.newest_us.max(at_us);
        self.delivered.retain(|_, at| *at > at_us);
    }

    /// A catch-up read the newsfeed to its end, and no live event came in between: every row
    /// delivered before had committed, so one it did not find again was deleted. The cursor
    /// forgets them all.
    pub fn caught_up(&mut self) {
        self.delivered.clear();
    }
}

/// Rows of a catch-up page.
#[derive(Debug, sqlx::FromRow)]
struct Arrival {
    id: i64,
    tweet_id: i64,
    author_id: i64,
    created_at: Timestamp,
}

/// Most rows one catch-up page reads.
pub const CATCH_UP_PAGE: usize = 100;

/// The next page of user `user_id`'s newsfeed rows after entry time `after_us`, in newsfeed
/// order (see the module docs): a resume's or a settle's catch-up. Rows `seen(id, entry µs)`
/// (delivered already) are not sent but count as read. Rows copied by `chirp import` (no `arrived_at`)
/// are not streamed. Tweets are hydrated through the cache-aside read path (objects from
/// Redis, misses from Postgres); rows of tweets deleted meanwhile are left out. Reads the
/// primary key `(user_id, created_at)`.
///
/// # Errors
/// Postgres failed.
pub async fn catch_up_page(
    db: &PgPool,
    cache: &Cache,
    user_id: i64,
    after_us: i64,
    seen: impl Fn(i64, i64) -> bool,
) -> sqlx::Result<CaughtUp> {
    let rows: Vec<Arrival> = sqlx::query_as(
        "select n.id, n.tweet_id, t.user_id as author_id, n.created_at
         from newsfeeds n join tweets t on t.id = n.tweet_id
         where n.user_id = $1 and n.created_at > $2 and n.arrived_at is not null
         order by n.created_at limit $3",
    )
    .bind(user_id)
    .bind(time::from_micros(after_us))
    .bind(CATCH_UP_PAGE as i64)
    .fetch_all(db)
    .await?;
    let last = rows.last().map(|r| (r.id, time::to_micros(r.created_at)));
    let more = rows.len() == CATCH_UP_PAGE;
    let unseen = rows
        .into_iter()
        .filter(|r| !seen(r.id, time::to_micros(r.created_at)))
        .collect();
    Ok(CaughtUp {
        tweets: hydrate(db, cache, user_id, unseen).await?,
        last,
        more,
    })
}

/// A page of [`catch_up_page`].
#[derive(Debug)]
pub struct CaughtUp {
    /// The tweets to send, each with its `(newsfeed row id, entry µs)`.
    pub tweets: Vec<(Tweet, i64, i64)>,
    /// The last row read, `(id, entry µs)`; `None`: nothing was left to read.
    pub last: Option<(i64, i64)>,
    /// The page was full: more rows may follow.
    pub more: bool,
}

/// The next page of the rows a token of the earlier version ([`Token::Legacy`]) missed: rows
/// after `base` that arrived after `floor_us` and are not in `skip`, after `after` (the
/// `(arrived_at µs, id)` of the previous page's last row), in arrival order. Read once, when
/// such a stream resumes; the second value is where the next page starts (`None`: the last).
///
/// # Errors
/// Postgres failed.
pub async fn legacy_catch_up(
    db: &PgPool,
    cache: &Cache,
    user_id: i64,
    (base, floor_us, skip): (i64, i64, &[i64]),
    after: Option<(i64, i64)>,
) -> sqlx::Result<(Vec<(Tweet, i64, i64)>, Option<(i64, i64)>)> {
    let (after_at, after_id) = after.unwrap_or((floor_us, 0));
    let rows: Vec<(i64, i64, i64, Timestamp, Timestamp)> = sqlx::query_as(
        "select n.id, n.tweet_id, t.user_id, n.created_at, n.arrived_at
         from newsfeeds n join tweets t on t.id = n.tweet_id
         where n.user_id = $1 and n.arrived_at > $2 and n.id > $3 and n.id <> all($4)
           and (n.arrived_at, n.id) > ($5, $6)
         order by n.arrived_at, n.id limit $7",
    )
    .bind(user_id)
    .bind(time::from_micros(floor_us))
    .bind(base)
    .bind(skip)
    .bind(time::from_micros(after_at))
    .bind(after_id)
    .bind(CATCH_UP_PAGE as i64)
    .fetch_all(db)
    .await?;
    let next = (rows.len() == CATCH_UP_PAGE)
        .then(|| rows.last().map(|r| (time::to_micros(r.4), r.0)))
        .flatten();
    let rows = rows
        .into_iter()
        .map(|(id, tweet_id, author_id, created_at, _)| Arrival {
            id,
            tweet_id,
            author_id,
            created_at,
        })
        .collect();
    Ok((hydrate(db, cache, user_id, rows).await?, next))
}

/// `rows` as tweets of `user_id`'s newsfeed (in their order), each with its `(row id, entry
/// µs)`; deleted tweets are left out.
async fn hydrate(
    db: &PgPool,
    cache: &Cache,
    user_id: i64,
    rows: Vec<Arrival>,
) -> sqlx::Result<Vec<(Tweet, i64, i64)>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let entries: Vec<ListEntry> = rows
        .iter()
        .map(|r| ListEntry {
            id: r.id,
            tweet_id: r.tweet_id,
            author_id: r.author_id,
            created_at: r.created_at,
            shift: 0,
        })
        .collect();
    let order: HashMap<i64, usize> = rows.iter().enumerate().map(|(i, r)| (r.id, i)).collect();
    let items = match timeline::hydrate_entries(db, cache, &entries, Some(user_id)).await? {
        Some(items) => items,
        None => {
            let at: Vec<Timestamp> = rows.iter().map(|r| r.created_at).collect();
            let mut joined = newsfeeds::rows_at(db, user_id, &at).await?;
            joined.sort_by_key(|r| order.get(&r.entry_id).copied().unwrap_or(usize::MAX));
            timeline::with_likes(db, cache, joined, Some(user_id)).await?
        }
    };
    let entry_at: HashMap<i64, i64> = rows
        .iter()
        .map(|r| (r.id, time::to_micros(r.created_at)))
        .collect();
    Ok(items
        .into_iter()
        .filter_map(|item| {
            let at = *entry_at.get(&item.id)?;
            let id = item.id;
            Some((Tweet::from_item(item)?, id, at))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_round_trips_and_lists_the_rows_above_its_base() {
        let mut c = Cursor::after(4, 10_000_000);
        c.advance(7, 10_000_002);
        c.advance(5, 10_000_001);
        c.advance(3, 9_000_000); // at or below the base: seen
        assert!(c.seen(3, 9_000_000));
        let t = c.token();
        assert_eq!(t, "n4.10000000.2.1.3");
        let Some(Token::Current(back)) = Token::parse(&t) else {
            panic!("parses")
        };
        assert!(back.seen(5, 0) && back.seen(7, 0) && !back.seen(6, 10_000_003));
        assert_eq!(back.token(), t);
        assert_eq!(back.newest_us, 10_000_002, "how old it is travels with it");
        for bad in [
            "nx.1.0", "n3.1", "n3.1.-1", "n3.1.0.0", "x.1.0", "3.1", "3.1.0.0",
        ] {
            assert_eq!(Token::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_settle_moves_the_base_and_keeps_what_came_after() {
        let mut c = Cursor::after(0, 0);
        c.advance(12, 2_000);
        c.advance(10, 1_000);
        c.advance(20, 3_000);
        // A settle's page read rows up to 12: 11 (never delivered) was sent by it.
        c.settle(12, 2_000);
        assert!(c.seen(11, 1_500) && c.seen(12, 2_000) && c.seen(20, 3_000));
        assert!(!c.seen(21, 3_500));
        assert_eq!(c.token(), "n12.2000.1000.8");
        // An older row never moves it back.
        c.settle(5, 500);
        assert_eq!(c.token(), "n12.2000.1000.8");
        // A full read found nothing more: 20 was deleted.
        c.caught_up();
        assert_eq!(c.token(), "n12.2000.1000");
    }

    #[test]
    fn a_full_cursor_asks_for_a_settle_and_its_token_still_parses() {
        let mut c = Cursor::after(0, 0);
        for k in 1..=RECENT_MAX as i64 {
            c.advance(2 * k, k);
        }
        assert!(c.full());
        assert!(Token::parse(&c.token()).is_some(), "its token still parses");
        c.settle(2 * RECENT_MAX as i64, RECENT_MAX as i64);
        assert!(!c.full());
    }

    #[test]
    fn a_resumed_tokens_rows_stay_listed_until_its_catch_up_is_over() {
        let Some(Token::Current(mut c)) = Token::parse("n10.1000.600.2.5") else {
            panic!("parses")
        };
        // The catch-up's page reads rows 11 (sent) and 12 (listed: seen, not sent).
        assert!(!c.seen(11, 1_100) && c.seen(12, 1_200));
        c.settle(11, 1_100);
        assert!(c.seen(12, 1_200) && c.seen(15, 1_500), "still listed");
        c.settle(12, 1_200);
        c.caught_up(); // nothing more: 15 was deleted
        assert!(!c.seen(16, 1_600));
    }

    #[test]
    fn an_earlier_token_is_read_as_one() {
        assert_eq!(
            Token::parse("10.1000.5.2.10"),
            Some(Token::Legacy {
                base: 10,
                floor_us: 1000,
                skip: vec![12, 20],
            })
        );
    }

    #[test]
    fn track_compares_whole_words_case_insensitively() {
        let p = Predicates {
            track: vec![vec!["hello".into(), "world".into()], vec!["#rust".into()]],
            ..Predicates::default()
        };
        let about = |text: &str| About {
            tweet_id: 1,
            user_id: 1,
            text: text.into(),
            coordinates: None,
            bbox: None,
        };
        assert!(p.matches(&about("World, HELLO!"), &mut None));
        assert!(p.matches(&about("I like #Rust."), &mut None));
        assert!(!p.matches(&about("hello worlds"), &mut None));
        assert!(!p.matches(&about("rust"), &mut None));
    }

    #[test]
    fn a_box_includes_its_edges_and_overlapping_places() {
        let p = Predicates {
            locations: vec![[-10.0, -10.0, 10.0, 10.0]],
            ..Predicates::default()
        };
        let at = |coordinates, bbox| About {
            tweet_id: 1,
            user_id: 1,
            text: String::new(),
            coordinates,
            bbox,
        };
        assert!(p.matches(&at(Some([10.0, -10.0]), None), &mut None));
        assert!(!p.matches(&at(Some([10.0001, 0.0]), None), &mut None));
        assert!(p.matches(&at(None, Some([10.0, 10.0, 20.0, 20.0])), &mut None));
        assert!(!p.matches(&at(None, Some([10.5, 0.0, 20.0, 20.0])), &mut None));
    }

    #[test]
    fn a_sample_keeps_percent_residues_per_caller() {
        let f = Filter::sample(42, 10);
        let kept = (0..1000)
            .filter(|id| {
                let about = About {
                    tweet_id: *id,
                    user_id: 1,
                    text: String::new(),
                    coordinates: None,
                    bbox: None,
                };
                f.keeps(&about, &mut None)
            })
            .count();
        assert_eq!(kept, 100);
    }
}
