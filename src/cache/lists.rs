//! Primitives on cached lists (sorted sets) and their generations: read a window, start a load,
//! store a load, read merge guards. The timeline feature ([`crate::timeline`]) builds its
//! cache-aside read path from these.

use std::sync::atomic::Ordering;

use crate::cache::held::Held;
use crate::cache::liked::{HeldLikes, LIKED_SAMPLE, LikedAmong};
use crate::cache::piggyback::Piggyback;
use crate::cache::{Cache, CacheUnavailable, Keys, ListKey, Owner, scripts};
use crate::model::TweetCounts;

/// A list entry to store: `(score, member bytes)`; a timeline's score is the whole second of
/// its item ([`pack_entry`]), a chat backlog's the message id.
pub type Scored = (i64, Vec<u8>);

/// List members as Redis returns them, in its order.
type Members = Vec<Vec<u8>>;

/// The member that marks a cached list as complete (score `-inf`, so always the lowest rank);
/// see [`scripts`].
pub const MARKER: &str = "#";

pub use super::entries::{
    SCORE_EPOCH_SECS, entry_time, pack_entry, pack_ids, pack_member, pack_member_shifted,
    split_time, unpack_entry, unpack_ids, unpack_shifted,
};

/// The generations a loader saw before its Postgres snapshot (`"w:r"`, from
/// [`scripts::BEGIN_LOAD`]); [`Cache::fill`] stores the load only if they are unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation(pub(crate) String);

/// The lowest entry of an incomplete cached timeline ([`Cache::begin_extend`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Floor {
    /// Its score: the entry's whole second ([`split_time`]).
    pub score: i64,
    pub member: Vec<u8>,
}

impl Floor {
    /// The entry's time, µs since the Unix epoch (`None` for a member of another layout).
    pub fn micros(&self) -> Option<i64> {
        entry_time(self.score, &self.member)
    }
}

/// What a cached list says about a range: see [`Cache::range`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Window {
    /// The list holds every item, not only the newest window.
    pub complete: bool,
    /// The time (µs; a chat backlog: the message id) of an incomplete list's lowest entry: it
    /// has every item at or above it.
    /// `None` on an incomplete list when the window is a full page of `count` items read
    /// without the floor (a page without a lower bound: see [`Cache::range`]); the list then
    /// holds every item down to the lowest of them.
    pub floor: Option<i64>,
    /// Members newest first, strictly inside the requested bounds. Without their scores:
    /// every reader can tell an entry's time from what the member names (a timeline's from the
    /// tweet, a chat backlog's from the message), and a page of 20 then parses 21 replies
    /// fewer (redis-rs spends 800–1,000 instructions on each, as measured with callgrind in
    /// docs/benchmarks-journal.md).
    pub items: Vec<Vec<u8>>,
    /// Up to [`LIKED_SAMPLE`] members of the list owner's liked set (`SRANDMEMBER`: all of
    /// them when it holds fewer), read in the same round trip when the read asked for it
    /// (`with_owner_likes`), for [`Cache::fetch_for_hydration`].
    pub owner_likes: Option<Vec<i64>>,
    /// The counters of the tweets the read was asked to prefetch ([`PageGuess::tweets`]), in
    /// that order: held in this process's near cache or read in the same round trip (`None`:
    /// not known, hydration asks again); empty if none were asked or the read had a lower bound
    /// (see [`Cache::range`] and [`super::pages`]).
    pub prefetched: Vec<Option<TweetCounts>>,
    /// What the liked set of [`PageGuess::liked_by`] says of the prefetched tweets, read in the
    /// same round trip; `None` if it was not asked.
    pub prefetched_liked: Option<LikedAmong>,
}

/// What [`Cache::range`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Range {
    /// The list is cached: what it holds in range.
    Hit(Window),
    /// The list is not cached. `owner_likes`: the sample of the owner's liked set taken in the
    /// same round trip, if the read asked for one ([`Window::owner_likes`]); an empty sample
    /// says that set is not cached either (a cached one holds its marker,
    /// [`super::liked::LIKED_MARKER`]), so a loader can begin loading both at once
    /// ([`Cache::begin_page_load`]).
    Miss { owner_likes: Option<Vec<i64>> },
}

