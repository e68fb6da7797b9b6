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
//! **Resume (`streaming/user`).** A newsfeed row's `id` is its arrival order (an identity,
//! assigned when the fan-out inserts it), so a fan-out that lands late (after newer tweets)
//! comes later in that order than the rows already delivered. The resume token ([`Cursor`]) is a
//! *base* id (every row up to it was delivered, or predates the stream), the ids delivered
//! above it within the last [`SETTLE_US`] of arrival time, and the arrival time the catch-up
//! starts from, and the newest arrival delivered. Rows of concurrent fan-outs can commit out of id order, but only within the
//! time a batch takes to commit, far below [`SETTLE_US`]: the base only moves past rows that
//! arrived [`SETTLE_US`] before the newest delivered one, and the recent ids keep the rows
//! above it from being sent twice. A resuming stream subscribes first, then reads the missed
//! rows from Postgres oldest first, and skips live events it has sent already: no gap, nothing
//! twice at the seam.

use std::collections::{HashMap, HashSet, VecDeque};
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

/// How long (µs of arrival time) a fan-out's rows may stay uncommitted and still be resumed
/// exactly: 5 s, the bound chirp keeps for every cache after a crash.
pub const SETTLE_US: i64 = 5_000_000;

/// Most delivered ids a resume token lists above its base. For a feed receiving more than this
/// within [`SETTLE_US`], the token's base moves sooner (a resume may then miss a row that
/// commits later than that many arrivals after its own).
pub const RECENT_MAX: usize = 256;

/// Most delivered ids a live stream remembers within [`SETTLE_US`] (its memory bound, 8,192
/// × 16 bytes); live delivery never drops a late row below this.
pub const RECENT_KEPT: usize = 8192;

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
    /// Arrivals: `(reader, newsfeed row id, arrived_at µs)`.
    #[serde(default)]
    rows: Vec<(i64, i64, i64)>,
    /// Deletes: the readers whose newsfeed had the tweet.
    #[serde(default)]
    readers: Vec<i64>,
}

/// Publishes a new tweet (after its commit): to `statuses/*` and, as the author's own
/// newsfeed row `own_row` (arrived at the tweet's `created_at`), to the author's
/// `streaming/user`. Best effort: a failure is logged (live clients then miss it; a resume
/// finds it in Postgres).
pub async fn publish_created(cache: &Cache, tweet: &Tweet, record: &TweetRecord, own_row: i64) {
    let rows = [(record.user_id, own_row, time::to_micros(record.created_at))];
    publish(cache, About::of(record), Some(tweet), true, &rows, &[]).await;
}

/// Publishes newsfeed arrivals of a tweet (a fan-out batch, after its commit): `rows` are
/// `(reader, newsfeed row id, arrived_at)`.
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
    /// `{"event": "tweet", "tweet": Tweet}`; `row` is `(newsfeed row id, arrived_at µs)` on
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

/// A `streaming/user` client's position in its newsfeed's arrival order; its text form is the
/// opaque resume token (`Last-Event-ID`). See the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// Every row with an id up to this was delivered (or predates the stream).
    base: i64,
    /// Rows to resume have `arrived_at` after this (µs).
    floor_us: i64,
    /// The newest `arrived_at` delivered (µs).
    newest_us: i64,
    /// Ids delivered recently, with their `arrived_at` (µs), in delivery order.
    recent: VecDeque<(i64, i64)>,
    /// The ids of `recent`.
    recent_ids: HashSet<i64>,
}

impl Cursor {
    /// A stream that starts now: what arrives after `now` is new.
    pub fn starting_at(now: Timestamp) -> Self {
        let now = time::to_micros(now);
        Cursor {
            base: 0,
            floor_us: now,
            newest_us: now,
            recent: VecDeque::new(),
            recent_ids: HashSet::new(),
        }
    }

    /// A stream that starts with every entry of the newsfeed after the entry at `since` (a
    /// newsfeed `created_at` the client holds: strictly after it, docs/API.md "Refresh and
    /// resume are exact"). `base` is the newest row id at or before `since`
    /// ([`crate::newsfeeds::last_id_through`]): a newsfeed's rows take ids in the order of their
    /// times, so every later entry has a larger id, and the entry at `since` is not replayed
    /// although it arrived after its own time. The floor lies [`SETTLE_US`] before `since`, so
    /// a row stamped a little after its arrival time is not left out.
    pub fn since(since: Timestamp, base: i64) -> Self {
        let mut cursor = Self::starting_at(since);
        cursor.base = base.max(0);
        cursor.floor_us = cursor.floor_us.saturating_sub(SETTLE_US);
        cursor
    }

