//! Per-circle daily ranks (the per-circle daily rank with 30-day expiry of the NSQ + Redis feed
//! design): one sorted set per circle and UTC day, scored by likes + comments, kept exact by the
//! versioned write-through of [`scripts::RANK_SET`] and rebuilt from Postgres on a miss with the
//! same begin-load / fill generations as the timelines. The rank feature is
//! [`crate::circles`].

use crate::cache::{Cache, CacheUnavailable, Generation, Keys, ListKey, Owner, scripts};
use crate::time::{self, Timestamp};

/// TTL of a cached rank and its versions: 30 days, in seconds.
pub const RANK_TTL_SECS: u64 = 30 * 24 * 3600;

/// The rank of circle `circle` on UTC day `day` (`yyyymmdd`).
pub fn rank_key(circle: i64, day: u32) -> ListKey {
    ListKey::new(Owner::CircleDay(circle, day), "rank")
}

/// The member of a tweet in a rank: `"{created_at µs, 17 digits}:{tweet_id}:{author_id}"`, so
/// that members of equal score sort newest first in reverse order.
pub fn rank_member(created_at: Timestamp, tweet_id: i64, author_id: i64) -> String {
    format!("{:017}:{tweet_id}:{author_id}", time::to_micros(created_at))
}

/// Decodes a rank member into `(created_at, tweet_id, author_id)`.
pub fn parse_rank_member(member: &str) -> Option<(Timestamp, i64, i64)> {
    let mut parts = member.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (Some(Some(at)), Some(Some(tweet)), Some(Some(author))) =
        (parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    Some((time::from_micros(at), tweet, author))
}

/// One tweet's place in a rank: `(member, score, counts_version)`.
pub type RankEntry = (String, i64, i64);

impl Cache {
    /// The `count` best `(member, score)` of a cached rank, best first; `Ok(None)`: not cached.
    pub async fn rank_range(
        &self,
        rank: ListKey,
        count: usize,
    ) -> Result<Option<Vec<(String, i64)>>, CacheUnavailable> {
        let inner = self.live()?;
        let mut pipe = redis::pipe();
        pipe.invoke_script(scripts::RANK_RANGE.key(inner.keys.list(rank)).arg(count));
        let (raw,): (Option<Vec<String>>,) = self.run(&pipe).await?;
        Ok(raw.map(|raw| {
            raw.chunks_exact(2)
                .filter_map(|pair| Some((pair[0].clone(), pair[1].parse::<f64>().ok()? as i64)))
                .collect()
        }))
    }

    /// Stores a rank rebuilt from Postgres unless it is cached or was written since
    /// `generation` (see [`Cache::begin_load`]). Returns whether it was stored.
    pub async fn rank_fill(
        &self,
        rank: ListKey,
        generation: &Generation,
        entries: &[RankEntry],
    ) -> Result<bool, CacheUnavailable> {
        let inner = self.live()?;
        let key = inner.keys.list(rank);
        let mut inv = scripts::RANK_FILL.key(&key);
        inv.key(Keys::gen_of(&key))
            .key(Keys::versions_of(&key))
            .arg(&generation.0)
            .arg(RANK_TTL_SECS);
        for (member, score, version) in entries {
            inv.arg(*score).arg(member).arg(*version);
        }
        let mut pipe = redis::pipe();
        pipe.invoke_script(&inv);
        let (stored,): (i64,) = self.run_bulk(&pipe, entries.len()).await?;
        Ok(stored == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_members_sort_newest_first_and_parse_back() {
        let older = time::from_micros(1_700_000_000_000_000);
        let newer = time::from_micros(1_700_000_000_000_001);
        let (a, b) = (rank_member(older, 9, 1), rank_member(newer, 8, 2));
        assert!(b > a, "a newer tweet's member is greater");
        assert_eq!(parse_rank_member(&b), Some((newer, 8, 2)));
        assert_eq!(parse_rank_member("x:1:2"), None);
    }
}
