//! Timelines: one cache-aside read path for every kind of timeline (a user's newsfeed, a user's
//! own tweets, a list's timeline, a circle's tweets), generic over [`Timeline`]. A new kind is a
//! new variant with its member codec and its SQL; the read path below does not change.
//!
//! The read path (Redis in Action ch. 8's timelines, Mastodon's `FeedManager`):
//! 1. Read the requested range from the cached sorted set (one round trip: a `ZRANGE`, or
//!    `MULTI`/`EXEC` of two for a page with a lower bound). A page without a lower bound also
//!    prefetches the counters of the tweets it showed the last time this process served it
//!    ([`crate::cache::pages`]) that the near cache does not hold, in the same round trip. A
//!    first page of a user's own tweets, a list's timeline or a circle's tweets takes its
//!    members from the list's head in the near cache instead, when held
//!    ([`crate::cache::lists::Head`]).
//! 2. On a miss, take the list's single-flight lock, check that the owner exists (an unknown
//!    list, circle or user gets nothing cached), start a load (its generation), load the
//!    newest page from Postgres with its tweets and authors (one indexed, joined query of
//!    `page_size + 3` rows; a refresh's page is a default page), store it (`page_size + 2`
//!    entries) as the list's first window with `FILL` (refused if
//!    anything was written since) and its objects in the same round trip, release the lock
//!    (readers who waited read the list) and answer from the rows. A read that starts inside
//!    that window and goes below it (step 4) grows the list in the background to `CHIRP_CACHE_LIST_LIMIT`
//!    entries: it loads the entries below its lowest one and stores them with `EXTEND`
//!    (refused if anything was written since). A cold first page thus costs what a page needs,
//!    not what the window needs (issue 42; docs/decisions/0006-page-sized-cold-loads.md).
//! 3. Hydrate the entries in one pipeline: tweet objects, their counts, their authors and the
//!    viewer's liked set (tweets, counters and authors this process holds in its near cache,
//!    [`crate::cache::near`], and counters prefetched in step 1 are not asked for: a warm page
//!    that did not change needs no second round trip; an entry does not name its author, so
//!    the authors of tweets read from Redis take a second `MGET` unless near-cached); misses
//!    with one Postgres query per kind. Entries whose tweet was deleted are removed and the
//!    read is retried.
//! 4. If the cached window ends before the page does (the list is incomplete and the cursor
//!    reaches below its floor), continue in Postgres with `created_at < floor`: the list holds
//!    exactly the items at or above its floor, so the merge neither skips nor repeats.
//!
//! Any Redis failure makes the whole read fall back to one joined Postgres query.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use sqlx::PgPool;

use crate::cache::hydration::Prefetched;
use crate::cache::lists::{
    pack_member, pack_member_shifted, split_time, unpack_entry, unpack_shifted,
};
use crate::cache::objects::{Cached, CachedTweet, CachedUser, Hydrated};
use crate::cache::pages::PageShape;
use crate::cache::{
    Cache, CacheUnavailable, Guard, ListKey, Owner, Prefetch, Scored, Update, Window,
};
use crate::model::{Place, TweetCounts, TweetRecord, UserRecord};
use crate::pagination::PageRequest;
use crate::time::{self, Timestamp};
use crate::{circles, likes, lists, newsfeeds, tweets, users};

/// A timeline: which list, of whom.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timeline {
    /// The newsfeed (home timeline) of a user: fan-out-on-write rows of `newsfeeds`.
    Newsfeed(i64),
    /// The tweets a user wrote (user timeline), from `tweets`.
    UserTweets(i64),
    /// The timeline of a list: fan-out-on-write rows of `list_feeds` (see [`crate::lists`]).
    List(i64),
    /// The tweets posted into a circle, from `tweets` (see [`crate::circles`]).
    Circle(i64),
    /// The pulled tweets of a pull source (an author above `CHIRP_FANOUT_PULL_ABOVE`
    /// followers, [`crate::hybrid`]), from `tweets` where `pulled`: one list that every reader
    /// of the author merges into its newsfeed ([`newsfeeds::read`]).
    Pulled(i64),
}

