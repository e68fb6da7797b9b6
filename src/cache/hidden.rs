//! Hidden sets: whom each viewer must not see (the accounts the viewer mutes or blocks, and
//! those who block the viewer), cached in Redis as one versioned string per viewer
//! (`{p}:{u42}:hidden`) and held whole in each process's near cache ([`NearId::Hidden`]).
//!
//! Timelines are filtered with it at read time (as Misskey does; Mastodon purges rows from home
//! feeds instead and leaks through boosts: mastodon/mastodon#7813): a mute changes one small
//! value per viewer, never a fan-out row, so cached pages, Postgres pages and streams all read
//! the same set (docs/decisions/0021-read-time-visibility.md). The value is versioned by
//! `users.hidden_version`, bumped in the transaction of every mute and block that changes it,
//! and written with [`super::scripts::SET_IF_NEWER`] by writers and by readers that load it from
//! Postgres, so a slow reader can not put back an older set; the writer's outbox repair evicts
//! it from every process's memory before the mute answers ([`super::near`]).

use std::sync::Arc;

use super::counts::Versioned;
use super::deferred::Deferred;
use super::held::{NearId, NearObject};
use super::near::Lookup;
use crate::cache::{Cache, CacheUnavailable};

/// Whom one viewer must not see, as of `version` (`users.hidden_version`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hidden {
    /// `users.hidden_version` of the viewer when the set was read.
    pub version: i64,
    /// The accounts the viewer mutes or blocks, and those who block the viewer, sorted: their
    /// tweets leave the viewer's newsfeed, list and circle timelines, streams and
    /// notifications.
    pub hidden: Box<[i64]>,
    /// The accounts that block the viewer, sorted: their tweets and timeline are 404 to the
    /// viewer.
    pub blocked_by: Box<[i64]>,
}

impl Hidden {
    /// A set from unsorted ids (`blocked_by` is a part of `hidden`; it is added if not).
    pub fn new(version: i64, mut hidden: Vec<i64>, mut blocked_by: Vec<i64>) -> Self {
        hidden.extend_from_slice(&blocked_by);
        hidden.sort_unstable();
        hidden.dedup();
        blocked_by.sort_unstable();
        blocked_by.dedup();
        Hidden {
            version,
            hidden: hidden.into(),
            blocked_by: blocked_by.into(),
        }
    }

    /// Whether nobody is hidden (the common case: reads then filter nothing).
    pub fn is_empty(&self) -> bool {
        self.hidden.is_empty()
    }

    /// Whether `user`'s tweets are hidden from the viewer.
    pub fn hides(&self, user: i64) -> bool {
        self.hidden.binary_search(&user).is_ok()
    }

    /// Whether `user` blocks the viewer.
    pub fn blocked_by(&self, user: i64) -> bool {
        self.blocked_by.binary_search(&user).is_ok()
    }
}

/// Stored as `"{version}|h{,id}...;{,id}..."`: the marker `h` after the version tells a value
/// from the outbox relay's floor `"{version}|"` (a miss); the hidden ids, then after `;` the
/// blocking ones.
impl Versioned for Hidden {
    fn version(&self) -> i64 {
        self.version
    }

    fn encode(&self) -> String {
        let mut out = String::with_capacity(24 + 12 * (self.hidden.len() + self.blocked_by.len()));
        out.push_str(itoa::Buffer::new().format(self.version));
        out.push_str("|h");
        for id in self.hidden.iter() {
            out.push(',');
            out.push_str(itoa::Buffer::new().format(*id));
        }
        out.push(';');
        for id in self.blocked_by.iter() {
            out.push(',');
            out.push_str(itoa::Buffer::new().format(*id));
        }
        out
    }

    fn decode(raw: &str) -> Option<Self> {
        let (version, rest) = raw.split_once('|')?;
        let (hidden, blocked_by) = rest.strip_prefix('h')?.split_once(';')?;
        let ids = |text: &str| -> Option<Vec<i64>> {
            if text.is_empty() {
                return Some(Vec::new());
            }
            (text.strip_prefix(',')?.split(','))
                .map(|id| id.parse().ok())
                .collect()
        };
        Some(Hidden::new(
            version.parse().ok()?,
            ids(hidden)?,
            ids(blocked_by)?,
        ))
    }
}