impl Range {
    /// The window of a hit; `None` on a miss.
    pub fn hit(self) -> Option<Window> {
        match self {
            Range::Hit(window) => Some(window),
            Range::Miss { .. } => None,
        }
    }
}

/// What [`Cache::begin_page_load`] found and began, in one round trip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BegunLoad {
    /// The list was cached by then (another loader stored it): read it rather than load.
    pub cached: bool,
    /// The list's generation, for [`Cache::fill_hydrated`].
    pub list: Generation,
    /// The liked set's generation, if its load was begun too.
    pub liked: Option<Generation>,
}

/// The newest entries of a held list ([`ListKey::has_held_head`]) as a first page's range read
/// found them in Redis, kept in each process's near cache ([`super::held::NearId::Head`]):
/// a later first page of up to `count` entries is answered from it, without a round trip, if
/// the list held more than `count` entries or holds them all ([`Head::serves`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Head {
    /// Members, newest first (without the completeness marker): the `count + 1` newest, or
    /// fewer if the list holds fewer.
    pub items: Vec<Vec<u8>>,
    /// The list held every entry (its marker was among those read).
    pub complete: bool,
}

impl Head {
    /// Whether a first page of `count` entries can be answered from this head as Redis would
    /// answer it: a full page, or every entry of the list.
    pub fn serves(&self, count: usize) -> bool {
        self.complete || self.items.len() > count
    }
}

/// What a range read reads ahead for hydration along with the list: the page memory's guess
/// of the page ([`super::pages`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct PageGuess<'a> {
    /// The page's tweets the last time it was served: their counters (those the near cache
    /// does not hold) and, with `liked_by`, the viewer's likes of them.
    pub tweets: &'a [i64],
    /// A viewer whose liked set to ask about `tweets` (someone reading another's timeline).
    pub liked_by: Option<i64>,
}

/// What a newest-first range read ([`Cache::newest`]) found.
enum Newest {
    /// The page, answered by the `count + 1` newest members (or the held head).
    Page(Window),
    /// Fewer than a page and no completeness marker: read again with the floor, sampling
    /// `sampled`'s liked set, keeping what was read `ahead`.
    Short { sampled: Option<i64>, ahead: Ahead },
    /// No member at all although the read had no upper bound: the list is not cached (a
    /// cached list holds at least its marker or one entry, and Redis deletes an emptied set).
    /// `sample`: what the owner's liked-set sample found.
    Missing { sample: Option<Vec<i64>> },
}

/// What a range read learnt of the guessed tweets ([`PageGuess::tweets`]) ahead of hydration:
/// their counters in order (`None`: not known) and the viewer's likes of them.
#[derive(Default)]
struct Ahead {
    counts: Vec<Option<TweetCounts>>,
    liked: Option<LikedAmong>,
}

/// How a range read asks for the members strictly between `gt` and `lt` (µs), newest first.
///
/// A list ordered by its score alone takes one `ZRANGE max min BYSCORE REV LIMIT`. A timeline
/// in the split-time layout ([`pack_entry`]) scores whole seconds, so the `ZRANGE` covers the
/// whole seconds strictly inside the bounds, and a bound inside a second also reads that
/// second's members (`ZRANGE s s BYSCORE REV`; a handful, at most the list's limit) and keeps
/// those inside the bound by their sub-second prefix. A cursor on a whole second (every
/// imported tweet's time) needs no such read: the page stays one `ZRANGE`.
struct Bounds {
    split_time: bool,
    lt: Option<i64>,
    gt: Option<i64>,
    /// `ZRANGE`'s max and min.
    max: String,
    min: String,
    /// The second `lt` falls inside, if its members are read whole.
    upper: Option<i64>,
    /// The second `gt` falls inside (below `upper`), if its members are read whole.
    lower: Option<i64>,
}