impl Timeline {
    /// The cached list of this timeline (`{p}:{u42}:feed`, `{p}:{u42}:posts`,
    /// `{p}:{l7}:items`, `{p}:{c3}:items`, `{p}:{u42}:pulled`), in the split-time layout
    /// ([`crate::cache::lists::pack_entry`]). The names changed with each change of encoding,
    /// so lists of an older one are never read (they expire with their TTL).
    pub fn key(self) -> ListKey {
        match self {
            Timeline::Newsfeed(user) => ListKey::timeline(Owner::User(user), "feed"),
            Timeline::UserTweets(user) => ListKey::timeline(Owner::User(user), "posts"),
            Timeline::Pulled(user) => ListKey::timeline(Owner::User(user), "pulled"),
            Timeline::List(list) => ListKey::timeline(Owner::List(list), "items"),
            Timeline::Circle(circle) => ListKey::timeline(Owner::Circle(circle), "items"),
        }
    }

    /// The member of `entry` in this timeline's list ([`pack_member`]): its sub-second part,
    /// then the newsfeed row id and the tweet id (and the entry's shift past its tweet's time,
    /// if any: [`pack_member_shifted`]) in a newsfeed, the tweet id in any other timeline. No
    /// author: hydration takes it from the tweet (near-cached on a warm page).
    pub fn member(self, entry: impl Into<ListMember>) -> Vec<u8> {
        let entry: ListMember = entry.into();
        match self {
            Timeline::Newsfeed(_) => {
                pack_member_shifted(entry.sub_micros, [entry.id, entry.tweet_id], entry.shift)
            }
            Timeline::UserTweets(_)
            | Timeline::List(_)
            | Timeline::Circle(_)
            | Timeline::Pulled(_) => pack_member(entry.sub_micros, &[entry.tweet_id]),
        }
    }

    /// Decodes a member of this timeline's list; `None` for the marker or a member of another
    /// encoding. (Its score, the item's second, is not read: hydration takes the time from the
    /// tweet.)
    pub fn parse(self, member: &[u8]) -> Option<ListMember> {
        let (sub_micros, id, tweet_id, shift) = match self {
            Timeline::Newsfeed(_) => {
                let (sub, [id, tweet_id], shift) = unpack_shifted(member)?;
                (sub, id, tweet_id, shift)
            }
            Timeline::UserTweets(_)
            | Timeline::List(_)
            | Timeline::Circle(_)
            | Timeline::Pulled(_) => {
                let (sub, [tweet_id]) = unpack_entry::<1>(member)?;
                (sub, tweet_id, tweet_id, 0)
            }
        };
        Some(ListMember {
            id,
            tweet_id,
            sub_micros,
            shift,
        })
    }

    /// The merge of fan-out `entries` into this timeline's cached list, guarded by the removal
    /// generation `guard` read while the rows the merge adds were locked (see
    /// [`crate::cache::Guard::Removals`]) and by their predecessor `after` (the timeline's
    /// newest entry before them, if known: [`Update::Merge`]); without a generation (Redis
    /// could not be asked) the safe update is to drop the list.
    pub fn guarded_merge(
        self,
        guard: Option<String>,
        after: Option<Timestamp>,
        entries: &[ListEntry],
    ) -> Update {
        match guard {
            Some(r) => Update::Merge {
                list: self.key(),
                guard: Guard::Removals(r),
                after: after.map(time::to_micros),
                entries: entries.iter().map(|e| self.scored(e)).collect(),
            },
            None => Update::Invalidate { list: self.key() },
        }
    }

    /// `(score, member)` of an entry, for merges and fills.
    pub fn scored(self, entry: &ListEntry) -> Scored {
        let (score, _) = split_time(time::to_micros(entry.created_at));
        (score, self.member(entry))
    }

    /// The newest `limit` entries from Postgres older than `lt` (if given), to fill or grow
    /// the cached list.
    pub(crate) async fn entries(
        self,
        db: &PgPool,
        lt: Option<Timestamp>,
        limit: usize,
    ) -> sqlx::Result<Vec<ListEntry>> {
        match self {
            Timeline::Newsfeed(user) => newsfeeds::entries(db, user, lt, limit).await,
            Timeline::UserTweets(user) => tweets::timeline_entries(db, user, lt, limit).await,
            Timeline::Pulled(user) => tweets::pulled_entries(db, user, lt, limit).await,
            Timeline::List(list) => lists::feed_entries(db, list, lt, limit).await,
            Timeline::Circle(circle) => circles::timeline_entries(db, circle, lt, limit).await,
        }
    }

