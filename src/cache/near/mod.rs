//! Near caches: a bounded memory, in each process, of values read from Redis far more often
//! than they change (bearer tokens; tweet and user objects; tweet counters, read by every page
//! that shows the tweet and changed by each like), so that a warm request skips their Redis
//! round trip or key lookups, with invalidation that stays immediate across processes. (The
//! name and the shape are those of Hazelcast's and Coherence's near caches; Facebook's TAO keeps
//! a per-host tier invalidated by messages in the same way.)
//!
//! **Invalidation.** A writer commits in Postgres, writes Redis (a tombstone, a newer version),
//! and then calls [`Near::evict_everywhere`]: it publishes the keys on `{p}:{bus}:{topic}` and
//! waits until every process registered as holding a lease ([`super::lease`]) has dropped them
//! from its memory and acknowledged (an `SADD` of its id to `{p}:{r<nonce>}:acks`), or has
//! provably lost its lease; at most the lease's length and margin. Only then does the write
//! answer, so once a client has seen it succeed no process answers from the old value. The
//! outbox relay does the same for the writes of a process that died before it could, and for
//! writes handed off by a process whose Redis link failed ([`broadcast`]).
//!
//! **When memory is trusted.** A process answers from memory only while its subscription
//! stands and it holds its lease: a heartbeat, sent on its own through Redis and heard on the
//! subscription less than a lease length ago, proves it heard every eviction published before.
//! A stalled, half-open or broken subscription lets the lease run out within its length; a
//! lease granted again (a new term), a broken subscription, a fence, a recovery of the cache
//! or an epoch changed by another process's fence clears the memory. A value found by a lookup
//! that raced an eviction is not stored (the eviction counter moved meanwhile). Entries also
//! live at most the cache's TTL.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::cache::lease::DEFAULT_BOUND;
use crate::cache::pubsub::Subscriber;
use crate::cache::{Cache, CacheUnavailable};

mod memory;
use memory::Memory;

/// A key of a near cache, as it travels in an eviction message (no spaces).
pub trait NearKey: Eq + Hash + Copy + Send + Sync + 'static {
    /// The key in a message.
    fn to_message(&self) -> String;
    /// The key from a message; `None` if malformed.
    fn from_message(text: &str) -> Option<Self>;
}

/// Counters of a near cache since start (for `/healthz` and tests).
#[derive(Debug, Default)]
pub struct NearStats {
    /// Values answered from this process's memory.
    pub hits: AtomicU64,
    /// Values asked of this process's memory that it did not hold (or held past the TTL), while
    /// it was trusted.
    pub misses: AtomicU64,
    /// Evictions this process applied (its own and other processes').
    pub evictions: AtomicU64,
    /// Writes whose eviction waited out some process's lease instead of its acknowledgement.
    pub unconfirmed: AtomicU64,
}

/// What [`Near::begin`] saw (the eviction count, the fence count, whether the subscription
/// stood): hand it back to [`Near::insert`].
#[derive(Debug, Clone, Copy)]
pub struct Lookup(u64, u64, bool);

/// The subscription a near cache listens on.
struct Link {
    subscriber: Weak<Subscriber>,
    stop: tokio::sync::watch::Receiver<bool>,
}

/// What [`Near::get_many_then`] found: the value of each key asked (`None`: not held), then
/// each key derived from those values with its value.
pub type Found<K, V> = (Vec<Option<V>>, Vec<(K, Option<V>)>);

/// One near cache: up to `capacity` values for at most `ttl` each; see the module docs.
pub struct Near<K, V> {
    topic: &'static str,
    memory: Mutex<Memory<K, V>>,
    ttl: Duration,
    capacity: usize,
    /// Bumped by every eviction heard and every loss of trust.
    epoch: AtomicU64,
    /// The cache's fences plus recoveries the memory was last checked against.
    fences: AtomicU64,
    link: OnceLock<Link>,
    /// The evictions this process is publishing, by nonce: when its own subscriber hears one,
    /// it tells the writer instead of acknowledging through Redis ([`Own`]).
    own: Mutex<HashMap<String, Arc<Own>>>,
    /// The counters.
    pub stats: NearStats,
}

