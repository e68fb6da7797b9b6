//! Stream leases: at most `CHIRP_STREAMS_PER_USER` concurrent streams per user across every
//! chirp process. `{p}:{u42}:streams` is a sorted set of stream ids scored by lease expiry
//! (ms, Redis's clock): a stream renews its lease with each heartbeat and releases it when it
//! ends, and a process that dies leaves leases that expire on their own.

use std::time::Duration;

use crate::cache::keys::{ListKey, Owner};
use crate::cache::{Cache, CacheUnavailable, scripts};

/// The name of a user's stream leases after the hash tag.
const STREAMS: &str = "streams";

impl Cache {
    fn leases_key(&self, user_id: i64) -> Result<String, CacheUnavailable> {
        let keys = self.keys().ok_or(CacheUnavailable)?;
        Ok(keys.list(ListKey::new(Owner::User(user_id), STREAMS)))
    }

    /// Takes (`renew` false) or extends (`renew` true) the lease of stream `stream` of user
    /// `user_id` for `lease`. Returns false when the user holds `limit` live leases already
    /// (a renewal always succeeds).
    ///
    /// # Errors
    /// Redis is off, down or failed.
    pub async fn stream_lease(
        &self,
        user_id: i64,
        stream: &str,
        limit: usize,
        lease: Duration,
        renew: bool,
    ) -> Result<bool, CacheUnavailable> {
        let mut inv = scripts::STREAM_LEASE.key(self.leases_key(user_id)?);
        inv.arg(stream)
            .arg(limit)
            .arg(lease.as_millis() as u64)
            .arg(if renew { "1" } else { "0" });
        let mut pipe = redis::pipe();
        pipe.invoke_script(&inv);
        let (held,): (i64,) = self.run(&pipe).await?;
        Ok(held == 1)
    }

    /// Gives back the lease of stream `stream` of user `user_id`.
    ///
    /// # Errors
    /// Redis is off, down or failed (the lease then expires on its own).
    pub async fn release_stream(&self, user_id: i64, stream: &str) -> Result<(), CacheUnavailable> {
        let mut pipe = redis::pipe();
        pipe.cmd("ZREM")
            .arg(self.leases_key(user_id)?)
            .arg(stream)
            .ignore();
        self.run::<()>(&pipe).await
    }
}