    /// Whether the owner of this timeline exists: a list, circle or user id may be unknown (or
    /// a list deleted), and the miss path must not cache an empty timeline for it. Handlers ask
    /// only when a page is empty: a page with entries proves its owner (deleting a list deletes
    /// its rows and drops its cached timeline in the same transaction; circles and users are
    /// never deleted), so a warm page needs no Postgres query.
    ///
    /// # Errors
    /// Postgres failed.
    pub async fn owner_exists(self, db: &PgPool, cache: &Cache) -> sqlx::Result<bool> {
        Ok(match self {
            Timeline::Newsfeed(_) => true, // the authenticated viewer's own
            Timeline::Pulled(_) => true,   // read only for an author the reader follows
            Timeline::UserTweets(user) => !users::load_many(db, cache, &[user]).await?.is_empty(),
            Timeline::List(list) => lists::get(db, list).await?.is_some(),
            Timeline::Circle(circle) => circles::get(db, circle).await?.is_some(),
        })
    }

    /// Entries older than `gt` that arrived after `gt` (see [`read`]); only list timelines have
    /// them (a newsfeed entry that arrives behind newer ones is stamped above them:
    /// [`newsfeeds::stamp`]; a user's own, a circle's and pulled tweets are listed in the transaction
    /// that writes them).
    async fn late_arrivals(
        self,
        db: &PgPool,
        gt: Timestamp,
        limit: usize,
    ) -> sqlx::Result<Vec<FeedRow>> {
        match self {
            Timeline::List(list) => lists::late_arrivals(db, list, gt, limit).await,
            Timeline::Newsfeed(_)
            | Timeline::UserTweets(_)
            | Timeline::Circle(_)
            | Timeline::Pulled(_) => Ok(Vec::new()),
        }
    }

    /// A hydrated page from Postgres, strictly between the cursors.
    async fn page(
        self,
        db: &PgPool,
        lt: Option<Timestamp>,
        gt: Option<Timestamp>,
        limit: usize,
    ) -> sqlx::Result<Vec<FeedRow>> {
        match self {
            Timeline::Newsfeed(user) => newsfeeds::rows_page(db, user, lt, gt, limit).await,
            Timeline::UserTweets(user) => tweets::timeline_page(db, user, lt, gt, limit).await,
            Timeline::Pulled(user) => tweets::pulled_page(db, user, lt, gt, limit).await,
            Timeline::List(list) => lists::feed_page(db, list, lt, gt, limit).await,
            Timeline::Circle(circle) => circles::timeline_page(db, circle, lt, gt, limit).await,
        }
    }
}

/// A reference to one item of a timeline: what a cached list entry encodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct ListEntry {
    /// The newsfeed row id (newsfeeds) or the tweet id (every other timeline).
    pub id: i64,
    pub tweet_id: i64,
    /// The tweet's author (the cached member leaves it out: hydration reads it from the tweet).
    pub author_id: i64,
    /// The entry's time: its tweet's `created_at`, plus `shift`.
    pub created_at: Timestamp,
    /// How many µs the entry's time lies past its tweet's: 0 but for a newsfeed entry that
    /// arrived behind newer ones ([`newsfeeds::stamp`]).
    #[sqlx(default)]
    pub shift: i64,
}

impl ListEntry {
    /// The entry `id` of a tweet posted at `tweet_at`, stamped `at` in its timeline.
    pub fn stamped(
        id: i64,
        tweet_id: i64,
        author_id: i64,
        tweet_at: Timestamp,
        at: Timestamp,
    ) -> Self {
        ListEntry {
            id,
            tweet_id,
            author_id,
            created_at: at,
            shift: time::to_micros(at) - time::to_micros(tweet_at),
        }
    }
}

/// What the member of a cached list entry encodes: a [`ListEntry`] without its author and
/// with only the sub-second part of its time. Every timeline entry's time is its tweet's
/// `created_at` plus its shift, so a cached page takes it from the hydrated tweet instead of
/// asking Redis for the scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListMember {
    /// See [`ListEntry::id`].
    pub id: i64,
    pub tweet_id: i64,
    /// The µs of `created_at` past its whole second (0–999,999).
    pub sub_micros: u32,
    /// See [`ListEntry::shift`].
    pub shift: i64,
}

impl From<&ListEntry> for ListMember {
    fn from(e: &ListEntry) -> Self {
        ListMember {
            id: e.id,
            tweet_id: e.tweet_id,
            sub_micros: split_time(time::to_micros(e.created_at)).1,
            shift: e.shift,
        }
    }
}

