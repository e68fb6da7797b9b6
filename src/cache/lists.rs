//! Primitives on cached lists (sorted sets) and their generations: read a window, start a load,
//! store a load, read merge guards. The timeline feature ([`crate::timeline`]) builds its
//! cache-aside read path from these.

use std::sync::atomic::Ordering;

use crate::cache::objects::{
    LIKED_SAMPLE, LikedAmong, decode_counts, decode_liked, pipe_counts, pipe_liked,
};
use crate::cache::{Cache, CacheUnavailable, Keys, ListKey, Owner, scripts};
use crate::model::TweetCounts;

/// A list entry to store: `(score = created_at in µs, member bytes)`.
pub type Scored = (i64, Vec<u8>);

/// List members as Redis returns them, in its order.
type Members = Vec<Vec<u8>>;

/// The member that marks a cached list as complete (score `-inf`, so always the lowest rank);
/// see [`scripts`].
pub const MARKER: &str = "#";

/// Packs positive ids into one compact binary list member (Twitter kept its timeline entries as
/// packed binary too, at 20 bytes each): a header byte, then each id big-endian in as few bytes
/// as it needs (1–8). The header holds `length − 1` of every id but the last in 3-bit fields
/// (so at most three ids); the last id's length is what remains. A member is at least two bytes,
/// so it never equals the completeness marker `#`.
///
/// In a listpack-encoded sorted set a member costs its length plus two bytes: a newsfeed entry
/// of (row id 5,781,487, a 64-bit Twitter tweet id, author 568,770,231) is 16 bytes instead of
/// the 37 of its decimal text.
pub fn pack_ids(ids: &[i64]) -> Vec<u8> {
    debug_assert!((1..=3).contains(&ids.len()));
    let mut out = Vec::with_capacity(1 + 8 * ids.len());
    out.push(0);
    let mut header = 0u8;
    for (i, id) in ids.iter().enumerate() {
        let bytes = id.to_be_bytes();
        let skip = (id.leading_zeros() / 8).min(7) as usize;
        if i + 1 < ids.len() {
            header |= ((7 - skip) as u8) << (3 * i);
        }
        out.extend_from_slice(&bytes[skip..]);
    }
    out[0] = header;
    out
}

/// Unpacks a member of [`pack_ids`] holding exactly `N` ids; `None` for anything else.
pub fn unpack_ids<const N: usize>(member: &[u8]) -> Option<[i64; N]> {
    let (&header, mut rest) = member.split_first()?;
    let mut ids = [0i64; N];
    for (i, id) in ids.iter_mut().enumerate() {
        let len = if i + 1 < N {
            usize::from((header >> (3 * i)) & 7) + 1
        } else {
            rest.len()
        };
        if len == 0 || len > 8 || rest.len() < len {
            return None;
        }
        let (bytes, tail) = rest.split_at(len);
        *id = bytes.iter().fold(0i64, |v, b| (v << 8) | i64::from(*b));
        rest = tail;
    }
    Some(ids)
}

/// The generations a loader saw before its Postgres snapshot (`"w:r"`, from
/// [`scripts::BEGIN_LOAD`]); [`Cache::fill`] stores the load only if they are unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation(pub(crate) String);

