//! The read of a timeline page: from its cached list in Redis when it can, else (a miss,
//! a page past the window, Redis down) from Postgres, filling the list on a miss (see the
//! module docs of [`super`]).

use std::sync::atomic::Ordering;

use sqlx::PgPool;

use crate::cache::hydration::Prefetched;
use crate::cache::liked::LikedFill;
use crate::cache::objects::{Hydrated, LoadedObjects};
use crate::cache::pages::PageShape;
use crate::cache::{Cache, CacheUnavailable, PageGuess, Range, Scored, Update, Window};
use crate::likes;
use crate::pagination::PageRequest;
use crate::time::{self, Timestamp};

use super::hydration::{hydrate, with_likes};
use super::{AuthorBody, Item, ListMember, Timeline, TweetBody};

pub(super) enum ReadError {
    Cache,
    Db(sqlx::Error),
}

impl From<CacheUnavailable> for ReadError {
    fn from(_: CacheUnavailable) -> Self {
        ReadError::Cache
    }
}

impl From<sqlx::Error> for ReadError {
    fn from(e: sqlx::Error) -> Self {
        ReadError::Db(e)
    }
}

/// Reads up to `req.want()` items of a timeline, newest first (one more than the page, so the
/// caller can tell whether a next page exists).
///
/// A refresh (`created_at__gt` alone) also returns the entries that *arrived* after the cursor
/// although their tweet is older (a fan-out that finished behind newer tweets): without them a
/// client that refreshes from its newest item would never see such an entry. They are merged in
/// `created_at` order; a client may already hold some of them and dedupes by id.
///
/// # Errors
/// Only Postgres errors; Redis errors fall back to Postgres.
#[tracing::instrument(name = "timeline::read", skip_all, fields(timeline = ?timeline))]
pub async fn read(
    db: &PgPool,
    cache: &Cache,
    timeline: Timeline,
    req: &PageRequest,
    viewer: Option<i64>,
) -> sqlx::Result<Vec<Item>> {
    let mut items = read_window(db, cache, timeline, req, viewer).await?;
    if let (Some(gt), None) = (req.gt, req.lt) {
        let late = timeline.late_arrivals(db, gt, req.want()).await?;
        if !late.is_empty() {
            items.extend(with_likes(db, cache, late, viewer).await?);
            items.sort_by_key(|i| std::cmp::Reverse(i.created_at));
            items.truncate(req.want());
        }
    }
    Ok(items)
}

async fn read_window(
    db: &PgPool,
    cache: &Cache,
    timeline: Timeline,
    req: &PageRequest,
    viewer: Option<i64>,
) -> sqlx::Result<Vec<Item>> {
    if cache.available() {
        // A retry happens only after removing entries of deleted tweets from the list.
        for _ in 0..3 {
            match read_cached(db, cache, timeline, req, viewer).await {
                Ok(Some(items)) => return Ok(items),
                Ok(None) => continue,
                Err(ReadError::Cache) => break,
                Err(ReadError::Db(e)) => return Err(e),
            }
        }
    }
    load_page(db, cache, timeline, req.lt, req.gt, req.want(), viewer).await
}