impl From<&ListMember> for ListMember {
    fn from(m: &ListMember) -> Self {
        *m
    }
}

/// The tweet of a timeline item: typed (read from Postgres) or as cached (ready JSON members,
/// parsed only if a caller needs the fields).
#[derive(Debug, Clone, PartialEq)]
pub enum TweetBody {
    /// Boxed: an item is moved several times on its way into a page, and a record is several
    /// times the size of a cached tweet (the moves' copies showed in the warm page's profile).
    Record(Box<TweetRecord>),
    Cached(CachedTweet),
}

impl TweetBody {
    /// The tweet's id.
    pub fn id(&self) -> i64 {
        match self {
            TweetBody::Record(t) => t.id,
            TweetBody::Cached(t) => t.id,
        }
    }

    /// The tweet's author.
    pub fn user_id(&self) -> i64 {
        match self {
            TweetBody::Record(t) => t.user_id,
            TweetBody::Cached(t) => t.user_id,
        }
    }

    /// When the tweet was posted: also the time of its timeline entries, but for a newsfeed
    /// entry's shift ([`ListEntry::shift`]).
    pub fn created_at(&self) -> Timestamp {
        match self {
            TweetBody::Record(t) => t.created_at,
            TweetBody::Cached(t) => t.created_at,
        }
    }

    /// The typed tweet; `None` if cached members do not parse (a corrupted value).
    pub fn into_record(self) -> Option<TweetRecord> {
        match self {
            TweetBody::Record(t) => Some(*t),
            TweetBody::Cached(t) => t.record(),
        }
    }
}

/// The author of a timeline item: typed (read from Postgres) or as cached (its public fields
/// spliced into a page as they are, parsed only if a caller needs the fields).
#[derive(Debug, Clone, PartialEq)]
pub enum AuthorBody {
    /// Boxed, as [`TweetBody::Record`].
    Record(Box<UserRecord>),
    Cached(CachedUser),
}

impl AuthorBody {
    /// The typed user; `None` if a cached one does not parse (a corrupted value).
    pub fn into_record(self) -> Option<UserRecord> {
        match self {
            AuthorBody::Record(u) => Some(*u),
            AuthorBody::Cached(u) => u.record(),
        }
    }
}

/// One hydrated timeline item.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// See [`ListEntry::id`].
    pub id: i64,
    pub created_at: Timestamp,
    pub tweet: TweetBody,
    pub author: AuthorBody,
    pub counts: TweetCounts,
    /// Whether the viewer liked the tweet (false for anonymous readers).
    pub has_liked: bool,
}

/// The columns of a [`FeedRow`] after its entry's `id as entry_id, created_at`, for a query that
/// joins the tweet as `t` and its author as `u` (a macro, so queries stay `&'static str`).
#[macro_export]
macro_rules! feed_row_columns {
    () => {
        " t.id as tweet_id, t.content, t.circle_id, t.photo_urls, t.coordinates, t.place,
          t.likes_count, t.comments_count, t.counts_version,
          u.id as author_id, u.username, u.nickname, u.avatar_url, u.version,
          u.created_at as author_created_at, t.created_at as tweet_created_at "
    };
}

/// A timeline row read from Postgres with its tweet and author joined in.
#[derive(Debug, sqlx::FromRow)]
pub struct FeedRow {
    pub entry_id: i64,
    pub created_at: Timestamp,
    pub tweet_id: i64,
    pub content: String,
    pub circle_id: Option<i64>,
    pub photo_urls: Vec<String>,
    pub coordinates: Option<Vec<f64>>,
    pub place: Option<sqlx::types::Json<Place>>,
    #[sqlx(flatten)]
    pub counts: TweetCounts,
    pub author_id: i64,
    pub username: String,
    pub nickname: Option<String>,
    pub avatar_url: Option<String>,
    pub version: i64,
    pub author_created_at: Timestamp,
    /// The tweet's time (the entry's, `created_at`, may lie later: [`ListEntry::shift`]).
    pub tweet_created_at: Timestamp,
}

impl FeedRow {
    /// The list entry of this row (its tweet's time lies `shift` µs before the entry's).
    pub fn entry(&self) -> ListEntry {
        ListEntry::stamped(
            self.entry_id,
            self.tweet_id,
            self.author_id,
            self.tweet_created_at,
            self.created_at,
        )
    }