    /// Parses a token made by [`Cursor::token`]; `None` if malformed.
    pub fn parse(token: &str) -> Option<Self> {
        let mut parts = token.trim().split('.');
        let base: i64 = parts.next()?.parse().ok()?;
        let floor_us: i64 = parts.next()?.parse().ok()?;
        let span: i64 = parts.next()?.parse().ok()?;
        if base < 0 || span < 0 {
            return None;
        }
        let newest_us = floor_us.checked_add(span)?;
        let mut recent = VecDeque::new();
        for p in parts.filter(|p| !p.is_empty()) {
            let delta: i64 = p.parse().ok()?;
            if delta <= 0 || recent.len() >= RECENT_MAX {
                return None;
            }
            // Their exact arrival is not in the token: the newest is the safe guess (they stay
            // listed longest).
            recent.push_back((base.checked_add(delta)?, newest_us));
        }
        let recent_ids = recent.iter().map(|(i, _)| *i).collect();
        Some(Cursor {
            base,
            floor_us,
            newest_us,
            recent,
            recent_ids,
        })
    }

    /// The resume token: `{base}.{floor µs}.{newest − floor µs}.{id − base}.{id − base}…`,
    /// listing at most the [`RECENT_MAX`] newest deliveries (older ones move its base).
    pub fn token(&self) -> String {
        let older = self.recent.len().saturating_sub(RECENT_MAX);
        let (mut base, mut floor_us) = (self.base, self.floor_us);
        for &(id, at) in self.recent.iter().take(older) {
            if id > base {
                base = id;
                floor_us = floor_us.max(at - SETTLE_US);
            }
        }
        let mut out = format!("{base}.{floor_us}.{}", self.newest_us - floor_us);
        for &(id, _) in self.recent.iter().skip(older) {
            if id > base {
                let _ = write!(out, ".{}", id - base);
            }
        }
        out
    }

    /// Whether the row `id` was delivered already.
    pub fn seen(&self, id: i64) -> bool {
        id <= self.base || self.recent_ids.contains(&id)
    }

    /// Records the delivery of row `id` that arrived at `at_us`. Rows that arrived more than
    /// [`SETTLE_US`] before the newest one (or past [`RECENT_KEPT`]) move the base.
    pub fn advance(&mut self, id: i64, at_us: i64) {
        self.recent.push_back((id, at_us));
        self.recent_ids.insert(id);
        self.newest_us = self.newest_us.max(at_us);
        let mut moved = false;
        while let Some(&(i, at)) = self.recent.front() {
            if at >= self.newest_us - SETTLE_US && self.recent.len() <= RECENT_KEPT {
                break;
            }
            self.recent.pop_front();
            self.recent_ids.remove(&i);
            if i > self.base {
                self.base = i;
                self.floor_us = self.floor_us.max(at - SETTLE_US);
                moved = true;
            }
        }
        if moved {
            let base = self.base;
            self.recent.retain(|(i, _)| *i > base);
            self.recent_ids.retain(|i| *i > base);
        }
    }

    /// The floor, the base and the ids above it that were delivered (a resume skips them):
    /// where a catch-up starts.
    pub fn resume_point(&self) -> (i64, i64, Vec<i64>) {
        let delivered = self.recent.iter().map(|(i, _)| *i).collect();
        (self.floor_us, self.base, delivered)
    }
}

/// Rows of a catch-up page.
#[derive(Debug, sqlx::FromRow)]
struct Arrival {
    id: i64,
    tweet_id: i64,
    author_id: i64,
    created_at: Timestamp,
    arrived_at: Timestamp,
}

/// Most rows one catch-up page reads.
pub const CATCH_UP_PAGE: usize = 100;

