//! Primitives on cached lists (sorted sets) and their generations: read a window, start a load,
//! store a load, read merge guards. The timeline feature ([`crate::timeline`]) builds its
//! cache-aside read path from these.

use std::sync::atomic::Ordering;

use crate::cache::{Cache, CacheUnavailable, Keys, ListKey, scripts};

/// A list entry to store: `(score = created_at in µs, member)`.
pub type Scored = (i64, String);

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
    pub floor: Option<i64>,
    /// `(member, score)` newest first, strictly inside the requested bounds.
    pub items: Vec<(String, i64)>,
}

impl Window {
    fn parse(raw: Vec<String>) -> Option<Self> {
        let mut it = raw.into_iter();
        let complete = it.next()? == "1";
        let floor = it.next().and_then(|f| parse_score(&f));
        let mut items = Vec::new();
        while let (Some(member), Some(score)) = (it.next(), it.next()) {
            items.push((member, parse_score(&score)?));
        }
        Some(Window {
            complete,
            floor,
            items,
        })
    }
}

fn parse_score(s: &str) -> Option<i64> {
    // Scores are µs timestamps, exact in a double (< 2^53).
    s.parse::<f64>()
        .ok()
        .filter(|f| f.is_finite())
        .map(|f| f as i64)
}

impl Cache {
    /// Reads the newest `count` entries strictly between `gt` and `lt` (µs) of a cached list in
    /// one round trip. `Ok(None)`: the list is not cached.
    pub async fn range(
        &self,
        list: ListKey,
        lt: Option<i64>,
        gt: Option<i64>,
        count: usize,
    ) -> Result<Option<Window>, CacheUnavailable> {
        let inner = self.live()?;
        let key = inner.keys.list(list);
        let mut pipe = redis::pipe();
        pipe.invoke_script(
            scripts::RANGE
                .key(&key)
                .arg(lt.map_or("+inf".to_owned(), |v| v.to_string()))
                .arg(gt.map_or("-inf".to_owned(), |v| v.to_string()))
                .arg(count),
        );
        let (raw,): (Option<Vec<String>>,) = self.run(&pipe).await?;
        Ok(raw.and_then(Window::parse))
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
