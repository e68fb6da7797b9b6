//! The in-process token cache: the user id of recently seen bearer tokens, kept in this
//! process's memory so that an authenticated request costs no Redis round trip, with revocation
//! that stays immediate across processes.
//!
//! **Revocation.** A logout commits in Postgres, tombstones the token in Redis
//! ([`super::Update::TokenRevoked`]) and then calls [`TokenCache::revoke`]: it publishes the
//! token's hash on `{p}:{bus}:revoked` and waits until every subscribed process has dropped the token
//! from its memory and acknowledged (an `SADD` of its name to `{p}:{r<nonce>}:acks`; `PUBLISH` says how many
//! subscribers received the message). Only then does the logout answer, so once a client has
//! seen its logout succeed, no process accepts the token.
//!
//! **When memory is not trusted.** A process trusts its memory only while its subscription
//! stands ([`Subscriber::subscribed`]): a revocation published while it is down would be missed,
//! so a broken subscription also clears the memory. An entry found by a lookup that raced a
//! revocation is not stored (the `revocations` counter moved meanwhile). Entries live at most
//! `CHIRP_TOKEN_CACHE_SECS`, the bound on what a process that neither heard nor acknowledged a
//! revocation (frozen for longer than the logout waits, [`ACK_WAIT`]) could still accept.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cache::keys::hex;
use crate::cache::pubsub::Subscriber;
use crate::cache::{Cache, CacheUnavailable};

/// The pub/sub topic of revocations: `{p}:{bus}:revoked`, payload `"{nonce} {sha256 hex}"`.
pub const TOPIC: &str = "revoked";

/// How long a logout waits for every subscribed process to acknowledge its revocation.
pub const ACK_WAIT: Duration = Duration::from_millis(500);

/// Counters of the token cache since start (for `/healthz` and tests).
#[derive(Debug, Default)]
pub struct TokenStats {
    /// Tokens answered from this process's memory.
    pub hits: AtomicU64,
    /// Revocations this process applied (its own and other processes').
    pub revocations: AtomicU64,
    /// Logouts whose revocation not every subscriber acknowledged within [`ACK_WAIT`].
    pub unconfirmed: AtomicU64,
}

/// Recently seen tokens of this process; see the module docs. Shared through
/// [`crate::state::AppState`].
pub struct TokenCache {
    entries: Mutex<HashMap<[u8; 32], (i64, Instant)>>,
    ttl: Duration,
    capacity: usize,
    /// Bumped by every revocation heard and every loss of the subscription.
    epoch: AtomicU64,
    /// The cache's fences plus recoveries (`Stats`) the memory was last checked against: a fence
    /// (Redis came back with other data, e.g. an old snapshot that still holds revoked tokens)
    /// or Redis coming back after being marked down clears the memory too.
    fences: AtomicU64,
    subscriber: Arc<Subscriber>,
    cache: Cache,
    stop: tokio::sync::watch::Receiver<bool>,
    /// This process's name in acknowledgement sets (random).
    me: u64,
    /// The counters.
    pub stats: TokenStats,
}

/// What [`TokenCache::begin`] saw: hand it back to [`TokenCache::insert`].
#[derive(Debug, Clone, Copy)]
pub struct Lookup(u64, u64);

impl TokenCache {
    /// A token cache fed by `subscriber` (its `{p}:{bus}:revoked` route is added here; `stop` ends
    /// the subscription), keeping up to `capacity` tokens for `ttl` each; a zero `ttl` (or the
    /// cache off) disables it.
    pub fn new(
        subscriber: &Arc<Subscriber>,
        cache: &Cache,
        stop: tokio::sync::watch::Receiver<bool>,
        ttl: Duration,
        capacity: usize,
    ) -> Arc<Self> {
        let tokens = Arc::new(TokenCache {
            entries: Mutex::new(HashMap::new()),
            ttl,
            capacity,
            epoch: AtomicU64::new(0),
            fences: AtomicU64::new(0),
            subscriber: subscriber.clone(),
            cache: cache.clone(),
            stop,
            me: rand::random(),
            stats: TokenStats::default(),
        });
        if tokens.enabled() {
            let (on_message, on_lost) = (Arc::downgrade(&tokens), Arc::downgrade(&tokens));
            subscriber.route(
                TOPIC,
                move |payload| {
                    if let Some(me) = on_message.upgrade() {
                        me.heard(payload);
                    }
                },
                move || {
                    if let Some(me) = on_lost.upgrade() {
                        me.forget(None);
                    }
                },
            );
        }
        tokens
    }