    /// The row's tweet, counts and author in their cached forms (each encoded once).
    fn hydrated(self) -> Hydrated {
        let tweet = TweetRecord {
            id: self.tweet_id,
            user_id: self.author_id,
            content: self.content,
            created_at: self.tweet_created_at,
            circle_id: self.circle_id,
            photo_urls: self.photo_urls,
            coordinates: self.coordinates,
            place: self.place,
        };
        let author = UserRecord {
            id: self.author_id,
            username: self.username,
            nickname: self.nickname,
            avatar_url: self.avatar_url,
            version: self.version,
            created_at: self.author_created_at,
        };
        Hydrated {
            tweet: CachedTweet::of(&tweet),
            counts: self.counts,
            author: CachedUser::of(&author),
            author_version: author.version,
        }
    }
}

impl From<FeedRow> for Item {
    fn from(r: FeedRow) -> Self {
        Item {
            id: r.entry_id,
            created_at: r.created_at,
            tweet: TweetBody::Record(Box::new(TweetRecord {
                id: r.tweet_id,
                user_id: r.author_id,
                content: r.content,
                created_at: r.tweet_created_at,
                circle_id: r.circle_id,
                photo_urls: r.photo_urls,
                coordinates: r.coordinates,
                place: r.place,
            })),
            author: AuthorBody::Record(Box::new(UserRecord {
                id: r.author_id,
                username: r.username,
                nickname: r.nickname,
                avatar_url: r.avatar_url,
                version: r.version,
                created_at: r.author_created_at,
            })),
            counts: r.counts,
            has_liked: false,
        }
    }
}

