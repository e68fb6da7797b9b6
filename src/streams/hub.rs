//! Each process's hub: its clients, their bounded queues, and the dispatch of each message
//! of the topic to the clients it concerns.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};

use crate::cache::Cache;
use crate::cache::pubsub::Subscriber;

#[cfg(test)]
use super::client::PullFollows;
use super::client::{Client, Ended};
use super::{Filter, TOPIC, Wire};

/// An event queued for one client. The JSON is shared by every client it goes to.
#[derive(Debug, Clone)]
pub enum Event {
    /// `{"event": "tweet", "tweet": Tweet}`; `row` is `(newsfeed row id, entry time µs)` on
    /// `streaming/user`.
    Tweet {
        tweet_id: i64,
        /// The tweet's author (a session leaves out those its user must not see).
        author: i64,
        /// A retweet's retweeted tweet's author (left out the same way).
        retweeted_author: Option<i64>,
        data: Arc<str>,
        row: Option<(i64, i64)>,
    },
    /// `{"event": "delete", "tweet_id", "user_id"}`.
    Delete {
        tweet_id: i64,
        /// The tweet's author (a session leaves out those its user must not see).
        author: i64,
        data: Arc<str>,
    },
    /// `{"event": "edit", "tweet": Tweet}`: the tweet as edited.
    Edit {
        tweet_id: i64,
        /// The tweet's author (a session leaves out those its user must not see).
        author: i64,
        data: Arc<str>,
    },
}

/// Edits this process's hub saw last, at most: a tweet event of an older text that arrives
/// after its edit (a fan-out batch that read the text before the edit committed and published
/// after it) carries the edited tweet instead. Edits happen within an hour of posting, while
/// the fan-out runs.
const EDITS_KEPT: usize = 4096;

/// The newest edits seen ([`EDITS_KEPT`]): tweet id → (edit version, Tweet JSON, text).
#[derive(Debug, Default)]
struct RecentEdits {
    by_id: HashMap<i64, (i64, Arc<str>, String)>,
    order: std::collections::VecDeque<i64>,
}

impl RecentEdits {
    fn remember(&mut self, id: i64, version: i64, tweet: &str, text: &str) {
        if self.by_id.get(&id).is_some_and(|(v, ..)| *v >= version) {
            return;
        }
        if self
            .by_id
            .insert(id, (version, tweet.into(), text.to_owned()))
            .is_none()
        {
            self.order.push_back(id);
            if self.order.len() > EDITS_KEPT
                && let Some(oldest) = self.order.pop_front()
            {
                self.by_id.remove(&oldest);
            }
        }
    }