/// The next page of what user `user_id`'s stream missed: newsfeed rows that arrived after the
/// cursor's floor, with an id above its `base` and not among `skip`, after `after` (the
/// `(arrived_at µs, id)` of the previous page's last row), in arrival order, hydrated through
/// the cache-aside read path (tweet and user objects from Redis, misses from Postgres). Each
/// item comes with its `(newsfeed row id, arrived_at µs)`. Rows of tweets deleted meanwhile are
/// left out. The second value is where the next page starts (`None`: this was the last page).
/// Pages walk the `(user_id, arrived_at)` index.
///
/// # Errors
/// Postgres failed.
pub async fn catch_up_page(
    db: &PgPool,
    cache: &Cache,
    user_id: i64,
    floor_us: i64,
    base: i64,
    after: Option<(i64, i64)>,
    skip: &[i64],
) -> sqlx::Result<(Vec<(Tweet, i64, i64)>, Option<(i64, i64)>)> {
    let (after_at, after_id) = after.unwrap_or((floor_us, 0));
    let rows: Vec<Arrival> = sqlx::query_as(
        "select n.id, n.tweet_id, t.user_id as author_id, n.created_at, n.arrived_at
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
    let Some(last) = rows.last().map(|r| (time::to_micros(r.arrived_at), r.id)) else {
        return Ok((Vec::new(), None));
    };
    let more = rows.len() == CATCH_UP_PAGE;
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
    let items = match timeline::hydrate_entries(db, cache, &entries, Some(user_id)).await? {
        Some(items) => items,
        None => {
            let at: Vec<Timestamp> = rows.iter().map(|r| r.created_at).collect();
            let order: HashMap<i64, usize> =
                rows.iter().enumerate().map(|(i, r)| (r.id, i)).collect();
            let mut joined = newsfeeds::rows_at(db, user_id, &at).await?;
            joined.sort_by_key(|r| order.get(&r.entry_id).copied().unwrap_or(usize::MAX));
            timeline::with_likes(db, cache, joined, Some(user_id)).await?
        }
    };
    let arrived: HashMap<i64, i64> = rows
        .iter()
        .map(|r| (r.id, time::to_micros(r.arrived_at)))
        .collect();
    let out = items
        .into_iter()
        .filter_map(|item| {
            let at = *arrived.get(&item.id)?;
            let id = item.id;
            Some((Tweet::from_item(item)?, id, at))
        })
        .collect();
    Ok((out, more.then_some(last)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_round_trips_and_lists_only_ids_above_its_base() {
        let mut c = Cursor::starting_at(time::from_micros(10_000_000));
        c.advance(5, 10_000_001);
        c.advance(7, 10_000_002);
        let t = c.token();
        assert_eq!(t, "0.10000000.2.5.7");
        let back = Cursor::parse(&t).expect("parses");
        assert!(back.seen(5) && back.seen(7) && !back.seen(6));
        assert_eq!(back.token(), t);
        assert!(Cursor::parse("x.1.0").is_none());
        assert!(Cursor::parse("3.1").is_none());
        assert!(Cursor::parse("3.1.0.0").is_none());
    }

    #[test]
    fn the_base_moves_only_past_rows_older_than_the_settle_window() {
        let mut c = Cursor::starting_at(time::from_micros(0));
        c.advance(10, 1_000_000);
        c.advance(12, 2_000_000);
        assert_eq!(c.base, 0);
        c.advance(20, 1_000_000 + SETTLE_US + 1);
        // Row 10 left the window: the base moves to it; 12 and 20 stay listed, 11 and 15
        // (never delivered) are still to come.
        assert_eq!(c.base, 10);
        assert!(c.seen(12) && c.seen(20) && !c.seen(11) && !c.seen(15));
        assert_eq!(
            c.token(),
            format!("10.0.{}.2.10", 1_000_000 + SETTLE_US + 1)
        );
    }

    #[test]
    fn a_busy_feed_keeps_every_recent_id_live_but_a_token_lists_the_newest_256() {
        let mut c = Cursor::starting_at(time::from_micros(0));
        // 1,000 arrivals within one second, ids 2, 4, 6, …: 999 (odd) is still uncommitted.
        for k in 1..=1000 {
            c.advance(2 * k, 1_000 + k);
        }
        assert_eq!(c.base, 0, "nothing left the settle window");
        assert!(!c.seen(999), "a late row is still delivered live");
        let token = Cursor::parse(&c.token()).expect("token");
        assert_eq!(
            token.base,
            2 * 744,
            "the token's base covers all but the newest 256"
        );
        assert_eq!(token.recent.len(), RECENT_MAX);
        assert!(token.seen(2000) && token.seen(1488) && !token.seen(1489));
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