/// What a cached list says about a range: see [`Cache::range`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Window {
    /// The list holds every item, not only the newest window.
    pub complete: bool,
    /// The lowest score (µs) an incomplete list holds: it has every item at or above it.
    /// `None` on an incomplete list when the window is a full page of `count` items read
    /// without the floor (a page without a lower bound: see [`Cache::range`]); the list then
    /// holds every item down to the lowest of them.
    pub floor: Option<i64>,
    /// Members newest first, strictly inside the requested bounds. Without their scores:
    /// every reader can tell an entry's time from what the member names (a timeline's from the
    /// tweet, a chat backlog's from the message), and a page of 20 then parses 21 replies
    /// fewer (redis-rs spends 800–1,000 instructions on each; BENCHMARKS.md).
    pub items: Vec<Vec<u8>>,
    /// Up to [`LIKED_SAMPLE`] members of the list owner's liked set (`SRANDMEMBER`: all of
    /// them when it holds fewer), read in the same round trip when the read asked for it
    /// (`with_owner_likes`), for [`Cache::fetch_for_hydration`].
    pub owner_likes: Option<Vec<i64>>,
    /// The counters of the tweets the read was asked to prefetch (`prefetch`), in that order,
    /// read in the same round trip (`None`: not cached); empty if none were asked or the read
    /// had a lower bound (see [`Cache::range`] and [`super::pages`]).
    pub prefetched: Vec<Option<TweetCounts>>,
    /// What the liked set of [`Prefetch::liked_by`] says of the prefetched tweets, read in the
    /// same round trip; `None` if it was not asked.
    pub prefetched_liked: Option<LikedAmong>,
}

/// What a range read asks for along with the list, for hydration ([`super::pages`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Prefetch<'a> {
    /// Tweets whose counters to read (the page's tweets the last time it was served).
    pub tweets: &'a [i64],
    /// A viewer whose liked set to ask about them (someone reading another's timeline).
    pub liked_by: Option<i64>,
}

impl Window {
    /// The window from the replies of [`Cache::range`]'s two `ZRANGE`s: the lowest entry with
    /// its score (the completeness marker `#`, or the floor), then up to `count + 1` members in
    /// range (one more, as the marker may be among them).
    fn parse(lowest: Vec<Vec<u8>>, items: Vec<Vec<u8>>, count: usize) -> Option<Self> {
        let mut lowest = lowest.into_iter();
        let first = lowest.next()?; // an empty reply: the list is not cached
        let complete = first == MARKER.as_bytes();
        let floor = if complete {
            None
        } else {
            lowest.next().and_then(|f| parse_score(&f))
        };
        let mut items = items;
        items.retain(|member| member != MARKER.as_bytes());
        items.truncate(count);
        Some(Window {
            complete,
            floor,
            items,
            ..Window::default()
        })
    }
}

fn parse_score(s: &[u8]) -> Option<i64> {
    // Scores are µs timestamps, exact in a double (< 2^53).
    std::str::from_utf8(s)
        .ok()?
        .parse::<f64>()
        .ok()
        .filter(|f| f.is_finite())
        .map(|f| f as i64)
}

