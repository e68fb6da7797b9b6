//! Recent writers, shared by every process through Redis: read-your-writes for the reads a
//! Postgres replica serves ([`crate::replica`]) that follows the user, not the process that
//! took the write (a second device, a re-login with a new token, or a rehash behind
//! HAProxy's `balance hdr(Authorization)` lands on another process). One key per writer,
//! `{p}:{u42}:wrote`, expiring with the read-your-writes window.

use std::time::Duration;

use crate::cache::{Cache, CacheUnavailable};

impl Cache {
    /// Marks `user` as a writer for `window` (`SET … PX`, one round trip).
    ///
    /// # Errors
    /// Redis is off or did not answer.
    pub async fn mark_writer(&self, user: i64, window: Duration) -> Result<(), CacheUnavailable> {
        let keys = self.keys().ok_or(CacheUnavailable)?;
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(keys.wrote(user))
            .arg(1)
            .arg("PX")
            .arg(u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1))
            .ignore();
        self.run::<()>(&pipe).await
    }

    /// Whether any process marked `user` as a writer within its window (`EXISTS`, one round
    /// trip).
    ///
    /// # Errors
    /// Redis is off or did not answer (the caller then reads the primary).
    pub async fn wrote_recently(&self, user: i64) -> Result<bool, CacheUnavailable> {
        let keys = self.keys().ok_or(CacheUnavailable)?;
        let mut pipe = redis::pipe();
        pipe.cmd("EXISTS").arg(keys.wrote(user));
        let (found,): (i64,) = self.run(&pipe).await?;
        Ok(found > 0)
    }
}