    /// The newer edit of tweet `id` than `version`, if one was seen: (Tweet JSON, text).
    fn newer(&self, id: i64, version: i64) -> Option<(Arc<str>, String)> {
        let (v, tweet, text) = self.by_id.get(&id)?;
        (*v > version).then(|| (tweet.clone(), text.clone()))
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
    /// New pulled tweets not offered live because [`PULLED_READS`] reads of followers were in
    /// flight: their streams get them at their next settle (heartbeat) instead.
    pub pulled_deferred: AtomicU64,
}

/// Reads of a pulled tweet's followers ([`Hub::offer_pulled`]) a process runs at once, at
/// most: each holds a Postgres connection of the process's pool, which requests need too.
pub const PULLED_READS: usize = 4;

#[derive(Debug, Default)]
struct Clients {
    /// `streaming/user` clients by user.
    users: HashMap<i64, Vec<Arc<Client>>>,
    /// `statuses/*` clients by client id.
    public: HashMap<u64, Arc<Client>>,
}

/// This process's stream clients, fed by its one subscription ([`TOPIC`] on the process's
/// [`Subscriber`]).
#[derive(Debug)]
pub struct Hub {
    clients: Mutex<Clients>,
    next_id: AtomicU64,
    /// Bumped each time the subscription breaks.
    generation: AtomicU64,
    /// Messages on their way to the dispatch task ([`Hub::new`]).
    inbox: std::sync::OnceLock<mpsc::Sender<String>>,
    /// Only the dispatch task uses it.
    edits: Mutex<RecentEdits>,
    /// Where a pulled tweet's followers are read ([`Hub::offer_pulled`]); `None` in unit tests.
    db: Option<sqlx::PgPool>,
    /// Permits for those reads ([`PULLED_READS`]).
    pulled_reads: Arc<tokio::sync::Semaphore>,
    pub stats: HubStats,
}

impl Default for Hub {
    fn default() -> Self {
        Hub {
            clients: Mutex::default(),
            next_id: AtomicU64::default(),
            generation: AtomicU64::default(),
            inbox: std::sync::OnceLock::new(),
            edits: Mutex::default(),
            db: None,
            pulled_reads: Arc::new(tokio::sync::Semaphore::new(PULLED_READS)),
            stats: HubStats::default(),
        }
    }
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
    ///
    /// `db` is where a pulled tweet's followers are read ([`Hub::offer_pulled`]).
    pub fn new(subscriber: &Subscriber, db: sqlx::PgPool) -> Arc<Self> {
        let hub = Arc::new(Hub {
            db: Some(db),
            ..Hub::default()
        });
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
            sent: Mutex::new(VecDeque::new()),
            pulls: Mutex::new(Arc::default()),
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

    fn dispatch(self: &Arc<Self>, text: &str) {
        self.stats.messages.fetch_add(1, Ordering::Relaxed);
        let mut wire: Wire = match serde_json::from_str(text) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "unreadable stream message");
                return;
            }
        };
        let mut tweet_json: Option<Arc<str>> = wire.tweet.as_ref().map(|t| t.get().into());
        {
            let mut edits = self.edits.lock().unwrap_or_else(|p| p.into_inner());
            let about = &mut wire.about;
            if let (Some(_), Some(tweet)) = (&wire.edit, &tweet_json) {
                edits.remember(about.tweet_id, about.version, tweet, &about.text);
            }
            // A tweet event, or an edit event, of an older text than an edit seen already
            // (two edits' events can reach Redis in either order).
            if tweet_json.is_some()
                && let Some((tweet, text)) = edits.newer(about.tweet_id, about.version)
            {
                tweet_json = Some(tweet);
                about.text = text;
            }
        }
        let data: Arc<str> = match (&tweet_json, &wire.edit) {
            (Some(tweet), None) => format!(r#"{{"event":"tweet","tweet":{tweet}}}"#).into(),
            (Some(tweet), Some(_)) => format!(r#"{{"event":"edit","tweet":{tweet}}}"#).into(),
            (None, _) => format!(
                r#"{{"event":"delete","tweet_id":{},"user_id":{}}}"#,
                wire.about.tweet_id, wire.about.user_id
            )
            .into(),
        };
        // The same tweet as it read before an edit: a filter that kept it then is told.
        let before = wire.edit.as_ref().map(|old| super::About {
            text: old.clone(),
            ..wire.about.clone()
        });
        let is_edit = wire.edit.is_some() && tweet_json.is_some();
        let is_delete = wire.tweet.is_none();
        let clients = self.lock();
        if wire.public {
            let (mut text_words, mut before_words) = (None, None);
            for c in clients.public.values() {
                let tweet_id = wire.about.tweet_id;
                // Looked up for edits and deletes only (a tweet event is a new tweet).
                let was_sent = (is_edit || is_delete) && c.was_sent(tweet_id);
                let keeps = was_sent
                    || c.filter.as_ref().is_some_and(|f| {
                        f.keeps(&wire.about, &mut text_words)
                            || (before.as_ref()).is_some_and(|b| f.keeps(b, &mut before_words))
                    });
                if keeps && !is_delete && !was_sent {
                    c.remember_sent(tweet_id);
                }
                if keeps {
                    let event = if is_edit {
                        Event::Edit {
                            tweet_id: wire.about.tweet_id,
                            author: wire.about.user_id,
                            data: data.clone(),
                        }
                    } else if is_delete {
                        Event::Delete {
                            tweet_id: wire.about.tweet_id,
                            author: wire.about.user_id,
                            data: data.clone(),
                        }
                    } else {
                        Event::Tweet {
                            tweet_id: wire.about.tweet_id,
                            author: wire.about.user_id,
                            retweeted_author: wire.about.retweeted_user_id,
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
                    author: wire.about.user_id,
                    retweeted_author: wire.about.retweeted_user_id,
                    data: data.clone(),
                    row: Some((*id, *at)),
                };
                c.offer(event, &self.stats);
            }
        }
        let (tweet_id, author) = (wire.about.tweet_id, wire.about.user_id);
        let edit_or_delete = || match is_edit {
            true => Event::Edit {
                tweet_id,
                author,
                data: data.clone(),
            },
            false => Event::Delete {
                tweet_id,
                author,
                data: data.clone(),
            },
        };
        for reader in &wire.readers {
            for c in clients.users.get(reader).into_iter().flatten() {
                c.offer(edit_or_delete(), &self.stats);
            }
        }
        // A pulled tweet: to the user clients whose user follows its author (the author's
        // own row went in `rows`, its own edits and deletes in `readers`). Every user client
        // is asked: pulled tweets are a few large accounts'.
        if let Some(at) = wire.pulled {
            let readers: HashSet<i64> = wire.readers.iter().copied().collect();
            let users = clients.users.iter().filter(|(u, _)| !readers.contains(u));
            let clients = users.flat_map(|(_, list)| list.iter());
            if is_edit || is_delete {
                // As far as each stream knows (a stream told of an edit or delete of a tweet
                // it was not sent ignores it, as a client does).
                for c in clients.filter(|c| c.pull_follows().has(author, at) == Some(true)) {
                    c.offer(edit_or_delete(), &self.stats);
                }
            } else {
                let candidates: Vec<Arc<Client>> = clients
                    .filter(|c| c.pull_follows().has(author, at) != Some(false))
                    .cloned()
                    .collect();
                let event = Event::Tweet {
                    tweet_id,
                    author,
                    retweeted_author: None, // a retweet is never pulled
                    data: data.clone(),
                    row: Some((-tweet_id, at)),
                };
                self.offer_pulled(candidates, author, at, event);
            }
        }
    }

    /// Offers a new pulled tweet of `author` (entry time `at_us`) to those of `candidates`
    /// whose user follows the author in Postgres now (one query for all of them, in a task of
    /// its own: the dispatch never waits for Postgres), so a stream whose user unfollowed the
    /// author after its session last read its pull sources is not sent the tweet; each
    /// candidate learns the answer ([`super::PullFollows`]). A failed read sends nothing (a stream's
    /// next settle sends what is its user's), and so does a tweet that comes while
    /// [`PULLED_READS`] reads are in flight (counted in [`HubStats::pulled_deferred`]): the
    /// reads, and the tasks waiting for them, stay bounded however fast pulled tweets come.
    /// Without a database (unit tests), the candidates that know they follow the author get it.
    fn offer_pulled(
        self: &Arc<Self>,
        candidates: Vec<Arc<Client>>,
        author: i64,
        at_us: i64,
        event: Event,
    ) {
        if candidates.is_empty() {
            return;
        }
        let Some(db) = self.db.clone() else {
            for c in candidates
                .iter()
                .filter(|c| c.pull_follows().has(author, at_us) == Some(true))
            {
                c.offer(event.clone(), &self.stats);
            }
            return;
        };
        let Ok(permit) = self.pulled_reads.clone().try_acquire_owned() else {
            self.stats.pulled_deferred.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(author, "pulled tweet deferred to the streams' next settle");
            return;
        };
        let hub = self.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut users: Vec<i64> = candidates.iter().map(|c| c.user_id).collect();
            users.sort_unstable();
            users.dedup();
            let follows = match crate::newsfeeds::followers_among(&db, author, &users).await {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::warn!(error = %e, author, "reading a pulled tweet's followers failed");
                    return;
                }
            };
            let follows: HashMap<i64, i64> = follows
                .into_iter()
                .map(|(user, from)| (user, from.map_or(i64::MIN, crate::time::to_micros)))
                .collect();
            for c in candidates {
                let from = follows.get(&c.user_id).copied();
                c.learn(author, from);
                if from.is_some_and(|from| at_us > from) {
                    c.offer(event.clone(), &hub.stats);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::streams::About;

    /// A message about tweet 5 by user 1 at `version` with `text`, without the tweet object if
    /// `deleted`: to the public streams if `public`, to `rows` and `readers`, replacing the
    /// text `edit` if given.
    fn wire(
        (version, text): (i64, &str),
        deleted: bool,
        public: bool,
        (rows, readers): (Vec<(i64, i64, i64)>, Vec<i64>),
        edit: Option<&str>,
    ) -> String {
        let tweet = format!(r#"{{"id":5,"content":"{text}"}}"#);
        let wire = Wire {
            about: About {
                tweet_id: 5,
                user_id: 1,
                text: text.to_owned(),
                version,
                coordinates: None,
                bbox: None,
                in_reply_to_user_id: None,
                retweeted_user_id: None,
                mentioned_user_ids: Vec::new(),
            },
            tweet: (!deleted)
                .then(|| serde_json::value::RawValue::from_string(tweet).ok())
                .flatten(),
            public,
            rows,
            readers,
            edit: edit.map(str::to_owned),
            pulled: None,
        };
        serde_json::to_string(&wire).unwrap_or_default()
    }

    /// A message about tweet 5 at `version` with `text`: an edit's, or an arrival in reader
    /// 7's newsfeed.
    fn message(version: i64, text: &str, edit: bool) -> String {
        let to = match edit {
            true => (Vec::new(), vec![7]),
            false => (vec![(7, 100, 123)], Vec::new()),
        };
        wire((version, text), false, false, to, edit.then_some("older"))
    }

    /// Review of the edits, finding 2: a `track=foo` stream got "foo", then the edit to "bar"
    /// (matched on the old text); the edit to "baz" matched neither text and its delete
    /// matched nothing, so the client kept showing "bar" for a deleted tweet.
    #[test]
    fn a_filter_stream_hears_every_later_edit_and_the_delete_of_a_tweet_it_was_sent() {
        let hub = Arc::new(Hub::default());
        let predicates = super::super::filter::Predicates {
            track: vec![vec!["foo".to_owned()]],
            ..Default::default()
        };
        let (_registration, mut rx) = hub.register(9, Some(Filter::Match(predicates)), 16);
        let public = |version: i64, text: &str, before: Option<&str>, deleted: bool| {
            wire(
                (version, text),
                deleted,
                true,
                (Vec::new(), Vec::new()),
                before,
            )
        };
        hub.dispatch(&public(0, "foo", None, false));
        hub.dispatch(&public(1, "bar", Some("foo"), false));
        hub.dispatch(&public(2, "baz", Some("bar"), false));
        hub.dispatch(&public(2, "baz", None, true));
        let mut got = Vec::new();
        while let Ok(event) = rx.try_recv() {
            got.push(match event {
                Event::Tweet { .. } => "tweet",
                Event::Edit { .. } => "edit",
                Event::Delete { .. } => "delete",
            });
        }
        assert_eq!(got, ["tweet", "edit", "edit", "delete"]);
    }

    #[test]
    fn events_of_an_older_text_that_come_after_an_edit_carry_the_edit() {
        let hub = Arc::new(Hub::default());
        let (_registration, mut rx) = hub.register(7, None, 16);
        // The second edit's event first, then the first edit's, then a fan-out batch's that
        // read the tweet as posted.
        hub.dispatch(&message(2, "second", true));
        hub.dispatch(&message(1, "first", true));
        hub.dispatch(&message(0, "posted", false));
        let mut got = Vec::new();
        while let Ok(event) = rx.try_recv() {
            got.push(match event {
                Event::Tweet { data, .. }
                | Event::Edit { data, .. }
                | Event::Delete { data, .. } => data.to_string(),
            });
        }
        let tweet = r#"{"id":5,"content":"second"}"#;
        assert_eq!(
            got,
            [
                format!(r#"{{"event":"edit","tweet":{tweet}}}"#),
                format!(r#"{{"event":"edit","tweet":{tweet}}}"#),
                format!(r#"{{"event":"tweet","tweet":{tweet}}}"#),
            ]
        );
    }

    /// A pulled tweet (tweet 5 by user 1, entry time 500 µs) reaches the user streams whose
    /// user follows its author since before it, as the entry `(-5, 500)`, and so do its edit
    /// and delete; a stream whose user does not follow the author, or followed it later, gets
    /// none of them, nor (without a database to ask, as here) one that has not read the
    /// author's friendship yet.
    #[test]
    fn a_pulled_tweet_goes_to_the_streams_whose_user_follows_its_author() {
        let hub = Arc::new(Hub::default());
        let known = Arc::new(vec![1]);
        let at = |us: i64| Some(crate::time::from_micros(us));
        let clients = [
            (7, PullFollows::new(known.clone(), &[(1, None)])),
            (8, PullFollows::new(known.clone(), &[])),
            (9, PullFollows::new(known.clone(), &[(1, at(600))])), // followed after it
            (10, PullFollows::new(known.clone(), &[(1, at(400))])),
            (11, PullFollows::default()),
        ];
        let mut streams = Vec::new();
        for (user, follows) in clients {
            let (registration, rx) = hub.register(user, None, 16);
            registration.client.set_pull_follows(follows);
            streams.push((user, registration, rx));
        }
        let pulled = |deleted: bool, edit: Option<&str>, rows: Vec<(i64, i64, i64)>| {
            let text = wire((0, "hi"), deleted, true, (rows, Vec::new()), edit);
            let mut value: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            value["pulled"] = serde_json::json!(500);
            value.to_string()
        };
        hub.dispatch(&pulled(false, None, vec![(1, 90, 500)]));
        hub.dispatch(&pulled(false, Some("before"), Vec::new()));
        hub.dispatch(&pulled(true, None, Vec::new()));
        for (user, _registration, rx) in &mut streams {
            let mut got = Vec::new();
            while let Ok(event) = rx.try_recv() {
                got.push(match event {
                    Event::Tweet { row, .. } => format!("tweet {row:?}"),
                    Event::Edit { .. } => "edit".to_owned(),
                    Event::Delete { .. } => "delete".to_owned(),
                });
            }
            let want: &[&str] = match user {
                7 | 10 => &["tweet Some((-5, 500))", "edit", "delete"],
                _ => &[],
            };
            assert_eq!(got, want, "user {user}");
        }
    }

    #[tokio::test]
    async fn follower_reads_of_pulled_tweets_stay_bounded_and_the_rest_wait_for_a_settle() {
        // A pool that never connects: the reads it would run are not reached here.
        let db = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://127.0.0.1:1/none")
            .expect("a valid url");
        let hub = Arc::new(Hub {
            db: Some(db),
            ..Hub::default()
        });
        let (registration, mut rx) = hub.register(7, None, 16);
        let follows = PullFollows::new(Arc::new(vec![1]), &[(1, None)]);
        registration.client.set_pull_follows(follows);
        let event = |id| Event::Tweet {
            tweet_id: id,
            author: 1,
            retweeted_author: None,
            data: Arc::from("{}"),
            row: Some((-id, 500)),
        };
        // Every permit taken, as by reads in flight: a new pulled tweet is left to the
        // stream's next settle, without a task of its own.
        let held = hub
            .pulled_reads
            .clone()
            .try_acquire_many_owned(PULLED_READS as u32)
            .expect("every permit is free");
        for id in 1..=100 {
            hub.offer_pulled(vec![registration.client.clone()], 1, 500, event(id));
        }
        assert_eq!(hub.stats.pulled_deferred.load(Ordering::Relaxed), 100);
        assert_eq!(hub.pulled_reads.available_permits(), 0);
        drop(held);
        assert_eq!(hub.pulled_reads.available_permits(), PULLED_READS);
        assert!(rx.try_recv().is_err(), "nothing offered live");
    }
}
