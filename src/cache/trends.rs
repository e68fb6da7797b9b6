//! The trends every process shares ([`crate::hashtags::Trends`]): the last count of each
//! window, kept for as long as it is fresh (its TTL), and a lock that lets one process of the
//! fleet count a window at a time while the others wait for its result (a stampede guard, as a
//! timeline's single-flight fill).

use std::time::Duration;

use super::{Cache, CacheUnavailable};

impl Cache {
    /// The shared count of `window`'s trends (its JSON) and how long it stays fresh; `None` if
    /// none is (the last one expired).
    ///
    /// # Errors
    /// Redis is off or failed.
    pub async fn cached_trends(
        &self,
        window: &str,
    ) -> Result<Option<(String, Duration)>, CacheUnavailable> {
        let inner = self.live()?;
        let (key, _) = inner.keys.trends(window);
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(&key).cmd("PTTL").arg(&key);
        let (json, ttl): (Option<String>, i64) = self.run(&pipe).await?;
        let ttl = u64::try_from(ttl).ok().filter(|ms| *ms > 0);
        Ok(json.zip(ttl).map(|(j, ms)| (j, Duration::from_millis(ms))))
    }

    /// Takes the lock on counting `window` for `hold` at most; `true` if this call took it.
    ///
    /// # Errors
    /// Redis is off or failed.
    pub async fn lock_trends(
        &self,
        window: &str,
        hold: Duration,
    ) -> Result<bool, CacheUnavailable> {
        let inner = self.live()?;
        let (_, lock) = inner.keys.trends(window);
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(&lock)
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(u64::try_from(hold.as_millis()).unwrap_or(u64::MAX));
        let (taken,): (Option<String>,) = self.run(&pipe).await?;
        Ok(taken.is_some())
    }

    /// Releases the lock on counting `window` (a count that failed or came too late to store).
    ///
    /// # Errors
    /// Redis is off or failed.
    pub async fn unlock_trends(&self, window: &str) -> Result<(), CacheUnavailable> {
        let inner = self.live()?;
        let (_, lock) = inner.keys.trends(window);
        let mut pipe = redis::pipe();
        pipe.cmd("DEL").arg(&lock).ignore();
        self.run(&pipe).await
    }

    /// Stores a count of `window` (JSON), fresh for `fresh` (what is left of its freshness since
    /// its count began), and releases the lock. (Any holder's lock: one that expired while this
    /// count ran lets one more process count, which costs a count, not correctness.)
    ///
    /// # Errors
    /// Redis is off or failed.
    pub async fn store_trends(
        &self,
        window: &str,
        json: &str,
        fresh: Duration,
    ) -> Result<(), CacheUnavailable> {
        let inner = self.live()?;
        let (key, lock) = inner.keys.trends(window);
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(&key)
            .arg(json)
            .arg("PX")
            .arg(u64::try_from(fresh.as_millis()).unwrap_or(u64::MAX).max(1))
            .ignore()
            .cmd("DEL")
            .arg(&lock)
            .ignore();
        self.run(&pipe).await
    }
}