impl Bounds {
    fn new(split_time: bool, lt: Option<i64>, gt: Option<i64>) -> Self {
        let bound = |v: Option<i64>, open: &str| match v {
            Some(v) if split_time => format!("({}", self::split_time(v).0),
            Some(v) => format!("({v}"),
            None => open.to_owned(),
        };
        let (max, min) = (bound(lt, "+inf"), bound(gt, "-inf"));
        let (mut upper, mut lower) = (None, None);
        if split_time {
            let (l, g) = (lt.map(self::split_time), gt.map(self::split_time));
            // The second of `lt` holds items below it unless `lt` is on the whole second;
            // the second of `gt` holds items above it unless `gt` is its last µs.
            upper = l.filter(|(s, sub)| *sub > 0 && g.is_none_or(|(gs, _)| gs <= *s));
            lower = g.filter(|(s, sub)| *sub < 999_999 && l.is_none_or(|(ls, _)| *s < ls));
        }
        Bounds {
            split_time,
            lt,
            gt,
            max,
            min,
            upper: upper.map(|(s, _)| s),
            lower: lower.map(|(s, _)| s),
        }
    }

    /// Adds the reads: the upper edge's second, the `ZRANGE … LIMIT 0 count+1` of the whole
    /// seconds (one more, as the completeness marker may be among them), the lower edge's.
    fn pipe_members(&self, pipe: &mut redis::Pipeline, key: &str, count: usize) {
        let edge = |pipe: &mut redis::Pipeline, s: i64| {
            pipe.cmd("ZRANGE")
                .arg(key)
                .arg(s)
                .arg(s)
                .arg("BYSCORE")
                .arg("REV");
        };
        if let Some(s) = self.upper {
            edge(pipe, s);
        }
        pipe.cmd("ZRANGE")
            .arg(key)
            .arg(&self.max)
            .arg(&self.min)
            .arg("BYSCORE")
            .arg("REV")
            .arg("LIMIT")
            .arg(0)
            .arg(count + 1);
        if let Some(s) = self.lower {
            edge(pipe, s);
        }
    }

    /// The members in range, newest first, from the replies of [`Bounds::pipe_members`].
    fn members(
        &self,
        replies: &mut impl Iterator<Item = redis::Value>,
    ) -> Result<Members, CacheUnavailable> {
        let mut next = || -> Result<Members, CacheUnavailable> {
            let value = replies.next().ok_or(CacheUnavailable)?;
            redis::from_redis_value(value).map_err(|_| CacheUnavailable)
        };
        let mut items = Vec::new();
        if let Some(s) = self.upper {
            items.extend(next()?.into_iter().filter(|m| self.inside(s, m)));
        }
        let whole = next()?;
        if items.is_empty() {
            items = whole;
        } else {
            items.extend(whole);
        }
        if let Some(s) = self.lower {
            items.extend(next()?.into_iter().filter(|m| self.inside(s, m)));
        }
        Ok(items)
    }

    /// Whether a member of the second `score` lies strictly inside the bounds.
    fn inside(&self, score: i64, member: &[u8]) -> bool {
        entry_time(score, member)
            .is_some_and(|t| self.lt.is_none_or(|lt| t < lt) && self.gt.is_none_or(|gt| t > gt))
    }

    /// The time (µs) of the entry `member` with the score `score` (a reply's text).
    fn time_of(&self, member: &[u8], score: &[u8]) -> Option<i64> {
        let score = parse_score(score)?;
        if self.split_time {
            entry_time(score, member)
        } else {
            Some(score)
        }
    }
}

fn parse_score(s: &[u8]) -> Option<i64> {
    // Scores are integers exact in a double (< 2^53): whole seconds, message ids.
    std::str::from_utf8(s)
        .ok()?
        .parse::<f64>()
        .ok()
        .filter(|f| f.is_finite())
        .map(|f| f as i64)
}

