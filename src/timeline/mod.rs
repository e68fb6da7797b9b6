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

mod hydration;
mod read;

pub(crate) use hydration::{fetch_entries, fetch_page};
pub use hydration::{hydrate_entries, with_likes};
pub use read::read;

use sqlx::PgPool;

use crate::cache::lists::{
    pack_member, pack_member_shifted, split_time, unpack_entry, unpack_shifted,
};
use crate::cache::objects::{CachedTweet, CachedUser, Hydrated};
use crate::cache::{Cache, Guard, ListKey, Owner, Scored, Update};
use crate::model::{Place, TweetCounts, TweetRecord, UserRecord};
use crate::time::{self, Timestamp};
use crate::{circles, hashtags, lists, newsfeeds, tweets, users};

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
    /// The tweets with a hashtag (by the tag's id), from `tweet_hashtags` (see
    /// [`crate::hashtags`]).
    Hashtag(i64),
}

impl Timeline {
    /// The cached list of this timeline (`{p}:{u42}:feed`, `{p}:{u42}:posts`,
    /// `{p}:{l7}:items`, `{p}:{c3}:items`, `{p}:{u42}:pulled`, `{p}:{h9}:items`), in the split-time layout
    /// ([`crate::cache::lists::pack_entry`]). The names changed with each change of encoding,
    /// so lists of an older one are never read (they expire with their TTL).
    pub fn key(self) -> ListKey {
        match self {
            Timeline::Newsfeed(user) => ListKey::timeline(Owner::User(user), "feed"),
            Timeline::UserTweets(user) => ListKey::timeline(Owner::User(user), "posts"),
            Timeline::Pulled(user) => ListKey::timeline(Owner::User(user), "pulled"),
            Timeline::List(list) => ListKey::timeline(Owner::List(list), "items"),
            Timeline::Circle(circle) => ListKey::timeline(Owner::Circle(circle), "items"),
            Timeline::Hashtag(tag) => ListKey::timeline(Owner::Hashtag(tag), "items"),
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
            | Timeline::Hashtag(_)
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
            | Timeline::Hashtag(_)
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
            Timeline::Hashtag(tag) => hashtags::timeline_entries(db, tag, lt, limit).await,
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
            Timeline::Hashtag(tag) => hashtags::exists(db, tag).await?,
        })
    }

    /// Entries older than `gt` that arrived after `gt` (see [`fn@read`]); only list timelines have
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
            | Timeline::Hashtag(_)
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
            Timeline::Hashtag(tag) => hashtags::timeline_page(db, tag, lt, gt, limit).await,
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

    /// The tweet it retweets, if it is a retweet ([`crate::retweets`]).
    pub fn retweeted_tweet_id(&self) -> Option<i64> {
        match self {
            TweetBody::Record(t) => t.retweeted_tweet_id,
            TweetBody::Cached(t) => t.retweeted_tweet_id,
        }
    }

    /// The users its text mentions, in order ([`crate::mentions`]).
    pub fn mentioned_user_ids(&self) -> &[i64] {
        match self {
            TweetBody::Record(t) => &t.mentioned_user_ids,
            TweetBody::Cached(t) => &t.mentions,
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
    /// Whether the viewer retweeted the tweet (false for anonymous readers and until
    /// [`crate::retweets::attach`] ran).
    pub has_retweeted: bool,
    /// A retweet's retweeted tweet, hydrated by [`crate::retweets::attach`] (`None` before, and
    /// for a tweet that is not a retweet).
    pub retweeted: Option<Box<Item>>,
    /// The users the tweet mentions, in order, hydrated by [`crate::mentions::attach`] (empty
    /// before; a mentioned user who could not be loaded is left out).
    pub mentions: Vec<AuthorBody>,
}

/// The columns of a [`FeedRow`] after its entry's `id as entry_id, created_at`, for a query that
/// joins the tweet as `t` and its author as `u` (a macro, so queries stay `&'static str`).
#[macro_export]
macro_rules! feed_row_columns {
    () => {
        " t.id as tweet_id, t.content, t.circle_id, t.photo_urls, t.coordinates, t.place,
          t.edited_at, t.edit_version, t.in_reply_to_tweet_id, t.in_reply_to_user_id,
          t.retweeted_tweet_id, t.mentioned_user_ids, t.likes_count, t.comments_count, t.replies_count, t.retweets_count,
          t.counts_version,
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
    pub edited_at: Option<Timestamp>,
    pub edit_version: i64,
    pub in_reply_to_tweet_id: Option<i64>,
    pub in_reply_to_user_id: Option<i64>,
    pub retweeted_tweet_id: Option<i64>,
    pub mentioned_user_ids: Vec<i64>,
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
            edited_at: self.edited_at,
            edit_version: self.edit_version,
            in_reply_to_tweet_id: self.in_reply_to_tweet_id,
            in_reply_to_user_id: self.in_reply_to_user_id,
            retweeted_tweet_id: self.retweeted_tweet_id,
            mentioned_user_ids: self.mentioned_user_ids,
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
                edited_at: r.edited_at,
                edit_version: r.edit_version,
                in_reply_to_tweet_id: r.in_reply_to_tweet_id,
                in_reply_to_user_id: r.in_reply_to_user_id,
                retweeted_tweet_id: r.retweeted_tweet_id,
                mentioned_user_ids: r.mentioned_user_ids,
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
            has_retweeted: false,
            retweeted: None,
            mentions: Vec::new(),
        }
    }
}