    fn enabled(&self) -> bool {
        !self.ttl.is_zero() && self.capacity > 0 && self.cache.enabled()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], (i64, Instant)>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The user of a token (by SHA-256) if this process may answer from memory. Starts the
    /// subscription on first use.
    pub fn get(&self, hash: &[u8]) -> Option<i64> {
        if !self.enabled() {
            return None;
        }
        if !self.subscriber.subscribed() {
            self.subscriber.start(&self.cache, &self.stop);
            return None;
        }
        if !self.cache.available() {
            return None;
        }
        let key: [u8; 32] = hash.try_into().ok()?;
        let fences = self.fence_count();
        if self.fences.swap(fences, Ordering::AcqRel) != fences {
            self.forget(None);
            return None;
        }
        let found = match self.lock().get(&key) {
            Some((user, at)) if at.elapsed() < self.ttl => Some(*user),
            _ => None,
        };
        if found.is_some() {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// Call before looking a token up in Redis or Postgres.
    pub fn begin(&self) -> Lookup {
        Lookup(self.epoch.load(Ordering::Acquire), self.fence_count())
    }

    fn fence_count(&self) -> u64 {
        self.cache.stats().map_or(0, |s| {
            s.fences.load(Ordering::Acquire) + s.recoveries.load(Ordering::Acquire)
        })
    }

    /// Remembers a valid token found by a lookup that began at `lookup`, unless a revocation
    /// was heard (or the subscription broke) since, or the subscription is down.
    pub fn insert(&self, lookup: Lookup, hash: &[u8], user: i64) {
        let Ok(key) = <[u8; 32]>::try_from(hash) else {
            return;
        };
        if !self.enabled() || !self.subscriber.subscribed() {
            return;
        }
        let mut entries = self.lock();
        // Checked under the lock that `heard` takes too: a revocation is either counted
        // before this check or removes the entry after this insert.
        if self.epoch.load(Ordering::Acquire) != lookup.0 || self.fence_count() != lookup.1 {
            return;
        }
        if entries.len() >= self.capacity {
            let ttl = self.ttl;
            entries.retain(|_, (_, at)| at.elapsed() < ttl);
            if entries.len() >= self.capacity {
                entries.clear();
            }
        }
        entries.insert(key, (user, Instant::now()));
    }

    /// Forgets one token, or every one (`None`), and counts it as a revocation for lookups in
    /// flight (under the lock `insert` checks the count with, so none of them stores what it
    /// found before).
    fn forget(&self, token: Option<&[u8; 32]>) {
        let mut entries = self.lock();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        match token {
            Some(key) => {
                entries.remove(key);
            }
            None => entries.clear(),
        }
    }

    /// A revocation message from any process (this one included): forget the token, then
    /// acknowledge.
    fn heard(&self, payload: &str) {
        let Some((nonce, hex)) = payload.split_once(' ') else {
            return;
        };
        let Some(hash) = from_hex(hex) else { return };
        self.forget(Some(&hash));
        self.stats.revocations.fetch_add(1, Ordering::Relaxed);
        let (cache, key, me) = (self.cache.clone(), ack_key(&self.cache, nonce), self.me);
        if let Some(key) = key {
            tokio::spawn(async move {
                // A set of process names, not a counter: an acknowledgement sent twice (a
                // retried pipeline) counts once.
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
    }

    /// Revokes a token in every process's memory and waits (at most [`ACK_WAIT`]) until every
    /// subscribed process acknowledged. Call after the revocation committed and the Redis
    /// tombstone was written. Returns whether every process confirmed.
    pub async fn revoke(&self, hash: &[u8]) -> bool {
        if let Ok(key) = <[u8; 32]>::try_from(hash) {
            self.forget(Some(&key));
        }
        if !self.cache.enabled() {
            return true;
        }
        let confirmed = broadcast(&self.cache, &hex(hash)).await.unwrap_or(false);
        if !confirmed {
            self.stats.unconfirmed.fetch_add(1, Ordering::Relaxed);
        }
        confirmed
    }

    /// How many tokens this process holds now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Publishes the revocation of the token with SHA-256 `hex` and waits (at most [`ACK_WAIT`])
/// until every process subscribed now has dropped it from memory. Also used by the outbox relay
/// for a logout whose process died before it could announce it. Returns whether every process
/// confirmed (a process that did not stops trusting its memory within
/// `CHIRP_TOKEN_CACHE_SECS`).
///
/// # Errors
/// The revocation could not be published (Redis off or down).
pub async fn broadcast(cache: &Cache, hex: &str) -> Result<bool, CacheUnavailable> {
    let nonce = format!("{:016x}", rand::random::<u64>());
    let receivers = cache
        .publish_counted(TOPIC, &format!("{nonce} {hex}"))
        .await?;
    let key = ack_key(cache, &nonce).ok_or(CacheUnavailable)?;
    let deadline = Instant::now() + ACK_WAIT;
    loop {
        let mut pipe = redis::pipe();
        pipe.cmd("SCARD").arg(&key);
        let acks = cache.run_unchecked::<(u64,)>(&pipe, 1).await;
        if acks.is_ok_and(|(n,)| n >= receivers) {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                receivers,
                "not every process confirmed a token revocation within {ACK_WAIT:?}; one that \
                 missed it forgets the token within CHIRP_TOKEN_CACHE_SECS"
            );
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The SHA-256 hex of a token key `{p}:{k<hex>}:token` (see [`super::Keys::token`]).
pub fn hex_of_token_key(key: &str) -> Option<&str> {
    let start = key.find(":{k")? + 3;
    let hex = key.get(start..)?.strip_suffix("}:token")?;
    (hex.len() == 64).then_some(hex)
}

/// `{p}:{r<nonce>}:acks`.
fn ack_key(cache: &Cache, nonce: &str) -> Option<String> {
    Some(format!("{}:{{r{nonce}}}:acks", cache.keys()?.prefix()))
}

fn from_hex(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}