impl Cache {
    /// Reads the members of the newest `count` entries strictly between `gt` and `lt` (µs; a
    /// chat backlog: message ids) of a cached list in one round trip. [`Range::Miss`]: the
    /// list is not cached (with the owner's liked-set sample, if asked). A timeline's bounds
    /// inside a second also read that second's members (`Bounds`, below).
    ///
    /// A page without a lower bound (`gt` unset: a first page, or one below a cursor) first asks
    /// for its `count + 1` newest members alone: their lowest is the completeness marker when
    /// the list holds everything, and `count + 1` real members make a full page, whose floor
    /// nobody needs ([`Window::floor`] is `None`). Only a shorter reply without the marker (an
    /// incomplete list ending inside the page) asks again for the floor, with the atomic pair
    /// below; an empty reply to a read without an upper bound is a miss at once (a cold first
    /// page learns it in one round trip, not two: issue 42). One command (with the sample
    /// below, two in one pipeline) instead of `MULTI`, two `ZRANGE`s and `EXEC`
    /// (docs/decisions/0008-one-zrange-first-pages.md).
    ///
    /// `with_owner_likes` (for a list owned by a user: a newsfeed, read by its owner) also asks
    /// for up to [`LIKED_SAMPLE`] members of the owner's liked set in the same round trip
    /// ([`Window::owner_likes`]): it shares the list's hash tag, and a viewer with fewer likes
    /// than that then needs no `SMISMEMBER` of the page's tweets and its 22 replies
    /// (docs/decisions/0011-liked-sample-with-the-range.md).
    ///
    /// `guess` (tweet ids this page showed the last time, from [`super::pages`]) also asks
    /// for the counters of those this process does not hold in its near cache (and takes the
    /// others from there: [`Cache::held_for_range`]), and whether its viewer liked them, in the
    /// same round trip ([`Window::prefetched`], [`Window::prefetched_liked`]), so that
    /// hydration needs no second one when the page did not change. Only a page without a lower
    /// bound takes them (the atomic pair stays within the list's slot). A viewer's or an
    /// owner's liked set held in this process's near cache ([`HeldLikes`]) answers instead of
    /// the `SMISMEMBER` or the sample; one not held is sampled along, to be held if small.
    ///
    /// A first page (neither bound) of a held list ([`ListKey::has_held_head`]: a user's own
    /// tweets, a list's timeline, a circle's tweets) takes its members from the list's [`Head`]
    /// in this process's near cache when it serves the page, and remembers the head it read
    /// otherwise: a warm page whose counters are held too makes no round trip at all.
    ///
    /// So a range is one of two reads: [`Cache::newest`] (no lower bound) and, when that comes
    /// back short or there is a lower bound, [`Cache::range_with_floor`]; what each takes
    /// along is one [`Piggyback`], pushed and taken in the same order.
    pub async fn range(
        &self,
        list: ListKey,
        lt: Option<i64>,
        gt: Option<i64>,
        count: usize,
        with_owner_likes: bool,
        guess: PageGuess<'_>,
    ) -> Result<Range, CacheUnavailable> {
        let inner = self.live()?;
        let key = inner.keys.list(list);
        let owner = match list.owner {
            Owner::User(user) if with_owner_likes => Some(user),
            _ => None,
        };
        let bounds = Bounds::new(list.split_time, lt, gt);
        if gt.is_some() {
            return self
                .range_with_floor(&key, &bounds, count, owner, Ahead::default())
                .await;
        }
        match self
            .newest(list, &key, &bounds, count, owner, guess)
            .await?
        {
            Newest::Page(window) => Ok(Range::Hit(window)),
            Newest::Short { sampled, ahead } => {
                self.range_with_floor(&key, &bounds, count, sampled, ahead)
                    .await
            }
            Newest::Missing { sample } => Ok(Range::Miss {
                owner_likes: sample,
            }),
        }
    }