impl Cache {
    /// `user`'s hidden set from this process's near cache, else from Redis (one `GET`);
    /// `Ok(None)` if Redis does not hold it (load it from Postgres and [`Cache::put_hidden`]),
    /// with the lookup to hand to [`Cache::put_hidden`].
    ///
    /// # Errors
    /// Redis is not in use or failed.
    pub async fn get_hidden(
        &self,
        user: i64,
    ) -> Result<(Option<Arc<Hidden>>, Option<Lookup>), CacheUnavailable> {
        let keys = self.keys().ok_or(CacheUnavailable)?;
        let near = self.near_objects();
        let lookup = near.map(|n| n.begin(self));
        if let Some(NearObject::Hidden(held)) =
            near.and_then(|n| n.get(self, &NearId::Hidden(user)))
        {
            return Ok((Some(held), lookup));
        }
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(keys.hidden(user));
        let (raw,): (Option<String>,) = self.run(&pipe).await?;
        let found = raw.as_deref().and_then(Hidden::decode).map(Arc::new);
        if let (Some(hidden), Some(near), Some(lookup)) = (&found, near, lookup) {
            near.insert(
                self,
                lookup,
                [(NearId::Hidden(user), NearObject::Hidden(hidden.clone()))],
            );
        }
        Ok((found, lookup))
    }

    /// Caches `user`'s hidden set loaded from Postgres by a read whose [`Cache::get_hidden`]
    /// began at `lookup`, unless a newer one is cached (Redis) or it was evicted since (this
    /// process's memory). Best effort.
    pub async fn put_hidden(&self, lookup: Option<Lookup>, user: i64, hidden: &Arc<Hidden>) {
        let mut pipe = redis::pipe();
        self.pipe_put_hidden(&mut pipe, user, hidden);
        if self.run::<()>(&pipe).await.is_ok() {
            self.hold_hidden(lookup, user, hidden.clone());
        }
    }

    /// A lookup of this process's near cache, to begin before a hidden set is read from
    /// Postgres other than after [`Cache::get_hidden`] (with a token:
    /// [`Cache::token_and_hidden_fill`]); `None` with the cache off.
    pub fn begin_hidden_lookup(&self) -> Option<Lookup> {
        self.near_objects().map(|n| n.begin(self))
    }

    /// The cache fill of a token's user (`SET NX`: a revocation written meanwhile wins) and
    /// that user's hidden set, both read from Postgres by one statement when the token was in
    /// neither cache ([`crate::accounts::load_token`]); the set as [`Cache::put_hidden`] writes
    /// it, and held in this process's memory once Redis holds it unless it was evicted since
    /// `lookup` ([`Cache::begin_hidden_lookup`], begun before the statement). A returning
    /// user's first request then needs no round trips of its own for the set its timelines are
    /// filtered with (issue 42), nor for this fill: the request defers it to its first read
    /// ([`Cache::deferring`], decision 0037). `None` with the cache off.
    pub fn token_and_hidden_fill(
        &self,
        hash: &[u8],
        lookup: Option<Lookup>,
        user: i64,
        hidden: &Arc<Hidden>,
    ) -> Option<Deferred> {
        let ttl = self.ttl()?;
        let mut pipe = redis::pipe();
        self.pipe_set_token_nx(&mut pipe, hash, itoa::Buffer::new().format(user), ttl);
        self.pipe_put_hidden(&mut pipe, user, hidden);
        let hidden = hidden.clone();
        Some(Deferred::new(pipe, move |cache: &Cache| {
            cache.hold_hidden(lookup, user, hidden);
        }))
    }

    /// Adds the hidden set's versioned write to `pipe`.
    fn pipe_put_hidden(&self, pipe: &mut redis::Pipeline, user: i64, hidden: &Hidden) {
        let Some(keys) = self.keys() else { return };
        self.pipe_put_versioned(pipe, keys.hidden(user), hidden.version, hidden.encode());
    }

    /// Holds `user`'s hidden set, which Redis holds now, in this process's memory unless it
    /// was evicted since `lookup`.
    fn hold_hidden(&self, lookup: Option<Lookup>, user: i64, hidden: Arc<Hidden>) {
        if let (Some(near), Some(lookup)) = (self.near_objects(), lookup) {
            near.insert(
                self,
                lookup,
                [(NearId::Hidden(user), NearObject::Hidden(hidden))],
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hidden_set_round_trips_and_the_relays_floor_is_a_miss() {
        for set in [
            Hidden::new(0, vec![], vec![]),
            Hidden::new(7, vec![9, 3], vec![]),
            Hidden::new(8, vec![3], vec![12, 5]),
        ] {
            assert_eq!(Hidden::decode(&set.encode()), Some(set.clone()));
        }
        let set = Hidden::new(8, vec![3], vec![12]);
        assert_eq!(set.encode(), "8|h,3,12;,12");
        assert!(set.hides(12) && set.hides(3) && !set.hides(5));
        assert!(set.blocked_by(12) && !set.blocked_by(3));
        for bad in ["8|", "8|h", "x|h;", "8|h,a;", "8|h3;", ""] {
            assert_eq!(Hidden::decode(bad), None, "{bad:?}");
        }
    }
}