impl Cache {
    /// Reads the members of the newest `count` entries strictly between `gt` and `lt` (µs) of a
    /// cached list in one round trip. `Ok(None)`: the list is not cached.
    ///
    /// A page without a lower bound (`gt` unset: a first page, or one below a cursor) first asks
    /// for its `count + 1` newest members alone: their lowest is the completeness marker when
    /// the list holds everything, and `count + 1` real members make a full page, whose floor
    /// nobody needs ([`Window::floor`] is `None`). Only a shorter reply without the marker (an
    /// incomplete list ending inside the page, or no list) asks again for the floor, with the
    /// atomic pair below. One command (with the sample below, two in one pipeline) instead of
    /// `MULTI`, two `ZRANGE`s and `EXEC` (round 6, BENCHMARKS.md).
    ///
    /// `with_owner_likes` (for a list owned by a user: a newsfeed, read by its owner) also asks
    /// for up to [`LIKED_SAMPLE`] members of the owner's liked set in the same round trip
    /// ([`Window::owner_likes`]): it shares the list's hash tag, and a viewer with fewer likes
    /// than that then needs no `SMISMEMBER` of the page's tweets and its 22 replies (BENCHMARKS.md,
    /// round 8).
    ///
    /// `prefetch` (tweet ids this page showed the last time, from [`super::pages`]) also asks
    /// for their counters, and whether its viewer liked them, in the same round trip
    /// ([`Window::prefetched`], [`Window::prefetched_liked`]), so that hydration needs no
    /// second one when the page did not change. Only a page without a lower bound takes them
    /// (the atomic pair stays within the list's slot).
    pub async fn range(
        &self,
        list: ListKey,
        lt: Option<i64>,
        gt: Option<i64>,
        count: usize,
        with_owner_likes: bool,
        prefetch: Prefetch<'_>,
    ) -> Result<Option<Window>, CacheUnavailable> {
        let inner = self.live()?;
        let key = inner.keys.list(list);
        let liked = match list.owner {
            Owner::User(user) if with_owner_likes => Some(inner.keys.liked(user)),
            _ => None,
        };
        let max = lt.map_or_else(|| "+inf".to_owned(), |v| format!("({v}"));
        // `ZRANGE key max min BYSCORE REV LIMIT 0 count+1`: the members of the page.
        let members = |pipe: &mut redis::Pipeline, min: &str| {
            pipe.cmd("ZRANGE")
                .arg(&key)
                .arg(&max)
                .arg(min)
                .arg("BYSCORE")
                .arg("REV")
                .arg("LIMIT")
                .arg(0)
                .arg(count + 1);
        };
        let sample = |pipe: &mut redis::Pipeline| {
            if let Some(liked) = &liked {
                pipe.cmd("SRANDMEMBER").arg(liked).arg(LIKED_SAMPLE);
            }
        };
        let (mut prefetched, mut prefetched_liked) = (Vec::new(), None);
        let ahead = prefetch.tweets;
        if gt.is_none() {
            let mut pipe = redis::pipe();
            members(&mut pipe, "-inf");
            sample(&mut pipe);
            if !ahead.is_empty() {
                pipe_counts(&mut pipe, &inner.keys, ahead);
                if let Some(viewer) = prefetch.liked_by {
                    pipe_liked(&mut pipe, &inner.keys, viewer, ahead);
                }
            }
            let mut replies = self.run::<Vec<redis::Value>>(&pipe).await?.into_iter();
            let mut next = || replies.next().ok_or(CacheUnavailable);
            let mut items: Members =
                redis::from_redis_value(next()?).map_err(|_| CacheUnavailable)?;
            let owner_likes: Option<Vec<i64>> = match liked {
                Some(_) => Some(redis::from_redis_value(next()?).map_err(|_| CacheUnavailable)?),
                None => None,
            };
            if !ahead.is_empty() {
                prefetched = decode_counts(next()?)?;
                if prefetch.liked_by.is_some() {
                    prefetched_liked = Some(decode_liked(ahead, next()?)?);
                }
            }
            let complete = items.last().is_some_and(|m| m == MARKER.as_bytes());
            if complete || items.len() > count {
                items.retain(|member| member != MARKER.as_bytes());
                items.truncate(count);
                return Ok(Some(Window {
                    complete,
                    floor: None,
                    items,
                    owner_likes,
                    prefetched,
                    prefetched_liked,
                }));
            }
        }
        // MULTI/EXEC of two plain reads: atomic like a script, at about half the Redis CPU of
        // the Lua script it replaces (measured: `INFO commandstats`, BENCHMARKS.md).
        let min = gt.map_or_else(|| "-inf".to_owned(), |v| format!("({v}"));
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("ZRANGE")
            .arg(&key)
            .arg(0)
            .arg(0)
            .arg("WITHSCORES");
        members(&mut pipe, &min);
        sample(&mut pipe);
        let (lowest, items, owner_likes): (Members, Members, Option<Vec<i64>>) = if liked.is_some()
        {
            let (lowest, items, likes) = self.run(&pipe).await?;
            (lowest, items, Some(likes))
        } else {
            let (lowest, items) = self.run(&pipe).await?;
            (lowest, items, None)
        };
        Ok(Window::parse(lowest, items, count).map(|w| Window {
            owner_likes,
            prefetched,
            prefetched_liked,
            ..w
        }))
    }