    /// A range without a lower bound, read first as its `count + 1` newest members alone
    /// (from the held head if it serves the page), with what [`Cache::range_piggyback`] takes
    /// along: [`Newest::Page`] if that answers the page, else [`Newest::Short`] with what was
    /// read ahead.
    async fn newest(
        &self,
        list: ListKey,
        key: &str,
        bounds: &Bounds,
        count: usize,
        owner: Option<i64>,
        guess: PageGuess<'_>,
    ) -> Result<Newest, CacheUnavailable> {
        let inner = self.live()?;
        let held_list = (bounds.lt.is_none() && list.has_held_head()).then_some(list);
        let ahead_ids = guess.tweets;
        let viewer = guess.liked_by.filter(|_| !ahead_ids.is_empty());
        let mut held = self.held_for_range(held_list, ahead_ids, viewer.or(owner));
        let head = held.head.take().filter(|h| h.serves(count));
        let (plan, mut ahead) = self.range_piggyback(&mut held, owner, viewer, ahead_ids);
        let mut pipe = redis::pipe();
        if head.is_none() {
            bounds.pipe_members(&mut pipe, key, count);
        }
        plan.push(&mut pipe, &inner.keys);
        // A warm page of a held list whose counters are held too needs no round trip.
        let mut replies = if pipe.is_empty() {
            Vec::new().into_iter()
        } else {
            self.run::<Vec<redis::Value>>(&pipe).await?.into_iter()
        };
        let mut items = match &head {
            Some(head) => head.items.iter().take(count + 1).cloned().collect(),
            None => bounds.members(&mut replies)?,
        };
        let taken = plan.take(&mut replies)?;
        let lookup = held.lookup;
        if let (Some(user), Some(sample)) = (plan.sample, &taken.sample) {
            self.remember_likes(lookup, user, sample, LIKED_SAMPLE);
        }
        if !plan.counts.is_empty() {
            self.remember_counts(lookup, &plan.counts, &taken.counts);
            let mut read = taken.counts.into_iter();
            for c in ahead.counts.iter_mut().filter(|c| c.is_none()) {
                *c = read.next().flatten();
            }
        }
        if taken.liked.is_some() {
            ahead.liked = taken.liked;
        }
        if let (Some(user), Some(sample)) = (plan.hold, &taken.hold) {
            self.remember_likes(lookup, user, sample, HeldLikes::SAMPLE);
        }
        let complete = match &head {
            // As Redis would answer `count + 1`: complete only if the page holds it all.
            Some(head) => head.complete && head.items.len() <= count,
            None => items.last().is_some_and(|m| m == MARKER.as_bytes()),
        };
        if items.is_empty() && head.is_none() && bounds.lt.is_none() {
            // Not even the marker between +inf and -inf: no list.
            return Ok(Newest::Missing {
                sample: taken.sample,
            });
        }
        if !complete && items.len() <= count {
            // An incomplete list ending inside the page: ask for the floor.
            return Ok(Newest::Short {
                sampled: plan.sample,
                ahead,
            });
        }
        items.retain(|member| member != MARKER.as_bytes());
        if let (Some(list), None) = (held_list, &head) {
            let found = Head {
                items: items.clone(),
                complete,
            };
            self.remember_head(lookup, list, found);
        }
        items.truncate(count);
        Ok(Newest::Page(Window {
            complete,
            floor: None,
            items,
            owner_likes: taken.sample,
            prefetched: ahead.counts,
            prefetched_liked: ahead.liked,
        }))
    }