async fn read_cached(
    db: &PgPool,
    cache: &Cache,
    timeline: Timeline,
    req: &PageRequest,
    viewer: Option<i64>,
) -> Result<Option<Vec<Item>>, ReadError> {
    let stats = cache.stats().ok_or(ReadError::Cache)?;
    let want = req.want();
    let (lt, gt) = (req.lt.map(time::to_micros), req.gt.map(time::to_micros));
    // A newsfeed's viewer is its owner: a sample of their liked set comes with the range.
    let owner_likes = matches!((timeline, viewer), (Timeline::Newsfeed(u), Some(v)) if u == v);
    // What this page showed last time: its counters come with the range (cache/pages.rs).
    let shape = PageShape {
        list: timeline.key(),
        lt,
        gt,
        count: want,
    };
    let shown_last = match (gt, cache.pages()) {
        (None, Some(pages)) => pages.guess(&shape),
        _ => Box::default(),
    };
    let guess = PageGuess {
        tweets: &shown_last,
        // An owner's likes come with the sample above.
        liked_by: viewer.filter(|_| !owner_likes),
    };
    let window = match cache
        .range(timeline.key(), lt, gt, want, owner_likes, guess)
        .await?
    {
        Range::Hit(w) => {
            stats.hits.fetch_add(1, Ordering::Relaxed);
            w
        }
        Range::Miss { owner_likes } => {
            stats.misses.fetch_add(1, Ordering::Relaxed);
            // An empty sample of the owner's liked set: it is not cached either.
            let load_liked = viewer.filter(|_| owner_likes.is_some_and(|s| s.is_empty()));
            match load_window(db, cache, timeline, req, viewer, load_liked).await? {
                Loaded::Window(window) => window,
                Loaded::Page(items) => {
                    // As below: the next read of this page prefetches its counters.
                    if let (None, Some(pages)) = (gt, cache.pages()) {
                        let ids: Vec<i64> = items.iter().map(|i| i.tweet.id()).collect();
                        pages.remember(shape, &ids);
                    }
                    return Ok(Some(items));
                }
            }
        }
    };
    let entries: Vec<ListMember> = window
        .items
        .iter()
        .filter_map(|member| timeline.parse(member))
        .collect();
    // The cache answers alone if it had a full page, holds everything, or the page ends above
    // the floor of its window.
    let covered = entries.len() >= want
        || window.complete
        || matches!((gt, window.floor), (Some(g), Some(f)) if g >= f);

    let likes = window.owner_likes.as_deref();
    let prefetched = Prefetched {
        ids: &shown_last,
        counts: &window.prefetched,
        liked: window.prefetched_liked.as_ref(),
    };
    let (mut items, gone) = hydrate(db, cache, &entries, viewer, likes, prefetched).await?;
    // Only a page that changed is stored again (an unchanged one needs no lock nor copy).
    let page_ids = entries.iter().map(|e| e.tweet_id);
    if let (None, Some(pages)) = (gt, cache.pages())
        && !page_ids.clone().eq(shown_last.iter().copied())
    {
        pages.remember(shape, &page_ids.collect::<Vec<_>>());
    }
    if !gone.is_empty() {
        let members = gone.iter().map(|e| timeline.member(e)).collect();
        // The delete's own outbox row covers these; this only saves the next reader the work.
        cache
            .apply_best_effort(&[Update::Remove {
                list: timeline.key(),
                members,
                mark: None,
            }])
            .await;
        return Ok(None);
    }
    if !covered {
        stats.fallbacks.fetch_add(1, Ordering::Relaxed);
        // A page that begins inside an incomplete window and ends below it (a reader scrolling
        // past the window's end): grow the list. Pages wholly below it do not ask again, so a
        // list at the limit costs one growth attempt per walk past its end, not one per page.
        if !window.complete && !entries.is_empty() {
            spawn_extension(db, cache, timeline);
        }
        // Postgres continues below the lowest item of a full window (members it could not
        // decode made the page short; the list holds more below them, and its floor, if read,
        // lies further down), else below the list's floor.
        let floor = if window.items.len() >= want {
            items.last().map(|i| i.created_at)
        } else {
            window.floor.map(time::from_micros)
        };
        let below = match (req.lt, floor) {
            (Some(lt), Some(floor)) => Some(lt.min(floor)),
            (lt, floor) => lt.or(floor),
        };
        let rest = want - items.len();
        items.extend(load_page(db, cache, timeline, below, req.gt, rest, viewer).await?);
    }
    Ok(Some(items))
}

/// What the miss path found: the list as another loader stored it (hydrate it as a hit), or
/// the page itself, answered from the first fill's Postgres rows.
enum Loaded {
    Window(Window),
    Page(Vec<Item>),
}