impl<K: NearKey, V: Clone + Send + Sync + 'static> Near<K, V> {
    /// A near cache whose evictions travel on `topic`; a zero `ttl` or `capacity` disables it.
    /// It answers nothing until [`Near::attach`]ed to the process's subscriber.
    pub fn new(topic: &'static str, ttl: Duration, capacity: usize) -> Arc<Self> {
        Arc::new(Near {
            topic,
            memory: Mutex::new(Memory::new(capacity)),
            ttl,
            capacity,
            epoch: AtomicU64::new(0),
            fences: AtomicU64::new(0),
            link: OnceLock::new(),
            own: Mutex::new(HashMap::new()),
            stats: NearStats::default(),
        })
    }

    /// Listens for evictions on `subscriber` (its route is added here; `stop` ends the
    /// subscription). Call once, while the state is built.
    pub fn attach(
        self: &Arc<Self>,
        subscriber: &Arc<Subscriber>,
        cache: &Cache,
        stop: tokio::sync::watch::Receiver<bool>,
    ) {
        if !self.enabled() || !cache.enabled() {
            return;
        }
        let link = Link {
            subscriber: Arc::downgrade(subscriber),
            stop,
        };
        if self.link.set(link).is_err() {
            return;
        }
        subscriber.lease_topic(self.topic);
        let (on_message, on_lost) = (Arc::downgrade(self), Arc::downgrade(self));
        let cache = cache.clone();
        subscriber.route(
            self.topic,
            move |payload| {
                if let Some(me) = on_message.upgrade() {
                    me.heard(&cache, payload);
                }
            },
            move || {
                if let Some(me) = on_lost.upgrade() {
                    me.forget(None);
                }
            },
        );
    }

    /// Whether this near cache is on (a zero TTL or capacity turns it off).
    pub fn enabled(&self) -> bool {
        !self.ttl.is_zero() && self.capacity > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Memory<K, V>> {
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn own_evictions(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Own>>> {
        self.own.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This process's id in registries and acknowledgement sets.
    fn process(&self) -> Option<u64> {
        let subscriber = self.link.get()?.subscriber.upgrade()?;
        Some(subscriber.lease().id())
    }

    /// The longest a writer waits for a process that does not acknowledge (this process's
    /// [`super::lease::Lease::bound`]; processes share the setting).
    pub fn lease_bound(&self) -> Duration {
        self.link
            .get()
            .and_then(|l| l.subscriber.upgrade())
            .map_or(DEFAULT_BOUND, |s| s.lease().bound())
    }

    fn subscribed(&self) -> bool {
        self.link
            .get()
            .and_then(|l| l.subscriber.upgrade())
            .is_some_and(|s| s.subscribed())
    }

    /// Whether this process answers from this near cache now: its subscription stands, its
    /// lease is held and Redis is in use. Unlike the check of each lookup, starts nothing and
    /// forgets nothing (for `GET /metrics`).
    pub fn is_trusted(&self, cache: &Cache) -> bool {
        self.link
            .get()
            .and_then(|l| l.subscriber.upgrade())
            .is_some_and(|s| s.subscribed() && s.lease().held() && cache.available())
            && self.enabled()
    }

    /// Whether this process may answer from memory now; starts the subscription on first use.
    fn trusted(&self, cache: &Cache) -> bool {
        let Some(link) = self.link.get() else {
            return false;
        };
        let Some(subscriber) = link.subscriber.upgrade() else {
            return false;
        };
        if !subscriber.subscribed() {
            subscriber.start(cache, &link.stop);
            return false;
        }
        if !subscriber.lease().held() || !cache.available() {
            return false;
        }
        let fences = generation(cache, Some(&subscriber));
        if self.fences.swap(fences, Ordering::AcqRel) != fences {
            self.forget(None);
            return false;
        }
        true
    }

    /// The value of each key if this process may answer from memory (`None` where it holds
    /// none); `None` if it may not answer at all.
    pub fn get_many(&self, cache: &Cache, keys: &[K]) -> Option<Vec<Option<V>>> {
        self.get_many_then(cache, keys, |_| None)
            .map(|(found, _)| found)
    }

    /// [`Near::get_many`] of `keys`, then, under the same lock, of the keys `then` names for
    /// the values found (a tweet's author), each once: a page's tweets and their authors in
    /// one lookup, under one lock (docs/decisions/0014-split-time-entries-without-author.md).
    pub fn get_many_then(
        &self,
        cache: &Cache,
        keys: &[K],
        then: impl Fn(&V) -> Option<K>,
    ) -> Option<Found<K, V>> {
        if !self.trusted(cache) {
            return None;
        }
        let now = Instant::now();
        let mut memory = self.lock();
        let mut get = |k: &K| memory.get(k, self.ttl, now);
        let found: Vec<Option<V>> = keys.iter().map(&mut get).collect();
        let mut derived: Vec<(K, Option<V>)> = Vec::new();
        for key in found.iter().flatten().filter_map(&then) {
            if !derived.iter().any(|(d, _)| *d == key) {
                let value = get(&key);
                derived.push((key, value));
            }
        }
        drop(memory);
        let values = found.iter().chain(derived.iter().map(|(_, v)| v));
        let (mut hits, mut misses) = (0, 0);
        for value in values {
            if value.is_some() {
                hits += 1;
            } else {
                misses += 1;
            }
        }
        self.stats.hits.fetch_add(hits, Ordering::Relaxed);
        self.stats.misses.fetch_add(misses, Ordering::Relaxed);
        Some((found, derived))
    }

    /// [`Near::get_many`] not counted in [`NearStats`]: for a cache fill that asks what this
    /// process holds to learn what Redis was given already (it leaves out the objects held at
    /// their loaded version or a newer one: [`Cache::fill_hydrated`]), not for an answer.
    pub fn get_many_uncounted(&self, cache: &Cache, keys: &[K]) -> Option<Vec<Option<V>>> {
        if !self.trusted(cache) {
            return None;
        }
        let now = Instant::now();
        let mut memory = self.lock();
        Some(keys.iter().map(|k| memory.get(k, self.ttl, now)).collect())
    }

    /// The value of one key, if this process may answer from memory and holds it.
    pub fn get(&self, cache: &Cache, key: &K) -> Option<V> {
        self.get_many(cache, std::slice::from_ref(key))?.pop()?
    }

    /// Whether [`Near::insert`] may store what a lookup that began at `lookup` finds (not if
    /// this near cache is off, or the process was not subscribed when it began).
    pub fn may_store(&self, lookup: &Lookup) -> bool {
        self.enabled() && lookup.2
    }

    /// Call before looking values up in Redis or Postgres.
    pub fn begin(&self, cache: &Cache) -> Lookup {
        // The eviction count first: a subscription that breaks after this read bumps it.
        let epoch = self.epoch.load(Ordering::Acquire);
        let subscriber = self.link.get().and_then(|l| l.subscriber.upgrade());
        let subscribed = subscriber.as_ref().is_some_and(|s| s.subscribed());
        Lookup(epoch, generation(cache, subscriber.as_deref()), subscribed)
    }

    /// Remembers values found by a lookup that began at `lookup`, except those whose key was
    /// evicted since (all of them if the memory was cleared or the subscription broke since,
    /// or if the eviction of some key since is no longer known), and nothing if the
    /// subscription was down when the lookup began or is down now (a writer does not wait for
    /// a process that is not subscribed, so one that subscribed meanwhile may have missed the
    /// eviction of what it read).
    ///
    /// Key by key: one counter of a liked tweet, evicted while a page was being read, must not
    /// keep the page's other tweets and counters out of memory (a single eviction count did,
    /// and a mix of 5 % likes and comments lost 17 % of its requests/s:
    /// docs/decisions/0015-near-cached-counters.md).
    pub fn insert(&self, cache: &Cache, lookup: Lookup, values: impl IntoIterator<Item = (K, V)>) {
        if !self.enabled() || !lookup.2 || !self.subscribed() {
            return;
        }
        let subscriber = self.link.get().and_then(|l| l.subscriber.upgrade());
        let mut memory = self.lock();
        // Checked under the lock that `forget` takes too: an eviction is either counted and
        // listed before this check or removes the entry after this insert.
        if generation(cache, subscriber.as_deref()) != lookup.1 {
            return;
        }
        let Some(evicted) = memory.evicted_since(lookup.0, self.epoch.load(Ordering::Acquire))
        else {
            return;
        };
        let now = Instant::now();
        for (key, value) in values {
            if !evicted.contains(&key) {
                memory.insert(key, value, now);
            }
        }
    }

    /// Forgets some keys, or every one (`None`), and counts it as an eviction for lookups in
    /// flight (under the lock `insert` checks with, so none of them stores what it found
    /// before of those keys).
    fn forget(&self, keys: Option<&[K]>) {
        let mut memory = self.lock();
        let count = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        match keys {
            Some(keys) => memory.evict(count, keys),
            None => memory.clear(count),
        }
    }

    /// An eviction message from any process (this one included), `"{nonce} {key} {key}…"`:
    /// forget the keys, then acknowledge.
    fn heard(&self, cache: &Cache, payload: &str) {
        let mut words = payload.split(' ');
        let Some(nonce) = words.next() else { return };
        let keys: Vec<K> = words.filter_map(K::from_message).collect();
        self.forget(Some(&keys));
        self.stats.evictions.fetch_add(1, Ordering::Relaxed);
        let own = self.own_evictions().get(nonce).cloned();
        if let Some(own) = own {
            // This process's own eviction: its writer forgot the keys before publishing and
            // now knows that this process was among the receivers.
            own.heard.store(true, Ordering::Release);
            own.notify.notify_one();
            return;
        }
        let Some(key) = ack_key(cache, nonce) else {
            return;
        };
        let Some(me) = self.process() else { return };
        let cache = cache.clone();
        tokio::spawn(async move {
            // A set of process names, not a counter: an acknowledgement sent twice (a retried
            // pipeline) counts once.
            let mut pipe = redis::pipe();
            pipe.cmd("SADD")
                .arg(&key)
                .arg(me)
                .ignore()
                .cmd("EXPIRE")
                .arg(&key)
                .arg(60)
                .ignore();
            let _ = cache.run_unchecked::<()>(&pipe, 1).await;
        });
    }

    /// Evicts `keys` from every process's memory and waits until every process that may hold a
    /// lease acknowledged or lost it (at most the lease bound; see the module docs). Call after the write committed and Redis holds the new
    /// state. Returns whether every process confirmed.
    ///
    /// # Errors
    /// The eviction could not be published (Redis down): leave it to the outbox relay.
    pub async fn evict_everywhere(
        &self,
        cache: &Cache,
        keys: &[K],
    ) -> Result<bool, CacheUnavailable> {
        if keys.is_empty() {
            return Ok(true);
        }
        self.forget(Some(keys));
        if !cache.enabled() {
            return Ok(true);
        }
        let words: Vec<String> = keys.iter().map(K::to_message).collect();
        let nonce = new_nonce();
        let own = Arc::new(Own {
            heard: std::sync::atomic::AtomicBool::new(false),
            notify: tokio::sync::Notify::new(),
            expected: self.subscribed(),
        });
        self.own_evictions().insert(nonce.clone(), own.clone());
        // Unregistered when the wait ends, or if it is dropped halfway.
        let _registered = Registered(self, &nonce);
        let mine = self.process().map(|id| (&*own, id));
        let result =
            publish_and_wait(cache, self.topic, &nonce, &words, mine, self.lease_bound()).await;
        if !matches!(result, Ok(true)) {
            self.stats.unconfirmed.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Forgets `keys` in this process's memory alone (what a best-effort update changed; the
    /// write that made it necessary evicts them everywhere).
    pub fn forget_here(&self, keys: &[K]) {
        if !keys.is_empty() {
            self.forget(Some(keys));
        }
    }

    /// How many values this process holds now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What memory was last checked against: the cache's fences, recoveries and epoch changes,
/// plus the lease's terms (a lease granted after a lapse or on a new subscription). When it
/// moves, memory is forgotten and lookups in flight store nothing.
fn generation(cache: &Cache, subscriber: Option<&Subscriber>) -> u64 {
    let fences = cache.stats().map_or(0, |s| {
        s.fences.load(Ordering::Acquire)
            + s.recoveries.load(Ordering::Acquire)
            + s.epoch_changes.load(Ordering::Acquire)
    });
    fences + subscriber.map_or(0, |s| s.lease().term())
}

/// Publishes the eviction of `keys` (each in its [`NearKey::to_message`] form) on `topic` and
/// waits until every process that may hold a lease has dropped them or lost it. Also used
/// by the outbox relay for writes whose process died before announcing them. Returns whether
/// every process confirmed (one that did not stops trusting its memory within the near cache's
/// TTL).
///
/// # Errors
/// The eviction could not be published (Redis off or down).
pub async fn broadcast(
    cache: &Cache,
    topic: &str,
    keys: &[String],
) -> Result<bool, CacheUnavailable> {
    let nonce = new_nonce();
    publish_and_wait(cache, topic, &nonce, keys, None, DEFAULT_BOUND).await
}

/// Removes a writer's own eviction from [`Near::own_evictions`] when dropped.
struct Registered<'a, K: NearKey, V: Clone + Send + Sync + 'static>(&'a Near<K, V>, &'a str);

impl<K: NearKey, V: Clone + Send + Sync + 'static> Drop for Registered<'_, K, V> {
    fn drop(&mut self) {
        self.0.own_evictions().remove(self.1);
    }
}

/// A writer's own eviction in flight ([`Near::evict_everywhere`]): the writer forgot the keys
/// before publishing, so its own process needs no acknowledgement through Redis, only the
/// knowledge that it was one of the receivers `PUBLISH` counted.
struct Own {
    /// This process's subscriber heard the message (so `PUBLISH` counted it).
    heard: std::sync::atomic::AtomicBool,
    /// Woken when it does.
    notify: tokio::sync::Notify,
    /// The subscription stood when the writer began: worth waiting for the message to arrive
    /// (a hint: if it never does, the writer polls for every receiver's acknowledgement).
    expected: bool,
}

/// [`broadcast`] with the nonce `nonce`; for a writer's own eviction (`own`, with this
/// process's id) its own process needs no acknowledgement (it forgot the keys before
/// publishing), only, for the count of receivers, to have heard the message.
///
/// The wait ends when every process registered when the eviction was published
/// ([`Cache::publish_eviction`]) has acknowledged or its registration has expired (its lease
/// has then too: [`super::lease`]), and, for processes that may be subscribed without a
/// registration (the registry was flushed or evicted a moment ago), when as many processes
/// acknowledged as `PUBLISH` counted or `bound` (the longest lease and its margin) has passed.
/// So it lasts at most the longest registration or `bound`; Redis failing meanwhile only makes
/// it last that long. Returns whether every process acknowledged (`false`: some lease was
/// waited out instead, which is as safe and slower).
async fn publish_and_wait(
    cache: &Cache,
    topic: &str,
    nonce: &str,
    keys: &[String],
    own: Option<(&Own, u64)>,
    bound: Duration,
) -> Result<bool, CacheUnavailable> {
    let published = cache
        .publish_eviction(topic, &format!("{nonce} {}", keys.join(" ")))
        .await?;
    let answered = Instant::now();
    let key = ack_key(cache, nonce).ok_or(CacheUnavailable)?;
    let me = own.map(|(_, id)| id);
    let mut waiting: Vec<(u64, Instant)> = (published.live.iter())
        .filter(|(id, _)| Some(*id) != me)
        .map(|(id, left)| (*id, answered + *left))
        .collect();
    let longest = published.live.iter().map(|(_, left)| *left).max();
    let unregistered_until = answered + longest.map_or(bound, |l| l.max(bound));
    let (mut acks, mut all_acked, mut polls) = (0_u64, true, 0_u32);
    let mut expect_own = own.is_some_and(|(o, _)| o.expected);
    loop {
        let heard = own.is_some_and(|(o, _)| o.heard.load(Ordering::Acquire));
        let receivers = published.receivers.saturating_sub(u64::from(heard));
        if waiting.is_empty() && acks >= receivers {
            return Ok(all_acked);
        }
        // Until its own subscriber hears the message, a writer that expects it waits for that
        // first: the other processes' acknowledgements take about as long.
        if heard || !expect_own {
            let mut pipe = redis::pipe();
            pipe.cmd("SMEMBERS").arg(&key);
            if let Ok((acked,)) = cache.run_unchecked::<(Vec<u64>,)>(&pipe, 1).await {
                waiting.retain(|(id, _)| !acked.contains(id));
                acks = acks.max(acked.len() as u64);
            }
        }
        let now = Instant::now();
        if waiting.iter().any(|(_, until)| *until <= now) {
            // Registered and silent: its registration, and so its lease, has run out.
            all_acked = false;
            waiting.retain(|(_, until)| *until > now);
        }
        if now >= unregistered_until && acks < receivers {
            all_acked = false;
            acks = u64::MAX;
        }
        if waiting.is_empty() && acks >= receivers {
            if !all_acked {
                tracing::debug!(
                    topic,
                    "an eviction waited out a lease instead of an acknowledgement"
                );
            }
            return Ok(all_acked);
        }
        if let (Some((o, _)), false) = (own, heard) {
            // Its own message normally arrives within a round trip. If it has not within a
            // millisecond (a busy process, or a subscription that broke before the `PUBLISH`
            // and left this process out of the count), poll once a millisecond while waiting:
            // back-to-back polls could not end the wait before it arrives.
            let wait = tokio::time::timeout(Duration::from_millis(1), o.notify.notified());
            if wait.await.is_err() {
                expect_own = false;
            }
            continue;
        }
        // Acknowledgements take a few hundred µs (a message, an eviction, an `SADD`): the
        // first polls follow each other (one round trip each; a 1 ms sleep, the timer's
        // resolution, added 1 to 3 ms to every like once likes evicted counters:
        // docs/decisions/0015-near-cached-counters.md); a wait that lasts (a stalled
        // process's lease) polls every few ms.
        polls += 1;
        if polls <= FAST_POLLS {
            tokio::task::yield_now().await;
        } else {
            let ms = u64::from((polls / FAST_POLLS).min(5));
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }
}

/// Acknowledgement polls a writer makes back to back before it sleeps between polls.
const FAST_POLLS: u32 = 16;

/// A random eviction id, 16 hex digits (it names the acknowledgement set).
fn new_nonce() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// `{p}:{r<nonce>}:acks`.
fn ack_key(cache: &Cache, nonce: &str) -> Option<String> {
    Some(cache.keys()?.acks(nonce))
}