    /// What a newest-first range read takes along ([`Cache::newest`]), from what this process
    /// `held`: a sample of the `owner`'s liked set unless it is held (hydration then takes it
    /// from memory); the counters of the guessed tweets (`ahead_ids`) that are not held; and
    /// the `viewer`'s likes of them unless its held set answers, with a sample to hold the set
    /// if it is not held. Returns the plan and what memory answered ahead already.
    fn range_piggyback<'a>(
        &self,
        held: &mut Held,
        owner: Option<i64>,
        viewer: Option<i64>,
        ahead_ids: &'a [i64],
    ) -> (Piggyback<'a>, Ahead) {
        // The owner's liked set is held whole (hydration takes it from memory), or is known
        // to be larger than a sample: no sample.
        let sample = owner.filter(|_| viewer.is_some() || held.likes.is_none());
        let counts = (ahead_ids.iter().zip(&held.counts))
            .filter(|(_, c)| c.is_none())
            .map(|(id, _)| *id)
            .collect();
        let viewer_likes = viewer.and(held.likes.as_deref());
        let liked = viewer_likes.and_then(|l| l.among(ahead_ids));
        let ask_liked = viewer.filter(|_| liked.is_none());
        let plan = Piggyback {
            counts,
            liked: ask_liked.map(|user| (user, ahead_ids)),
            sample,
            hold: ask_liked.filter(|_| viewer_likes.is_none() && self.may_hold(held.lookup)),
            ..Piggyback::default()
        };
        let ahead = Ahead {
            counts: std::mem::take(&mut held.counts),
            liked,
        };
        (plan, ahead)
    }

    /// A range read with its list's floor: `ZRANGE 0 0 WITHSCORES` (the completeness marker
    /// or the lowest entry) and the members, atomically (`MULTI`/`EXEC` of plain reads: atomic
    /// like a script, at about half the Redis CPU of the Lua script it replaces; measured with
    /// `INFO commandstats`, docs/benchmarks-journal.md), with a sample of the `sampled` user's
    /// liked set. `ahead`: what a first attempt ([`Cache::newest`]) read ahead.
    async fn range_with_floor(
        &self,
        key: &str,
        bounds: &Bounds,
        count: usize,
        sampled: Option<i64>,
        ahead: Ahead,
    ) -> Result<Range, CacheUnavailable> {
        let inner = self.live()?;
        let plan = Piggyback {
            sample: sampled,
            ..Piggyback::default()
        };
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(0)
            .arg("WITHSCORES");
        bounds.pipe_members(&mut pipe, key, count);
        plan.push(&mut pipe, &inner.keys);
        let mut replies = self.run::<Vec<redis::Value>>(&pipe).await?.into_iter();
        let lowest: Members = replies
            .next()
            .and_then(|v| redis::from_redis_value(v).ok())
            .ok_or(CacheUnavailable)?;
        let mut items = bounds.members(&mut replies)?;
        let taken = plan.take(&mut replies)?;
        let mut lowest = lowest.into_iter();
        let Some(first) = lowest.next() else {
            // An empty reply: the list is not cached.
            return Ok(Range::Miss {
                owner_likes: taken.sample,
            });
        };
        let complete = first == MARKER.as_bytes();
        let floor = match (complete, lowest.next()) {
            (false, Some(score)) => bounds.time_of(&first, &score),
            _ => None,
        };
        items.retain(|member| member != MARKER.as_bytes());
        items.truncate(count);
        Ok(Range::Hit(Window {
            complete,
            floor,
            items,
            owner_likes: taken.sample,
            prefetched: ahead.counts,
            prefetched_liked: ahead.liked,
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
                 timelines use the skiplist encoding (about 4x the memory); see docs/cache.md"
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

    /// The miss path's start, in one round trip: whether `list` is cached by now (a loader in
    /// another process, or this one before the single-flight lock was taken, stored it), and
    /// [`Cache::begin_load`] of the list and, with `liked_of`, of that user's liked set (which
    /// shares a newsfeed's hash tag; a miss's sample said it is not cached: [`Range::Miss`]).
    /// Call before the Postgres snapshots. A list found cached is read with [`Cache::range`];
    /// loading it anyway would only be refused by [`scripts::FILL`]. (It replaces a second
    /// range read and a `BEGIN_LOAD` of the list and of the liked set, each a round trip, on
    /// every cold first page: issue 42.)
    pub async fn begin_page_load(
        &self,
        list: ListKey,
        liked_of: Option<i64>,
    ) -> Result<BegunLoad, CacheUnavailable> {
        let inner = self.live()?;
        let key = inner.keys.list(list);
        let mut pipe = redis::pipe();
        pipe.cmd("EXISTS").arg(&key).invoke_script(
            scripts::BEGIN_LOAD
                .key(Keys::gen_of(&key))
                .arg(inner.ttl_secs),
        );
        if let Some(user) = liked_of {
            let liked = Keys::gen_of(&inner.keys.liked(user));
            pipe.invoke_script(scripts::BEGIN_LOAD.key(liked).arg(inner.ttl_secs));
        }
        let (cached, g, liked) = match liked_of {
            Some(_) => {
                let (cached, g, liked): (bool, String, String) = self.run(&pipe).await?;
                (cached, g, Some(Generation(liked)))
            }
            None => {
                let (cached, g): (bool, String) = self.run(&pipe).await?;
                (cached, g, None)
            }
        };
        Ok(BegunLoad {
            cached,
            list: Generation(g),
            liked,
        })
    }

    /// Starts growing an incomplete cached list downwards ([`scripts::EXTEND`]): its generation
    /// (as [`Cache::begin_load`]: call before the Postgres snapshot), its lowest entry and how
    /// many entries it holds. `None` if the list is not cached or complete. One round trip.
    pub async fn begin_extend(
        &self,
        list: ListKey,
    ) -> Result<Option<(Generation, Floor, usize)>, CacheUnavailable> {
        let inner = self.live()?;
        let key = inner.keys.list(list);
        let mut pipe = redis::pipe();
        pipe.invoke_script(
            scripts::BEGIN_LOAD
                .key(Keys::gen_of(&key))
                .arg(inner.ttl_secs),
        )
        .cmd("ZRANGE")
        .arg(&key)
        .arg(0)
        .arg(0)
        .arg("WITHSCORES")
        .cmd("ZCARD")
        .arg(&key);
        let (g, lowest, len): (String, Vec<(Vec<u8>, f64)>, usize) = self.run(&pipe).await?;
        Ok(match lowest.into_iter().next() {
            Some((member, score)) if member != MARKER.as_bytes() => Some((
                Generation(g),
                Floor {
                    score: score as i64,
                    member,
                },
                len,
            )),
            _ => None,
        })
    }

    /// Adds `entries` (newest first), loaded from Postgres below `floor` after
    /// [`Cache::begin_extend`] returned `generation`, to the bottom of a cached list, unless
    /// the list was written since or its lowest entry is no longer `floor`; trims it to the
    /// list limit. `complete`: nothing older exists. Returns whether they were stored.
    pub async fn extend(
        &self,
        list: ListKey,
        generation: &Generation,
        floor: &Floor,
        complete: bool,
        entries: &[Scored],
    ) -> Result<bool, CacheUnavailable> {
        let inner = self.live()?;
        let key = inner.keys.list(list);
        let mut inv = scripts::EXTEND.key(&key);
        inv.key(Keys::gen_of(&key))
            .arg(&generation.0)
            .arg(inner.ttl_secs)
            .arg(inner.list_limit)
            .arg(floor.score)
            .arg(&floor.member)
            .arg(if complete { "1" } else { "0" });
        for (score, member) in entries {
            inv.arg(*score).arg(member);
        }
        let mut pipe = redis::pipe();
        pipe.invoke_script(&inv);
        let (stored,): (i64,) = self.run_bulk(&pipe, entries.len()).await?;
        if stored == 1 {
            inner.stats.extensions.fetch_add(1, Ordering::Relaxed);
        }
        Ok(stored == 1)
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
        self.fill_with(list, generation, complete, entries, (redis::pipe(), 0))
            .await
    }

    /// The fill of [`Cache::fill`] after the (ignored) commands already in `pipe`, which write
    /// `items` items (they size the round trip's timeout: [`Cache::run_bulk`]).
    pub(super) async fn fill_with(
        &self,
        list: ListKey,
        generation: &Generation,
        complete: bool,
        entries: &[Scored],
        (mut pipe, items): (redis::Pipeline, usize),
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
        pipe.invoke_script(&inv);
        let (stored,): (i64,) = self.run_bulk(&pipe, entries.len() + items).await?;
        inner.stats.loads.fetch_add(1, Ordering::Relaxed);
        Ok(stored == 1)
    }
}
