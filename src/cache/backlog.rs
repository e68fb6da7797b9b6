//! Chores on cached chat backlogs ([`crate::chat`]): find them, trim them, drop idle ones.

use crate::cache::{Cache, CacheUnavailable, Keys, ListKey, Owner, scripts};

/// The cached backlog of chat channel `id` (`{p}:{ch5}:msgs`).
pub fn backlog_key(id: i64) -> ListKey {
    ListKey::new(Owner::Channel(id), "msgs")
}

impl Cache {
    /// The channels whose backlog is cached (a `SCAN` of this prefix's backlog keys, on every master of a cluster).
    ///
    /// # Errors
    /// Redis is off or failed.
    pub async fn cached_backlogs(&self) -> Result<Vec<i64>, CacheUnavailable> {
        let inner = self.live()?;
        let mut scan = self.scan(inner.keys.backlogs_pattern()).await?;
        let mut ids = Vec::new();
        while let Some(keys) = scan.next().await? {
            ids.extend(keys.iter().filter_map(|k| inner.keys.backlog_channel(k)));
        }
        Ok(ids)
    }

    /// Trims each backlog to its newest `keep` messages (a trimmed backlog is no longer
    /// complete: the lowest ranks, the completeness marker first, go).
    ///
    /// # Errors
    /// Redis is off or failed.
    pub async fn trim_backlogs(
        &self,
        channels: &[i64],
        keep: usize,
    ) -> Result<(), CacheUnavailable> {
        let inner = self.live()?;
        if channels.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        let keep = i64::try_from(keep).unwrap_or(i64::MAX);
        for id in channels {
            pipe.cmd("ZREMRANGEBYRANK")
                .arg(inner.keys.list(backlog_key(*id)))
                .arg(0)
                .arg(-keep - 1)
                .ignore();
        }
        self.run_bulk::<()>(&pipe, channels.len()).await
    }

    /// Drops the backlogs of `channels` (bumping their generations, so no load in flight
    /// stores an old one).
    ///
    /// # Errors
    /// Redis is off or failed.
    pub async fn drop_backlogs(&self, channels: &[i64]) -> Result<(), CacheUnavailable> {
        let inner = self.live()?;
        if channels.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for id in channels {
            let key = inner.keys.list(backlog_key(*id));
            pipe.invoke_script(
                scripts::INVALIDATE
                    .key(&key)
                    .key(Keys::gen_of(&key))
                    .arg(inner.ttl_secs),
            )
            .ignore();
        }
        self.run_bulk::<()>(&pipe, channels.len()).await
    }
}