enum ReadError {
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
    let guess = match (gt, cache.pages()) {
        (None, Some(pages)) => pages.guess(&shape),
        _ => Box::default(),
    };
    let prefetch = Prefetch {
        tweets: &guess,
        // An owner's likes come with the sample above.
        liked_by: viewer.filter(|_| !owner_likes),
    };
    let window = match cache
        .range(timeline.key(), lt, gt, want, owner_likes, prefetch)
        .await?
    {
        Some(w) => {
            stats.hits.fetch_add(1, Ordering::Relaxed);
            w
        }
        None => {
            stats.misses.fetch_add(1, Ordering::Relaxed);
            match load_window(db, cache, timeline, req, viewer).await? {
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
        ids: &guess,
        counts: &window.prefetched,
        liked: window.prefetched_liked.as_ref(),
    };
    let (mut items, gone) = hydrate(db, cache, &entries, viewer, likes, prefetched).await?;
    // Only a page that changed is stored again (an unchanged one needs no lock nor copy).
    let page_ids = entries.iter().map(|e| e.tweet_id);
    if let (None, Some(pages)) = (gt, cache.pages())
        && !page_ids.clone().eq(guess.iter().copied())
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
/// ([`spawn_extension`]); see the module docs.
async fn load_window(
    db: &PgPool,
    cache: &Cache,
    timeline: Timeline,
    req: &PageRequest,
    viewer: Option<i64>,
) -> Result<Loaded, ReadError> {
    let want = req.want();
    let (lt, gt) = (req.lt.map(time::to_micros), req.gt.map(time::to_micros));
    let list = timeline.key();
    let flight = cache.flight(list).ok_or(ReadError::Cache)?;
    let loading = flight.acquire().await;
    if let Some(window) = cache
        .range(list, lt, gt, want, false, Prefetch::default())
        .await?
    {
        return Ok(Loaded::Window(window)); // another request loaded it while we waited
    }
    if !timeline.owner_exists(db, cache).await? {
        // Nothing to cache: the caller answers the empty page with a 404.
        return Ok(Loaded::Window(Window {
            complete: true,
            floor: None,
            items: Vec::new(),
            ..Window::default()
        }));
    }
    // Start the load before the snapshot: a write committed after the snapshot bumps the
    // generation, and FILL then refuses to store the stale load.
    let generation = cache.begin_load(list).await?;
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
    let mut rows = timeline.page(db, None, None, first + 1).await?;
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
    cache
        .fill_hydrated(list, &generation, complete, &scored, &objects)
        .await?;
    drop(loading);
    // The page lies inside the first window unless it starts below it.
    let inside = at.iter().filter(|(_, t)| req.contains(*t)).count();
    let covered = inside >= want || complete || matches!((gt, floor), (Some(g), Some(f)) if g >= f);
    let items = if covered {
        let page = at
            .into_iter()
            .zip(objects)
            .filter(|((_, t), _)| req.contains(*t))
            .take(want)
            .map(|((id, created_at), o)| Item {
                id,
                created_at,
                tweet: TweetBody::Cached(o.tweet),
                author: AuthorBody::Cached(o.author),
                counts: o.counts,
                has_liked: false,
            })
            .collect();
        mark_liked(db, cache, page, viewer).await?
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
    let mut entries = match timeline
        .entries(db, Some(time::from_micros(below)), room + 1)
        .await
    {
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

/// Hydrates entries from the object caches, falling back to Postgres for misses. Returns the
/// items in order and the entries whose tweet no longer exists. `viewer_likes`: a sample of
/// the viewer's liked set, if the range read took one ([`Window::owner_likes`]);
/// `prefetched`: counters the range read took along ([`Window::prefetched`]).
async fn hydrate(
    db: &PgPool,
    cache: &Cache,
    entries: &[ListMember],
    viewer: Option<i64>,
    viewer_likes: Option<&[i64]>,
    prefetched: Prefetched<'_>,
) -> Result<(Vec<Item>, Vec<ListMember>), ReadError> {
    let ids: Vec<i64> = entries.iter().map(|e| e.tweet_id).collect();
    // One round trip: tweets, their counts, their authors, the viewer's likes.
    let fetched = cache
        .fetch_for_hydration(&ids, true, viewer, viewer_likes, prefetched)
        .await?;
    let mut author_ids = fetched.authors;

    // Everything below is aligned with `ids` (the entries) or with the sorted `author_ids`: a
    // page is at most a few dozen items, so positions and binary search beat hashing.
    let mut tweets: Vec<Option<(TweetBody, TweetCounts)>> = Vec::with_capacity(ids.len());
    let mut misses = Vec::new();
    for ((id, tweet), count) in ids.iter().zip(fetched.tweets).zip(fetched.counts) {
        tweets.push(match (tweet, count) {
            (Cached::Deleted, _) => None,
            (Cached::Hit(t), Some(c)) => Some((TweetBody::Cached(t), c)),
            _ => {
                misses.push(*id);
                None
            }
        });
    }
    if !misses.is_empty() {
        let loaded: Vec<(TweetRecord, TweetCounts)> = tweets::rows_by_ids(db, &misses)
            .await?
            .into_iter()
            .map(|r| (r.record, r.counts))
            .collect();
        let absent: Vec<i64> = misses
            .iter()
            .copied()
            .filter(|id| !loaded.iter().any(|(t, _)| t.id == *id))
            .collect();
        cache.put_tweets(&loaded, &absent).await;
        for (tweet, counts) in loaded {
            // The first entry of this tweet gets it; a repeat finds it among the items below.
            if let Some(i) = ids
                .iter()
                .zip(&tweets)
                .position(|(id, t)| *id == tweet.id && t.is_none())
            {
                tweets[i] = Some((TweetBody::Record(Box::new(tweet)), counts));
            }
        }
    }
    let mut authors: Vec<Option<AuthorBody>> = fetched
        .users
        .into_iter()
        .map(|u| u.map(AuthorBody::Cached))
        .collect();
    // The authors of tweets loaded from Postgres were not known to the pipeline.
    for (tweet, _) in tweets.iter().flatten() {
        if let Err(at) = author_ids.binary_search(&tweet.user_id()) {
            author_ids.insert(at, tweet.user_id());
            authors.insert(at, None);
        }
    }
    let missing_authors: Vec<i64> = author_ids
        .iter()
        .zip(&authors)
        .filter(|(_, a)| a.is_none())
        .map(|(id, _)| *id)
        .collect();
    // Misses were asked of Redis above: go straight to Postgres for them.
    for (id, user) in users::load_uncached(db, cache, &missing_authors).await? {
        if let Ok(i) = author_ids.binary_search(&id) {
            authors[i] = Some(AuthorBody::Record(Box::new(user)));
        }
    }
    let liked = match viewer {
        // The pipeline asked the viewer's liked set: `fetched.liked` is its answer.
        Some(user) => likes::liked_given(db, cache, user, &ids, fetched.liked).await?,
        None => HashSet::new(),
    };

    let mut items: Vec<Item> = Vec::with_capacity(entries.len());
    let mut gone = Vec::new();
    for (e, tweet) in entries.iter().zip(tweets) {
        let author_of = |user_id: i64| {
            author_ids
                .binary_search(&user_id)
                .ok()
                .and_then(|i| authors[i].clone())
        };
        let found = match tweet {
            // A tweet is moved into its first item, not cloned.
            Some((tweet, counts)) => author_of(tweet.user_id()).map(|a| (tweet, counts, a)),
            // A page lists a tweet once; should it list one twice, the repeat clones the first.
            None => items
                .iter()
                .find(|i| i.tweet.id() == e.tweet_id)
                .map(|first| (first.tweet.clone(), first.counts, first.author.clone())),
        };
        match found {
            Some((tweet, counts, author)) => items.push(Item {
                id: e.id,
                created_at: time::from_micros(time::to_micros(tweet.created_at()) + e.shift),
                tweet,
                author,
                counts,
                has_liked: liked.contains(&e.tweet_id),
            }),
            None => gone.push(*e),
        }
    }
    Ok((items, gone))
}

/// Hydrates entries that are not a timeline page (a rank): like the read path, from the object
/// caches with Postgres for misses. Returns the items in order (entries of deleted tweets are
/// left out) and whether Redis answered (`false`: the caller should read Postgres alone).
///
/// # Errors
/// Only Postgres errors.
pub async fn hydrate_entries(
    db: &PgPool,
    cache: &Cache,
    entries: &[ListEntry],
    viewer: Option<i64>,
) -> sqlx::Result<Option<Vec<Item>>> {
    let members: Vec<ListMember> = entries.iter().map(ListMember::from).collect();
    match hydrate(db, cache, &members, viewer, None, Prefetched::default()).await {
        Ok((items, _gone)) => Ok(Some(items)),
        Err(ReadError::Cache) => Ok(None),
        Err(ReadError::Db(e)) => Err(e),
    }
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
    let rows = timeline.page(db, lt, gt, limit).await?;
    with_likes(db, cache, rows, viewer).await
}

/// Runs `sql`, a query of a timeline's newest entries (to fill or grow its cached list) whose
/// parameters are the timeline's owner (`$1`), `lt` (`$2`: only entries older, if not null)
/// and the limit (`$3`): the Postgres side of every [`Timeline::entries`].
pub(crate) async fn fetch_entries(
    db: &PgPool,
    sql: &'static str,
    owner: i64,
    lt: Option<Timestamp>,
    limit: usize,
) -> sqlx::Result<Vec<ListEntry>> {
    sqlx::query_as(sql)
        .bind(owner)
        .bind(lt)
        .bind(limit as i64)
        .fetch_all(db)
        .await
}

/// Runs `sql`, a hydrated page query strictly between the cursors whose parameters are the
/// timeline's owner (`$1`), `lt` (`$2`), `gt` (`$3`) and the limit (`$4`): the Postgres side
/// of every [`Timeline`] page.
pub(crate) async fn fetch_page(
    db: &PgPool,
    sql: &'static str,
    owner: i64,
    lt: Option<Timestamp>,
    gt: Option<Timestamp>,
    limit: usize,
) -> sqlx::Result<Vec<FeedRow>> {
    sqlx::query_as(sql)
        .bind(owner)
        .bind(lt)
        .bind(gt)
        .bind(limit as i64)
        .fetch_all(db)
        .await
}

/// Items from joined Postgres rows, with `has_liked` for the viewer.
pub async fn with_likes(
    db: &PgPool,
    cache: &Cache,
    rows: Vec<FeedRow>,
    viewer: Option<i64>,
) -> sqlx::Result<Vec<Item>> {
    mark_liked(
        db,
        cache,
        rows.into_iter().map(Item::from).collect(),
        viewer,
    )
    .await
}

/// Sets `has_liked` of `items` for the viewer.
async fn mark_liked(
    db: &PgPool,
    cache: &Cache,
    mut items: Vec<Item>,
    viewer: Option<i64>,
) -> sqlx::Result<Vec<Item>> {
    let ids: Vec<i64> = items.iter().map(|i| i.tweet.id()).collect();
    let liked = likes::liked_tweets(db, cache, viewer, &ids).await?;
    for item in &mut items {
        item.has_liked = liked.contains(&item.tweet.id());
    }
    Ok(items)
}
