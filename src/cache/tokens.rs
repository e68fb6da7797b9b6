//! The in-process token cache: the user id of recently seen bearer tokens, kept in this
//! process's memory so that an authenticated request costs no Redis round trip, with revocation
//! that stays immediate across processes.
//!
//! **Revocation.** A logout commits in Postgres, forgets the token in this process
//! ([`TokenCache::forget_token`]), and its commit's cache step ([`super::Cache::finish`])
//! tombstones the token in Redis ([`super::Update::TokenRevoked`]) and then [`broadcast`]s its
//! hash on `{p}:{bus}:revoked`, waiting until every process that may hold a lease on its memory
//! has dropped the token and acknowledged, or has lost its lease ([`super::lease`]). Only then
//! does the logout answer, so once a client has seen its logout succeed, no process accepts
//! the token. A logout whose process can not reach Redis hands its outbox row to the others
//! and waits for them, or for the leases to run out.
//!
//! The mechanism (when memory is trusted, the eviction counter, the acknowledgements, the
//! lease) is the [`super::near`] cache's; entries also live at most `CHIRP_TOKEN_CACHE_SECS`.

use std::sync::Arc;
use std::time::Duration;

use crate::cache::keys::hex;
use crate::cache::near::{Lookup, Near, NearKey};
use crate::cache::pubsub::Subscriber;
use crate::cache::{Cache, CacheUnavailable, near};

/// The pub/sub topic of revocations: `{p}:{bus}:revoked`, payload `"{nonce} {sha256 hex}"`.
pub const TOPIC: &str = "revoked";

/// A token's SHA-256, as an eviction message carries it: 64 hex digits.
impl NearKey for [u8; 32] {
    fn to_message(&self) -> String {
        hex(self)
    }
    fn from_message(text: &str) -> Option<Self> {
        from_hex(text)
    }
}

/// Recently seen tokens of this process (SHA-256 → user id), a [`Near`] cache; see the module
/// docs. Shared through [`crate::state::AppState`]; its counters are `stats` (`evictions`
/// counts the revocations applied).
pub struct TokenCache {
    near: Arc<Near<[u8; 32], i64>>,
    cache: Cache,
    /// Tokens Postgres did not know (or Redis held revoked), until when: a negative cache, so
    /// a client repeating a bad token costs no round trip. Needs no invalidation: a token
    /// never becomes valid after a lookup missed it.
    unknown: std::sync::Mutex<std::collections::HashMap<[u8; 32], std::time::Instant>>,
}

/// How long a process remembers an unknown token.
const UNKNOWN_TTL: Duration = Duration::from_secs(60);
/// Most unknown tokens a process remembers (32 bytes and an instant each); past it, the
/// expired ones are dropped, then all.
const UNKNOWN_CAPACITY: usize = 50_000;

impl std::ops::Deref for TokenCache {
    type Target = Near<[u8; 32], i64>;
    fn deref(&self) -> &Self::Target {
        &self.near
    }
}

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
        let near = Near::new(TOPIC, ttl, capacity);
        near.attach(subscriber, cache, stop);
        Arc::new(TokenCache {
            near,
            cache: cache.clone(),
            unknown: std::sync::Mutex::default(),
        })
    }

    /// The user of a token (by SHA-256) if this process may answer from memory. Starts the
    /// subscription on first use.
    pub fn get(&self, hash: &[u8]) -> Option<i64> {
        let key: [u8; 32] = hash.try_into().ok()?;
        self.near.get(&self.cache, &key)
    }

    /// Call before looking a token up in Redis or Postgres.
    pub fn begin(&self) -> Lookup {
        self.near.begin(&self.cache)
    }

    /// Remembers a valid token found by a lookup that began at `lookup`, unless a revocation
    /// was heard (or the subscription broke) since, or the subscription is down.
    pub fn insert(&self, lookup: Lookup, hash: &[u8], user: i64) {
        if let Ok(key) = <[u8; 32]>::try_from(hash) {
            self.near.insert(&self.cache, lookup, [(key, user)]);
        }
    }

    /// Whether this process saw the token (by SHA-256) unknown or revoked in the last
    /// minute.
    pub fn is_unknown(&self, hash: &[u8]) -> bool {
        let Ok(key) = <[u8; 32]>::try_from(hash) else {
            return false;
        };
        let unknown = self.unknown.lock().unwrap_or_else(|p| p.into_inner());
        unknown
            .get(&key)
            .is_some_and(|until| *until > std::time::Instant::now())
    }

    /// Remembers a token (by SHA-256) that a lookup found unknown or revoked.
    pub fn remember_unknown(&self, hash: &[u8]) {
        let Ok(key) = <[u8; 32]>::try_from(hash) else {
            return;
        };
        let now = std::time::Instant::now();
        let mut unknown = self.unknown.lock().unwrap_or_else(|p| p.into_inner());
        if unknown.len() >= UNKNOWN_CAPACITY {
            unknown.retain(|_, until| *until > now);
            if unknown.len() >= UNKNOWN_CAPACITY {
                unknown.clear();
            }
        }
        unknown.insert(key, now + UNKNOWN_TTL);
    }

    /// Forgets a token in this process's memory (a logout, before its commit's cache step
    /// revokes it in every process: [`super::Cache::finish`]).
    pub fn forget_token(&self, hash: &[u8]) {
        if let Ok(key) = <[u8; 32]>::try_from(hash) {
            self.near.forget_here(&[key]);
        }
    }
}

/// Publishes the revocation of the token with SHA-256 `hex` and waits (at most a lease bound)
/// until every process subscribed now has dropped it from memory: the outbox relay's part for
/// a logout whose process died before it could announce it ([`near::broadcast`]).
///
/// # Errors
/// The revocation could not be published (Redis off or down).
pub async fn broadcast(cache: &Cache, hex: &str) -> Result<bool, CacheUnavailable> {
    near::broadcast(cache, TOPIC, &[hex.to_owned()]).await
}

/// The SHA-256 hex of a token key `{p}:{k<hex>}:token` (see [`super::Keys::token`]).
pub fn hex_of_token_key(key: &str) -> Option<&str> {
    let start = key.find(":{k")? + 3;
    let hex = key.get(start..)?.strip_suffix("}:token")?;
    (hex.len() == 64).then_some(hex)
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