/// The miss path: one load per list at a time (single flight), a page-sized first window
/// answered at once; the list grows to its full window when a read first goes below it
/// ([`spawn_extension`]); see the module docs. `load_liked`: the viewer whose liked set the
/// miss found not cached either (a newsfeed's owner): it is loaded with the page and stored
/// in the same fill.
///
/// A cold first page of a newsfeed whose reader's liked set is not cached either makes three
/// Redis round trips (the range, the start of both loads, the fill) and one Postgres statement
/// (the page with the liked set, decision 0035; two at once before round 41); it made nine
/// Redis round trips and two statements, one after another, before round 32
/// (BENCHMARKS.md; a second range read after the lock, `BEGIN_LOAD`, the `SMISMEMBER` that found
/// the liked set missing, its own `BEGIN_LOAD` and `SET_FILL`, and the floor's read of each
/// range).
async fn load_window(
    db: &PgPool,
    cache: &Cache,
    timeline: Timeline,
    req: &PageRequest,
    viewer: Option<i64>,
    load_liked: Option<i64>,
) -> Result<Loaded, ReadError> {
    let want = req.want();
    let (lt, gt) = (req.lt.map(time::to_micros), req.gt.map(time::to_micros));
    let list = timeline.key();
    let flight = cache.flight(list).ok_or(ReadError::Cache)?;
    let loading = flight.acquire().await;
    if !timeline.owner_exists(db, cache).await? {
        // Nothing to cache: the caller answers the empty page with a 404.
        return Ok(Loaded::Window(Window {
            complete: true,
            floor: None,
            items: Vec::new(),
            ..Window::default()
        }));
    }
    // Start the loads before the snapshots: a write committed after a snapshot bumps the
    // generation, and the fill then refuses to store the stale load. The same round trip
    // tells whether the list is cached by now (the loader we waited for stored it).
    let begun = cache.begin_page_load(list, load_liked).await?;
    if begun.cached
        && let Range::Hit(window) = cache
            .range(list, lt, gt, want, false, PageGuess::default())
            .await?
    {
        return Ok(Loaded::Window(window));
    }
    // The first window is the newest page, hydrated in the same query: a cold first page costs
    // what the page needs (issue 42: the whole window, 1,001 rows, took 25–46 ms). One entry
    // more than the page reads (`want`), so that a warm read of the first page finds more
    // than it asked for and needs no second round trip for the list's floor (`Cache::range`).
    // A refresh asks for up to 1,000 entries but usually finds a few: a default page's window
    // serves it when the refresh's cursor lies inside it, else Postgres answers it below.
    let page = match (req.lt, req.gt) {
        (None, Some(_)) => crate::pagination::DEFAULT_PAGE_SIZE + 1,
        _ => want,
    };
    let first = (page + 1).min(cache.list_limit()).max(1);
    // The reader's liked set when its load began with the list's: its user, its generation and
    // what Postgres holds, read in the page's statement (decision 0035) and stored in the page's
    // fill. Only a newsfeed read by its owner loads one: the range read samples no other set.
    let liked_load = load_liked.zip(begun.liked.as_ref());
    // Before the snapshot, as the loads above: the objects the fill gives Redis are held in
    // this process's memory too unless a write evicted them meanwhile, and those it holds
    // already are not sent (decision 0039).
    let lookup = cache.begin_object_load();
    let (mut rows, liked_set) = match (timeline, liked_load) {
        (Timeline::Newsfeed(owner), Some((user, generation))) if owner == user => {
            let read = crate::newsfeeds::first_rows_and_liked(db, owner, first + 1);
            let (rows, set) = cache.time_postgres("first_fill", read).await?;
            (rows, Some((user, generation, set)))
        }
        _ => {
            let read = timeline.page(db, None, None, first + 1);
            (cache.time_postgres("first_fill", read).await?, None)
        }
    };
    let complete = rows.len() <= first;
    rows.truncate(first);
    let scored: Vec<Scored> = rows.iter().map(|r| timeline.scored(&r.entry())).collect();
    let floor = rows.last().map(|r| time::to_micros(r.created_at));
    // Each row's objects in their cached form: stored below, and the page's items (so this
    // page is the same JSON, byte for byte, as the warm page).
    let (at, objects): (Vec<(i64, Timestamp)>, Vec<Hydrated>) = rows
        .into_iter()
        .map(|r| ((r.entry_id, r.created_at), r.hydrated()))
        .unzip();
    let liked_fill = liked_set.as_ref().map(|(user, generation, set)| LikedFill {
        user: *user,
        generation,
        tweet_ids: set.as_deref(),
    });
    cache
        .fill_hydrated(
            list,
            &begun.list,
            complete,
            &scored,
            LoadedObjects {
                objects: &objects,
                lookup,
            },
            liked_fill,
        )
        .await?;
    drop(loading);
    // The page lies inside the first window unless it starts below it.
    let inside = at.iter().filter(|(_, t)| req.contains(*t)).count();
    let covered = inside >= want || complete || matches!((gt, floor), (Some(g), Some(f)) if g >= f);
    let items = if covered {
        let page: Vec<(i64, Timestamp, Hydrated)> = at
            .into_iter()
            .zip(objects)
            .filter(|((_, t), _)| req.contains(*t))
            .take(want)
            .map(|((id, created_at), o)| (id, created_at, o))
            .collect();
        let ids: Vec<i64> = page.iter().map(|(_, _, o)| o.tweet.id).collect();
        let liked = match &liked_set {
            Some((user, _, set)) => likes::liked_among_set(db, *user, &ids, set.as_deref()).await?,
            None => likes::liked_tweets(db, cache, viewer, &ids).await?,
        };
        page.into_iter()
            .map(|(id, created_at, o)| Item {
                id,
                created_at,
                has_liked: liked.contains(&o.tweet.id),
                tweet: TweetBody::Cached(o.tweet),
                author: AuthorBody::Cached(o.author),
                counts: o.counts,
                has_retweeted: false,
                retweeted: None,
                mentions: Vec::new(),
            })
            .collect()
    } else {
        // A page below the first window: Postgres answers it, and the list grows for the
        // pages after it.
        if let Some(stats) = cache.stats() {
            stats.fallbacks.fetch_add(1, Ordering::Relaxed);
        }
        let items = load_page(db, cache, timeline, req.lt, req.gt, want, viewer).await?;
        spawn_extension(db, cache, timeline);
        items
    };
    Ok(Loaded::Page(items))
}