    /// Warns when Redis keeps sorted sets as listpacks only below the cache list limit: full
    /// timelines then take the skiplist encoding, about four times the memory per entry. (A
    /// Redis that refuses `CONFIG GET`, as some managed ones do, is not checked.)
    pub async fn check_listpack_setting(&self) {
        let mut pipe = redis::pipe();
        pipe.cmd("CONFIG")
            .arg("GET")
            .arg("zset-max-listpack-entries");
        let Ok((reply,)) = self.run_unchecked::<(Vec<String>,)>(&pipe, 1).await else {
            return;
        };
        let entries = reply.get(1).and_then(|v| v.parse::<usize>().ok());
        let needed = self.list_limit() + 1;
        if let Some(entries) = entries.filter(|e| *e < needed) {
            tracing::warn!(
                entries,
                needed,
                "redis zset-max-listpack-entries is below CHIRP_CACHE_LIST_LIMIT + 1: long \
                 timelines use the skiplist encoding (about 4x the memory); see the README"
            );
        }
    }

    /// Starts loading a list or set: from now on every write to it bumps its generation. Call
    /// before the Postgres snapshot; pass the result to [`Cache::fill`] or
    /// [`Cache::fill_liked`].
    pub async fn begin_load(&self, list: ListKey) -> Result<Generation, CacheUnavailable> {
        let inner = self.live()?;
        let gen_key = Keys::gen_of(&inner.keys.list(list));
        let mut pipe = redis::pipe();
        pipe.invoke_script(scripts::BEGIN_LOAD.key(gen_key).arg(inner.ttl_secs));
        let (g,): (String,) = self.run(&pipe).await?;
        Ok(Generation(g))
    }

    /// The removal generations (`r`) of lists, in order (`""`: none), to guard merges planned
    /// now with [`crate::cache::Guard::Removals`]. One round trip.
    pub async fn removal_generations(
        &self,
        lists: &[ListKey],
    ) -> Result<Vec<String>, CacheUnavailable> {
        let inner = self.live()?;
        if lists.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for list in lists {
            pipe.cmd("HGET")
                .arg(Keys::gen_of(&inner.keys.list(*list)))
                .arg("r");
        }
        let values: Vec<Option<String>> = self.run_bulk(&pipe, lists.len()).await?;
        Ok(values.into_iter().map(Option::unwrap_or_default).collect())
    }

    /// Stores a list loaded from Postgres (newest first, at most the limit) unless it is cached
    /// already or was written since `generation` was taken. `complete`: nothing older exists.
    /// Returns whether it was stored.
    pub async fn fill(
        &self,
        list: ListKey,
        generation: &Generation,
        complete: bool,
        entries: &[Scored],
    ) -> Result<bool, CacheUnavailable> {
        let inner = self.live()?;
        let key = inner.keys.list(list);
        let mut inv = scripts::FILL.key(&key);
        inv.key(Keys::gen_of(&key))
            .arg(&generation.0)
            .arg(inner.ttl_secs)
            .arg(if complete { "1" } else { "0" });
        for (score, member) in entries {
            inv.arg(*score).arg(member);
        }
        let mut pipe = redis::pipe();
        pipe.invoke_script(&inv);
        let (stored,): (i64,) = self.run_bulk(&pipe, entries.len()).await?;
        inner.stats.loads.fetch_add(1, Ordering::Relaxed);
        Ok(stored == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_ids_round_trip_in_few_bytes() {
        let feed = [5_781_487, 1_611_673_265_272_913_922, 568_770_231];
        let member = pack_ids(&feed);
        assert_eq!(member.len(), 1 + 3 + 8 + 4);
        assert_eq!(unpack_ids::<3>(&member), Some(feed));
        for ids in [
            [0, 1],
            [1, 0],
            [255, 256],
            [i64::MAX, 7],
            [1 << 40, i64::MAX],
        ] {
            let member = pack_ids(&ids);
            assert!(member.len() >= 2 && member != b"#");
            assert_eq!(unpack_ids::<2>(&member), Some(ids), "{ids:?}");
        }
        assert_eq!(unpack_ids::<2>(b"#"), None);
        assert_eq!(unpack_ids::<3>(&pack_ids(&[1, 2])), None);
        assert_eq!(unpack_ids::<2>(b""), None);
    }
}