/// Grows an incomplete cached list in the background, if a permit is free
/// (`CHIRP_CACHE_EXTENSIONS`): called when a read went below its window (a reader scrolls past
/// the first page), after that read was answered from Postgres. Readers who read one page
/// (most returning users: issue 42) cost no more than that page.
fn spawn_extension(db: &PgPool, cache: &Cache, timeline: Timeline) {
    if let Some(permit) = cache.extension_permit() {
        let (db, cache) = (db.clone(), cache.clone());
        tokio::spawn(async move { extend(&db, &cache, timeline, permit).await });
    }
}

/// Grows an incomplete cached list downwards to the list limit: loads the entries below its
/// lowest one and stores them with `EXTEND`, refused if the list was written since the load
/// began ([`crate::cache::scripts::EXTEND`]), so a growth never loses a concurrent write (the
/// list then stays as it was: correct, only shorter). Under the list's single-flight lock, so a
/// process grows a list once at a time.
async fn extend(
    db: &PgPool,
    cache: &Cache,
    timeline: Timeline,
    _permit: tokio::sync::OwnedSemaphorePermit,
) {
    let list = timeline.key();
    let Some(flight) = cache.flight(list) else {
        return;
    };
    let _loading = flight.acquire().await;
    let Ok(Some((generation, floor, len))) = cache.begin_extend(list).await else {
        return;
    };
    let (Some(below), Some(room)) = (floor.micros(), cache.list_limit().checked_sub(len)) else {
        return;
    };
    if room == 0 {
        return;
    }
    let read = timeline.entries(db, Some(time::from_micros(below)), room + 1);
    let mut entries = match cache.time_postgres("extension", read).await {
        Ok(entries) => entries,
        Err(e) => {
            tracing::warn!(error = %e, "growing a cached list failed");
            return;
        }
    };
    let complete = entries.len() <= room;
    entries.truncate(room);
    let scored: Vec<Scored> = entries.iter().map(|e| timeline.scored(e)).collect();
    let _ = cache
        .extend(list, &generation, &floor, complete, &scored)
        .await;
}

/// A page from Postgres alone: one joined query, and `has_liked` for the viewer.
async fn load_page(
    db: &PgPool,
    cache: &Cache,
    timeline: Timeline,
    lt: Option<Timestamp>,
    gt: Option<Timestamp>,
    limit: usize,
    viewer: Option<i64>,
) -> sqlx::Result<Vec<Item>> {
    let rows = (cache.time_postgres("page", timeline.page(db, lt, gt, limit))).await?;
    with_likes(db, cache, rows, viewer).await
}
