//! Per-object caches used for hydration: tweet objects (immutable until deleted, then a
//! tombstone) with their counts, user objects (versioned, so a slow reader can not put back an
//! old profile), bearer tokens (tombstoned on logout) and each user's liked set (`has_liked`).

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use crate::cache::Scored;
use crate::cache::counts::Versioned;
use crate::cache::keys::Object;
use crate::cache::near::{Lookup, NearKey};
use crate::cache::{Cache, CacheUnavailable, Generation, Keys, ListKey, keys, scripts};
use crate::model::{TweetCounts, TweetRecord, UserRecord};

/// The value a deleted tweet's object key (or a revoked token's key) holds, so no reader can
/// cache it again.
pub const TOMBSTONE: &str = "-";

/// The member that marks a liked set as cached (an integer, so the set keeps Redis's compact
/// intset encoding; tweet ids are positive).
pub const LIKED_MARKER: i64 = -1;
/// The member of a liked set that says "too many likes to cache: ask Postgres per page".
pub const TOO_MANY_MARKER: i64 = -2;

/// The pub/sub topic of near-cache evictions of objects: `{p}:{bus}:objects`, payload
/// `"{nonce} t17 u42 …"` (see [`super::near`]).
pub const OBJECTS_TOPIC: &str = "objects";

/// An object a process may keep in its near cache: a tweet (`t17` in eviction messages), a
/// user (`u42`) or a tweet's counters (`c17`). Tweets' public fields never change (a delete
/// evicts them); a user changes with a new version (its [`super::Update::UserChanged`] evicts
/// it); counters change with every like and comment, whose [`super::Update::TweetCounts`]
/// evicts them everywhere before the write answers, as any versioned value the outbox writes
/// (docs/decisions/0015-near-cached-counters.md: a warm page then asks Redis for its list
/// alone). The head of a held list (`hu42`: user 42's tweets, `hc3`: circle 3's, `hl7`: list
/// 7's timeline; [`ListKey::head_held`]) changes with a tweet written or deleted, or a fan-out
/// or membership job's batch, whose outbox repair evicts it the same way
/// (docs/decisions/0016-held-timeline-heads.md: a warm page of such a list then needs no round
/// trip at all). A user's liked set (`l42`, [`HeldLikes`]) changes with each of the user's likes
/// and cancels, whose outbox repair (an invalidation of the set) evicts it the same way
/// (docs/decisions/0017-held-liked-sets.md: a logged-in reader's warm page of a held list then
/// needs no round trip either).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NearId {
    Tweet(i64),
    User(i64),
    Counts(i64),
    Head(ListKey),
    Likes(i64),
}

impl NearKey for NearId {
    fn to_message(&self) -> String {
        match self {
            NearId::Tweet(id) => format!("t{id}"),
            NearId::User(id) => format!("u{id}"),
            NearId::Counts(id) => format!("c{id}"),
            NearId::Head(list) => format!("h{}", list.owner),
            NearId::Likes(user) => format!("l{user}"),
        }
    }
    fn from_message(text: &str) -> Option<Self> {
        match text.split_at_checked(1)? {
            ("t", id) => id.parse().ok().map(NearId::Tweet),
            ("u", id) => id.parse().ok().map(NearId::User),
            ("c", id) => id.parse().ok().map(NearId::Counts),
            ("l", id) => id.parse().ok().map(NearId::Likes),
            ("h", tag) => {
                let (letter, id) = tag.split_at_checked(1)?;
                ListKey::held_head(Some((letter, id.parse().ok()?)), None).map(NearId::Head)
            }
            _ => None,
        }
    }
}

impl NearId {
    /// The object a key written by the outbox relay caches, if one a near cache may hold
    /// (a tweet, a user, a tweet's counters, the head of a held list, a liked set).
    pub fn of_key(key: &str) -> Option<Self> {
        if let Some(list) = Keys::parse_held_list(key) {
            return Some(NearId::Head(list));
        }
        if let Some(user) = Keys::parse_liked(key) {
            return Some(NearId::Likes(user));
        }
        match Keys::parse_object(key)? {
            (Object::Tweet, id) => Some(NearId::Tweet(id)),
            (Object::User, id) => Some(NearId::User(id)),
            (Object::TweetCounts, id) => Some(NearId::Counts(id)),
        }
    }
}

/// A near-cached object (cheap to clone: the JSON is shared).
#[derive(Debug, Clone)]
pub enum NearObject {
    Tweet(CachedTweet),
    User(CachedUser),
    Counts(TweetCounts),
    Head(std::sync::Arc<super::lists::Head>),
    Likes(std::sync::Arc<HeldLikes>),
}

/// Most tweet ids of a user's liked set a process holds in its near cache ([`HeldLikes`]).
pub const NEAR_LIKES: usize = 64;

/// A user's cached liked set as a process holds it in its near cache ([`NearId::Likes`]),
/// from an `SRANDMEMBER liked` that asked for more members than the set holds, so that it came
/// whole ([`HeldLikes::from_sample`]): a logged-in reader's pages then take `has_liked` from
/// memory instead of an `SMISMEMBER` of their tweets (docs/decisions/0017-held-liked-sets.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeldLikes {
    /// Every tweet the user liked (at most [`NEAR_LIKES`]), sorted.
    All(Box<[i64]>),
    /// More than [`NEAR_LIKES`]: pages ask Redis (`SMISMEMBER`), and no sample is read again
    /// while this is held.
    Many,
    /// The set's "too many likes to cache" marker: pages ask Postgres.
    TooMany,
}

impl HeldLikes {
    /// How many members to sample to learn whether a set is small: its marker, up to
    /// [`NEAR_LIKES`] ids and one more.
    pub const SAMPLE: usize = NEAR_LIKES + 2;

    /// What `SRANDMEMBER liked {asked}` answered (`sample`) says of the whole set: `None` if the
    /// set is not cached (an empty sample; a whole one without the marker), or if the sample
    /// may be only a part of a set of up to [`NEAR_LIKES`] ids (a smaller `asked`, such as a
    /// newsfeed's [`LIKED_SAMPLE`]). A full sample of [`HeldLikes::SAMPLE`] is a larger set
    /// whether or not it drew the marker (a set exists only with it: `SET_FILL` writes it,
    /// `SET_ADD` never creates a set), which a large set's sample rarely does.
    pub fn from_sample(sample: &[i64], asked: usize) -> Option<Self> {
        if sample.len() >= asked {
            return (asked >= Self::SAMPLE).then_some(HeldLikes::Many);
        }
        if !sample.contains(&LIKED_MARKER) {
            return None;
        }
        if sample.contains(&TOO_MANY_MARKER) {
            return Some(HeldLikes::TooMany);
        }
        let mut ids: Vec<i64> = sample.iter().copied().filter(|id| *id > 0).collect();
        ids.sort_unstable();
        Some(HeldLikes::All(ids.into()))
    }

    /// The near-cache entry of `user`'s liked set from a sample ([`HeldLikes::from_sample`]).
    fn entry(user: i64, sample: &[i64], asked: usize) -> Option<(NearId, NearObject)> {
        let held = HeldLikes::from_sample(sample, asked)?;
        Some((
            NearId::Likes(user),
            NearObject::Likes(std::sync::Arc::new(held)),
        ))
    }

    /// Which of `tweet_ids` are liked; `None` for [`HeldLikes::Many`] (ask Redis).
    pub fn among(&self, tweet_ids: &[i64]) -> Option<LikedAmong> {
        match self {
            HeldLikes::All(ids) => Some(LikedAmong::Liked(
                (tweet_ids.iter().copied())
                    .filter(|id| ids.binary_search(id).is_ok())
                    .collect(),
            )),
            HeldLikes::Many => None,
            HeldLikes::TooMany => Some(LikedAmong::TooMany),
        }
    }
}

/// What a range read found in this process's memory ([`Cache::held_for_range`]).
pub struct Held {
    /// The lookup the read began (`None`: the near cache is off or nothing was looked up).
    pub lookup: Option<Lookup>,
    /// The held list's head, if held.
    pub head: Option<std::sync::Arc<super::lists::Head>>,
    /// The counters of the tweets asked for, in order (`None`: not held).
    pub counts: Vec<Option<TweetCounts>>,
    /// The liked set asked for, if held.
    pub likes: Option<std::sync::Arc<HeldLikes>>,
}

/// What the cache knows of one object.
#[derive(Debug, Clone, PartialEq)]
pub enum Cached<T> {
    /// Not cached (or unreadable): ask Postgres.
    Miss,
    /// Known to be deleted.
    Deleted,
    /// Cached.
    Hit(T),
}

/// A tweet object as cached: its author, and its public fields (which never change) as ready
/// JSON object members in the order of the public `Tweet`:
/// `"id":17,"created_at":"…","content":"…","circle_id":null,"photo_urls":[],"coordinates":null,"place":null`.
/// Timeline pages splice the members into the response as they are
/// ([`crate::tweets::TweetJson`]): no parsing, escaping or timestamp formatting per tweet.
/// Stored as `"3|{user_id}|{created_at µs}|{members}"` (the timestamp, so a timeline page takes
/// each item's time from its tweet instead of asking Redis for its list entry's score); the
/// older `"2|{user_id}|{members}"` and plain-JSON [`TweetRecord`] values are still read.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedTweet {
    pub id: i64,
    pub user_id: i64,
    pub created_at: crate::time::Timestamp,
    /// Shared: a near-cached tweet is cloned into every page that lists it.
    pub members: std::sync::Arc<str>,
}

/// The public fields of a tweet, as [`CachedTweet::members`] holds them.
#[derive(serde::Serialize)]
struct PublicFields<'a> {
    id: i64,
    #[serde(serialize_with = "crate::time::serialize")]
    created_at: crate::time::Timestamp,
    content: &'a str,
    circle_id: Option<i64>,
    photo_urls: &'a [String],
    coordinates: Option<&'a [f64]>,
    place: Option<&'a crate::model::Place>,
}

impl CachedTweet {
    /// The cached form of a tweet.
    pub fn of(tweet: &TweetRecord) -> Self {
        let fields = PublicFields {
            id: tweet.id,
            created_at: tweet.created_at,
            content: &tweet.content,
            circle_id: tweet.circle_id,
            photo_urls: &tweet.photo_urls,
            coordinates: tweet.coordinates.as_deref(),
            place: tweet.place.as_ref().map(|p| &p.0),
        };
        // Serialising plain strings, numbers and `Place` can not fail.
        let json = serde_json::to_string(&fields).unwrap_or_else(|_| "{}".to_owned());
        let members = json
            .strip_prefix('{')
            .and_then(|j| j.strip_suffix('}'))
            .unwrap_or_default()
            .into();
        CachedTweet {
            id: tweet.id,
            user_id: tweet.user_id,
            created_at: tweet.created_at,
            members,
        }
    }

    /// The typed tweet (parses the members); `None` if they do not parse.
    pub fn record(&self) -> Option<TweetRecord> {
        let json = format!("{{\"user_id\":{},{}}}", self.user_id, self.members);
        serde_json::from_str(&json).ok()
    }

    fn encode(&self) -> String {
        format!(
            "3|{}|{}|{}",
            self.user_id,
            crate::time::to_micros(self.created_at),
            self.members
        )
    }

    /// A stored value (the members are copied once, into the shared buffer).
    fn decode(value: String) -> Option<Self> {
        if value.starts_with('{') {
            return serde_json::from_str::<TweetRecord>(&value)
                .ok()
                .map(|t| CachedTweet::of(&t));
        }
        let (version, rest) = value.split_once('|')?;
        let (user, rest) = rest.split_once('|')?;
        let (created_at, members) = match version {
            "3" => {
                let (micros, members) = rest.split_once('|')?;
                (
                    Some(crate::time::from_micros(micros.parse().ok()?)),
                    members,
                )
            }
            "2" => (None, rest),
            _ => return None,
        };
        // `"id":` leads the members.
        let id = members
            .strip_prefix("\"id\":")?
            .split(',')
            .next()?
            .parse()
            .ok()?;
        let user_id = user.parse().ok()?;
        let created_at = match created_at {
            Some(t) => t,
            None => created_at_member(members)?,
        };
        Some(CachedTweet {
            id,
            user_id,
            created_at,
            members: members.into(),
        })
    }
}

/// The `created_at` member of a tweet's public members (the format that did not store it
/// apart): `"created_at":"2025-11-23T12:13:20.123456Z"` follows `"id":…,`.
fn created_at_member(members: &str) -> Option<crate::time::Timestamp> {
    let (_, rest) = members.split_once(",\"created_at\":\"")?;
    let (text, _) = rest.split_once('"')?;
    crate::time::parse_cursor(text)
}

/// A user object as cached: the stored `UserRecord` JSON (see [`encode_user`]), shared by every
/// item of a page that has this author. Timeline pages splice its public fields (`id`,
/// `username`, `nickname`, `avatar_url`: the leading members of the stored object) into the
/// response as they are ([`CachedUser::public_head`]), like [`CachedTweet`]: no parsing or
/// re-escaping per author. Typed paths parse it on demand ([`CachedUser::record`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CachedUser {
    pub id: i64,
    json: std::sync::Arc<str>,
    /// Where the public members end (the `,` of `,"version":`), found once when decoded.
    public_end: Option<usize>,
}

/// A tweet, its counters and its author as one Postgres row gave them, in the cached forms a
/// page is written from: what a cold page shows and stores ([`Cache::fill_hydrated`]).
#[derive(Debug, Clone)]
pub struct Hydrated {
    pub tweet: CachedTweet,
    pub counts: TweetCounts,
    pub author: CachedUser,
    /// The author's version (the user object's `SET_IF_NEWER` guard).
    pub author_version: i64,
}

impl CachedUser {
    /// The cached form of a user (as [`Cache::put_users`] stores it).
    pub fn of(user: &UserRecord) -> Self {
        // Serialising plain strings and numbers can not fail.
        let json = serde_json::to_string(user).unwrap_or_default();
        CachedUser {
            id: user.id,
            public_end: public_end(&json),
            json: json.into(),
        }
    }

    /// The public `User` object without its closing `}`: the stored object up to its `version`
    /// member. `None` if the stored JSON is not in that shape (then parse it with
    /// [`CachedUser::record`]).
    pub fn public_head(&self) -> Option<&str> {
        self.public_end.map(|end| &self.json[..end])
    }

    /// The typed user (parses the stored JSON); `None` if it does not parse.
    pub fn record(&self) -> Option<UserRecord> {
        serde_json::from_str(&self.json).ok()
    }

    /// A stored value (`"{version}|{json}"`) of user `id`; `None` for a floor or garbage.
    fn decode(id: i64, value: &str) -> Option<Self> {
        let (_, json) = value.split_once('|')?;
        json.starts_with('{').then(|| CachedUser {
            id,
            public_end: public_end(json),
            json: json.into(),
        })
    }
}

/// The offset of the last `,"version":` in a stored user object that begins with `{"id":`.
/// A `,"version":` inside a string value would have its quotes escaped, so the last one (near
/// the end, where `version` and `created_at` are) is the member. A backward scan over commas:
/// `str::rfind` set up a two-way searcher per call, 4 % of a warm newsfeed page (callgrind).
fn public_end(json: &str) -> Option<usize> {
    const MEMBER: &[u8] = b",\"version\":";
    if !json.starts_with("{\"id\":") {
        return None;
    }
    let bytes = json.as_bytes();
    let mut end = bytes.len();
    while let Some(comma) = bytes[..end].iter().rposition(|&b| b == b',') {
        if bytes[comma..].starts_with(MEMBER) {
            return Some(comma);
        }
        end = comma;
    }
    None
}

/// What the cache knows of a bearer token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CachedToken {
    /// Not cached: ask Postgres.
    Miss,
    /// Revoked (logout).
    Revoked,
    /// Valid for this user.
    User(i64),
}

/// What a user's cached liked set says about some tweets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LikedAmong {
    /// The set is not cached: load it.
    Miss,
    /// The user has too many likes to cache: ask Postgres for the page (one indexed query).
    TooMany,
    /// These of the asked tweets are liked.
    Liked(HashSet<i64>),
}

/// Counters known ahead of hydration: held in this process's near cache or read in the range
/// read's round trip ([`super::pages`]): `counts[i]` is what is known of tweet `ids[i]`
/// (`None`: nothing, hydration asks Redis). Hydration takes a counter from here only for a
/// tweet that is on the page; it asks for the others.
///
/// `liked`: what the viewer's liked set said of all of `ids`, if the range read asked (a
/// viewer of someone else's timeline); it answers the page's likes when every tweet of the
/// page is among `ids`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Prefetched<'a> {
    pub ids: &'a [i64],
    pub counts: &'a [Option<TweetCounts>],
    pub liked: Option<&'a LikedAmong>,
}

impl Prefetched<'_> {
    /// The counters known ahead for tweet `id`, at position `at` of its page; `None` if none
    /// are. The same position first: a page that did not change lists its tweets in the same
    /// order.
    fn get(&self, at: usize, id: i64) -> Option<TweetCounts> {
        let i = if self.ids.get(at) == Some(&id) {
            at
        } else {
            self.ids.iter().position(|x| *x == id)?
        };
        self.counts.get(i).copied().flatten()
    }

    /// What was read ahead of the viewer's likes, if it covers every one of `tweet_ids`.
    fn liked_of(&self, tweet_ids: &[i64]) -> Option<LikedAmong> {
        let liked = self.liked?;
        tweet_ids
            .iter()
            .all(|id| self.ids.contains(id))
            .then(|| liked.clone())
    }
}

/// Decodes the reply of [`pipe_liked`] for `tweet_ids`.
pub(crate) fn decode_liked(
    tweet_ids: &[i64],
    value: redis::Value,
) -> Result<LikedAmong, CacheUnavailable> {
    let flags = redis::from_redis_value::<Vec<bool>>(value).map_err(|_| CacheUnavailable)?;
    Ok(liked_from_flags(tweet_ids, flags))
}

/// Appends the `MGET` of the counters of `tweet_ids` to `pipe`.
pub(crate) fn pipe_counts(pipe: &mut redis::Pipeline, keys: &Keys, tweet_ids: &[i64]) {
    keys.pipe_mget(pipe, Object::TweetCounts, tweet_ids);
}

/// Decodes the reply of [`pipe_counts`]: a malformed counter is a miss (hydration reads
/// Postgres for it), a reply of another shape an error.
pub(crate) fn decode_counts(
    value: redis::Value,
) -> Result<Vec<Option<TweetCounts>>, CacheUnavailable> {
    let values =
        redis::from_redis_value::<Vec<Option<String>>>(value).map_err(|_| CacheUnavailable)?;
    Ok(values
        .into_iter()
        .map(|v| v.as_deref().and_then(TweetCounts::decode))
        .collect())
}

/// Everything one hydration round trip found, in the order asked.
#[derive(Debug, Default)]
pub struct Fetched {
    pub tweets: Vec<Cached<CachedTweet>>,
    pub counts: Vec<Option<TweetCounts>>,
    /// The authors of the tweets found, sorted.
    pub authors: Vec<i64>,
    /// Their user objects, aligned with `authors` (`None`: not cached).
    pub users: Vec<Option<CachedUser>>,
    /// What the viewer's liked set says; `None` without a viewer.
    pub liked: Option<LikedAmong>,
}

impl Cache {
    /// Tweet objects and their counts for `ids`, in order, in one round trip (two `MGET`s in
    /// one pipeline).
    pub async fn get_tweets(
        &self,
        ids: &[i64],
    ) -> Result<(Vec<Cached<CachedTweet>>, Vec<Option<TweetCounts>>), CacheUnavailable> {
        let f = self
            .fetch_for_hydration(ids, false, None, None, Prefetched::default())
            .await?;
        Ok((f.tweets, f.counts))
    }

    /// Caches tweets and counts loaded from Postgres (`SET NX`: a tombstone written meanwhile
    /// wins; counts only if newer) and tombstones for ids Postgres did not have. Best effort.
    pub async fn put_tweets(&self, rows: &[(TweetRecord, TweetCounts)], missing: &[i64]) {
        let (Some(keys), Some(ttl)) = (self.keys(), self.ttl()) else {
            return;
        };
        let mut pipe = redis::pipe();
        for (tweet, counts) in rows {
            pipe_put_tweet(&mut pipe, keys, tweet, ttl);
            self.pipe_put_versioned(
                &mut pipe,
                keys.tweet_counts(tweet.id),
                counts.version,
                counts.encode(),
            );
        }
        for id in missing {
            pipe.cmd("SET")
                .arg(keys.tweet(*id))
                .arg(TOMBSTONE)
                .arg("EX")
                .arg(ttl)
                .ignore();
        }
        let _ = self.run::<()>(&pipe).await;
    }

    /// [`Cache::fill`], and the tweets (with their counts) and authors of the entries in the
    /// same round trip, so that readers who waited for this load hydrate from Redis. The
    /// objects are in the cached form the page itself is written from, encoded once.
    pub async fn fill_hydrated(
        &self,
        list: ListKey,
        generation: &Generation,
        complete: bool,
        entries: &[Scored],
        objects: &[Hydrated],
    ) -> Result<bool, CacheUnavailable> {
        let inner = self.live()?;
        let mut pipe = redis::pipe();
        let mut versioned = Vec::with_capacity(2 * objects.len());
        let mut authors = HashSet::new();
        for o in objects {
            pipe_put_cached_tweet(&mut pipe, &inner.keys, &o.tweet, inner.ttl_secs);
            let counts = (
                inner.keys.tweet_counts(o.tweet.id),
                o.counts.version,
                o.counts.encode(),
            );
            versioned.push(counts);
            if authors.insert(o.author.id) {
                let value = stored_user(o.author_version, &o.author.json);
                versioned.push((inner.keys.user(o.author.id), o.author_version, value));
            }
        }
        self.pipe_put_versioned_many(&mut pipe, versioned);
        self.fill_with(list, generation, complete, entries, pipe)
            .await
    }

    /// User objects for `ids`, in order, in one `MGET`.
    pub async fn get_users(
        &self,
        ids: &[i64],
    ) -> Result<Vec<Option<UserRecord>>, CacheUnavailable> {
        let keys = self.keys().ok_or(CacheUnavailable)?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<String> = ids.iter().map(|id| keys.user(*id)).collect();
        let mut pipe = redis::pipe();
        pipe.cmd("MGET").arg(&names);
        let (values,): (Vec<Option<String>>,) = self.run(&pipe).await?;
        Ok(values.into_iter().map(decode_user).collect())
    }

    /// Caches users loaded from Postgres unless a newer version is cached. Best effort.
    pub async fn put_users(&self, rows: &[UserRecord]) {
        if rows.is_empty() {
            return;
        }
        let mut pipe = redis::pipe();
        for row in rows {
            self.pipe_put_user(&mut pipe, row);
        }
        let _ = self.run::<()>(&pipe).await;
    }

    /// Adds the versioned write of a user object to a pipeline.
    pub(crate) fn pipe_put_user(&self, pipe: &mut redis::Pipeline, user: &UserRecord) {
        let (Some(keys), Some(value)) = (self.keys(), encode_user(user)) else {
            return;
        };
        self.pipe_put_versioned(pipe, keys.user(user.id), user.version, value);
    }

    /// The user a token (by hash) belongs to, if cached.
    pub async fn get_token(&self, hash: &[u8]) -> Result<CachedToken, CacheUnavailable> {
        let keys = self.keys().ok_or(CacheUnavailable)?;
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(keys.token(hash));
        let (value,): (Option<String>,) = self.run(&pipe).await?;
        Ok(match value.as_deref() {
            None => CachedToken::Miss,
            Some(TOMBSTONE) => CachedToken::Revoked,
            Some(id) => id.parse().map_or(CachedToken::Miss, CachedToken::User),
        })
    }

    /// Caches a token loaded from Postgres (`SET NX`: a revocation written meanwhile wins).
    pub async fn put_token(&self, hash: &[u8], user_id: i64) {
        if let Some(ttl) = self.ttl() {
            self.set_token_nx(hash, &user_id.to_string(), ttl).await;
        }
    }

    /// Remembers for `secs` that Postgres does not know the token with SHA-256 `hash` (its
    /// tombstone, `SET NX`: a cached user id is kept), so the next lookup stops here.
    pub async fn put_unknown_token(&self, hash: &[u8], secs: u64) {
        self.set_token_nx(hash, TOMBSTONE, secs.max(1)).await;
    }

    /// `SET {token key} value NX EX secs`, best effort.
    async fn set_token_nx(&self, hash: &[u8], value: &str, secs: u64) {
        let Some(keys) = self.keys() else {
            return;
        };
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(keys.token(hash))
            .arg(value)
            .arg("NX")
            .arg("EX")
            .arg(secs)
            .ignore();
        let _ = self.run::<()>(&pipe).await;
    }

    /// Which of `tweet_ids` `user` liked: from the user's liked set held in this process's near
    /// cache ([`HeldLikes`]), else from the cached set in Redis in one round trip (`SMISMEMBER`,
    /// with a sample of the set to hold it from now on if it is small).
    pub async fn liked_among(
        &self,
        user: i64,
        tweet_ids: &[i64],
    ) -> Result<LikedAmong, CacheUnavailable> {
        let keys = self.keys().ok_or(CacheUnavailable)?;
        let held = self.held_for_range(None, &[], Some(user));
        if let Some(known) = held.likes.as_deref().and_then(|l| l.among(tweet_ids)) {
            return Ok(known);
        }
        let mut pipe = redis::pipe();
        pipe_liked(&mut pipe, keys, user, tweet_ids);
        if held.likes.is_none() && self.may_hold(held.lookup) {
            pipe_liked_sample(&mut pipe, keys, user, HeldLikes::SAMPLE);
            let (flags, sample): (Vec<bool>, Vec<i64>) = self.run(&pipe).await?;
            self.remember_likes(held.lookup, user, &sample, HeldLikes::SAMPLE);
            return Ok(liked_from_flags(tweet_ids, flags));
        }
        let (flags,): (Vec<bool>,) = self.run(&pipe).await?;
        Ok(liked_from_flags(tweet_ids, flags))
    }

    /// Starts loading a user's liked set (see [`Cache::begin_load`]).
    pub async fn begin_load_liked(&self, user: i64) -> Result<Generation, CacheUnavailable> {
        self.begin_load(ListKey::new(keys::Owner::User(user), keys::LIKED))
            .await
    }

    /// Stores a user's liked set loaded from Postgres unless it exists or changed since
    /// `generation` was taken; `None` stores the "too many to cache" marker instead. Best
    /// effort.
    pub async fn fill_liked(&self, user: i64, generation: &Generation, tweet_ids: Option<&[i64]>) {
        let (Some(keys), Some(ttl)) = (self.keys(), self.ttl()) else {
            return;
        };
        let key = keys.liked(user);
        let mut inv = scripts::SET_FILL.key(&key);
        inv.key(Keys::gen_of(&key)).arg(&generation.0).arg(ttl);
        match tweet_ids {
            Some(ids) => {
                for id in ids {
                    inv.arg(*id);
                }
            }
            None => {
                inv.arg(TOO_MANY_MARKER);
            }
        }
        let mut pipe = redis::pipe();
        pipe.invoke_script(&inv).ignore();
        let _ = self
            .run_bulk::<()>(&pipe, tweet_ids.map_or(1, <[i64]>::len))
            .await;
    }

    /// What this process holds in its near cache for a range read: the head of `head` (a held
    /// list's newest entries, [`ListKey::head_held`]), the counters of `tweet_ids`, in order
    /// (`None`: not held, or the near cache may not answer now) and the liked set of `likes_of`,
    /// with the lookup to hand to [`Cache::remember_counts`], [`Cache::remember_head`] and
    /// [`Cache::remember_likes`] for what the read finds in Redis instead. Nothing held if the
    /// cache is off.
    pub fn held_for_range(
        &self,
        head: Option<ListKey>,
        tweet_ids: &[i64],
        likes_of: Option<i64>,
    ) -> Held {
        let near = self.near_objects();
        let asks = head.is_some() || !tweet_ids.is_empty() || likes_of.is_some();
        let Some(near) = near.filter(|_| asks) else {
            return Held {
                lookup: None,
                head: None,
                counts: vec![None; tweet_ids.len()],
                likes: None,
            };
        };
        let lookup = near.begin(self);
        let wanted: Vec<NearId> = (head.map(NearId::Head).into_iter())
            .chain(likes_of.map(NearId::Likes))
            .chain(tweet_ids.iter().map(|id| NearId::Counts(*id)))
            .collect();
        let mut found = near
            .get_many(self, &wanted)
            .unwrap_or_else(|| vec![None; wanted.len()])
            .into_iter();
        let head = match head {
            Some(_) => match found.next() {
                Some(Some(NearObject::Head(h))) => Some(h),
                _ => None,
            },
            None => None,
        };
        let likes = match likes_of {
            Some(_) => match found.next() {
                Some(Some(NearObject::Likes(l))) => Some(l),
                _ => None,
            },
            None => None,
        };
        let counts = found
            .map(|o| match o {
                Some(NearObject::Counts(c)) => Some(c),
                _ => None,
            })
            .collect();
        Held {
            lookup: Some(lookup),
            head,
            counts,
            likes,
        }
    }

    /// Whether a read that began at `lookup` may store what it finds in this process's near
    /// cache (not if it is off or was not subscribed): a sample read only to be held is not
    /// asked for otherwise.
    pub fn may_hold(&self, lookup: Option<Lookup>) -> bool {
        match (self.near_objects(), lookup) {
            (Some(near), Some(lookup)) => near.may_store(&lookup),
            _ => false,
        }
    }

    /// Remembers what a sample of `user`'s liked set (`SRANDMEMBER liked {asked}`) read by a
    /// lookup that began at `lookup` says of the whole set ([`HeldLikes::from_sample`]), unless
    /// the set was evicted since.
    pub fn remember_likes(&self, lookup: Option<Lookup>, user: i64, sample: &[i64], asked: usize) {
        let (Some(near), Some(lookup)) = (self.near_objects(), lookup) else {
            return;
        };
        if let Some(entry) = HeldLikes::entry(user, sample, asked) {
            near.insert(self, lookup, [entry]);
        }
    }

    /// Remembers the head of the held list `list` as a range read that began at `lookup`
    /// ([`Cache::held_for_range`]) found it in Redis, unless it was evicted since.
    pub fn remember_head(&self, lookup: Option<Lookup>, list: ListKey, head: super::lists::Head) {
        if let (Some(near), Some(lookup)) = (self.near_objects(), lookup) {
            let value = NearObject::Head(std::sync::Arc::new(head));
            near.insert(self, lookup, [(NearId::Head(list), value)]);
        }
    }

    /// Remembers the counters `read` from Redis for `tweet_ids` (aligned) by a read that began
    /// at `lookup` ([`Cache::held_for_range`]), unless they were evicted since.
    pub fn remember_counts(
        &self,
        lookup: Option<Lookup>,
        tweet_ids: &[i64],
        read: &[Option<TweetCounts>],
    ) {
        let (Some(near), Some(lookup)) = (self.near_objects(), lookup) else {
            return;
        };
        let found: Vec<(NearId, NearObject)> = (tweet_ids.iter().zip(read))
            .filter_map(|(id, c)| Some((NearId::Counts(*id), NearObject::Counts((*c)?))))
            .collect();
        if !found.is_empty() {
            near.insert(self, lookup, found);
        }
    }

    /// Tweet objects, their counts, their authors (if `with_authors`) and the viewer's likes
    /// of them, in one pipeline. Tweets, counters and authors this process holds in its near
    /// cache ([`super::near`]) are taken from there and not asked for: a warm page then asks
    /// Redis for the likes alone, if for anything.
    ///
    /// A list entry does not name its tweet's author
    /// (docs/decisions/0014-split-time-entries-without-author.md): the authors asked for in the
    /// pipeline are those of the near-cached tweets. The authors of tweets read from Redis that
    /// the near cache does not hold take a second `MGET`; those of tweets Redis does not hold
    /// either are left to the caller, who loads the tweets from Postgres.
    ///
    /// `viewer_likes` is a sample of the viewer's liked set when the caller read one already
    /// (a newsfeed's range read does: [`crate::cache::Window::owner_likes`]); if it is the
    /// whole set, the page's likes come from it ([`liked_from_sample`]) without the
    /// `SMISMEMBER` of the page's tweets. So do they if this process holds the set
    /// ([`HeldLikes`]); if it does not, the `SMISMEMBER` comes with a sample that may let it
    /// hold the set from now on.
    ///
    /// `prefetched`: counters the range read took along ([`super::pages`]); only the others
    /// are asked for, and a page that needs nothing else makes no round trip at all.
    pub async fn fetch_for_hydration(
        &self,
        tweet_ids: &[i64],
        with_authors: bool,
        viewer: Option<i64>,
        viewer_likes: Option<&[i64]>,
        prefetched: Prefetched<'_>,
    ) -> Result<Fetched, CacheUnavailable> {
        let keys = self.keys().ok_or(CacheUnavailable)?;
        let near = self.near_objects().ok_or(CacheUnavailable)?;
        if tweet_ids.is_empty() {
            return Ok(Fetched::default());
        }
        let lookup = near.begin(self);
        // `None`: not known yet; `Some(None)`: not cached (hydration reads Postgres).
        let mut counts: Vec<Option<Option<TweetCounts>>> = (tweet_ids.iter().enumerate())
            .map(|(at, id)| prefetched.get(at, *id).map(Some))
            .collect();
        // The viewer's likes, if a sample or the range read answered them.
        let mut known = viewer_likes
            .and_then(|sample| liked_from_sample(tweet_ids, sample))
            .or_else(|| prefetched.liked_of(tweet_ids));
        let likes_of = viewer.filter(|_| known.is_none());
        // The tweets, the counters not prefetched, the viewer's liked set and, in the same
        // lookup, the tweets' authors.
        let wanted: Vec<NearId> = (tweet_ids.iter().map(|id| NearId::Tweet(*id)))
            .chain(
                (tweet_ids.iter().zip(&counts))
                    .filter(|(_, c)| c.is_none())
                    .map(|(id, _)| NearId::Counts(*id)),
            )
            .chain(likes_of.map(NearId::Likes))
            .collect();
        let author_of = |o: &NearObject| match o {
            NearObject::Tweet(t) if with_authors => Some(NearId::User(t.user_id)),
            _ => None,
        };
        let (mut held, held_authors) = near
            .get_many_then(self, &wanted, author_of)
            .unwrap_or_else(|| (vec![None; wanted.len()], Vec::new()));
        let held_likes = match likes_of.and_then(|_| held.pop()) {
            Some(Some(NearObject::Likes(l))) => Some(l),
            _ => None,
        };
        if let Some(l) = &held_likes {
            known = l.among(tweet_ids);
        }
        let held_counts = held.split_off(tweet_ids.len());
        let mut held_counts = held_counts.into_iter();
        for c in counts.iter_mut().filter(|c| c.is_none()) {
            if let Some(Some(NearObject::Counts(held))) = held_counts.next() {
                *c = Some(Some(held));
            }
        }
        let mut tweets: Vec<Cached<CachedTweet>> = held
            .into_iter()
            .map(|o| match o {
                Some(NearObject::Tweet(t)) => Cached::Hit(t),
                _ => Cached::Miss,
            })
            .collect();
        let mut authors = Authors::default();
        for (key, user) in held_authors {
            if let NearId::User(id) = key {
                authors.insert(id, user);
            }
        }
        let ask_tweets: Vec<i64> = (tweet_ids.iter().zip(&tweets))
            .filter(|(_, t)| matches!(t, Cached::Miss))
            .map(|(id, _)| *id)
            .collect();
        let ask_users = authors.missing();

        let ask_counts: Vec<i64> = (tweet_ids.iter().zip(&counts))
            .filter(|(_, c)| c.is_none())
            .map(|(id, _)| *id)
            .collect();

        let mut pipe = redis::pipe();
        if !ask_tweets.is_empty() {
            keys.pipe_mget(&mut pipe, Object::Tweet, &ask_tweets);
        }
        if !ask_counts.is_empty() {
            pipe_counts(&mut pipe, keys, &ask_counts);
        }
        if !ask_users.is_empty() {
            keys.pipe_mget(&mut pipe, Object::User, &ask_users);
        }
        let ask_liked = matches!((viewer, &known), (Some(_), None));
        // A liked set not held: a sample too, to hold it from now on if it is small.
        let sample_likes = likes_of.filter(|_| held_likes.is_none() && near.may_store(&lookup));
        if let (Some(v), true) = (viewer, ask_liked) {
            pipe_liked(&mut pipe, keys, v, tweet_ids);
        }
        if let Some(v) = sample_likes {
            pipe_liked_sample(&mut pipe, keys, v, HeldLikes::SAMPLE);
        }
        let asks = !ask_tweets.is_empty() || !ask_counts.is_empty() || !ask_users.is_empty();
        let mut values: Vec<redis::Value> = if asks || ask_liked {
            self.run::<Vec<redis::Value>>(&pipe).await?
        } else {
            if let Some(stats) = self.stats() {
                stats.prefetched.fetch_add(1, Ordering::Relaxed);
            }
            Vec::new()
        };
        values.reverse();
        let mut next = |what: &str| -> Result<redis::Value, CacheUnavailable> {
            values.pop().ok_or_else(|| {
                tracing::warn!(what, "short pipeline reply");
                CacheUnavailable
            })
        };
        let mut found = Vec::new();
        let mut read_authors = Vec::new();
        if !ask_tweets.is_empty() {
            let mut asked = strings(next("tweets")?)?.into_iter().map(decode_tweet);
            for t in tweets.iter_mut().filter(|t| matches!(t, Cached::Miss)) {
                *t = asked.next().unwrap_or(Cached::Miss);
                if let Cached::Hit(tweet) = t {
                    found.push((NearId::Tweet(tweet.id), NearObject::Tweet(tweet.clone())));
                    read_authors.push(tweet.user_id);
                }
            }
        }
        if !ask_counts.is_empty() {
            let mut asked = decode_counts(next("counts")?)?.into_iter();
            for (id, c) in tweet_ids.iter().zip(counts.iter_mut()) {
                if c.is_none() {
                    let read = asked.next().flatten();
                    if let Some(read) = read {
                        found.push((NearId::Counts(*id), NearObject::Counts(read)));
                    }
                    *c = Some(read);
                }
            }
        }
        let counts = counts.into_iter().map(Option::flatten).collect();
        if !ask_users.is_empty() {
            authors.decode(&ask_users, strings(next("users")?)?, &mut found);
        }
        let liked = match (viewer, known) {
            (None, _) => None,
            (Some(_), Some(known)) => Some(known),
            (Some(_), None) => Some(decode_liked(tweet_ids, next("liked")?)?),
        };
        if let Some(v) = sample_likes {
            let sample = decode_sample(next("likes")?)?;
            found.extend(HeldLikes::entry(v, &sample, HeldLikes::SAMPLE));
        }
        if with_authors && !read_authors.is_empty() {
            // The authors of the tweets just read: from the near cache, else one more MGET.
            authors.add(self, near, read_authors);
            let ask_users = authors.missing();
            if !ask_users.is_empty() {
                let mut pipe = redis::pipe();
                keys.pipe_mget(&mut pipe, Object::User, &ask_users);
                let (values,): (Vec<Option<String>>,) = self.run(&pipe).await?;
                authors.decode(&ask_users, values, &mut found);
            }
        }
        if !found.is_empty() {
            near.insert(self, lookup, found);
        }
        Ok(Fetched {
            tweets,
            counts,
            authors: authors.ids,
            users: authors.users,
            liked,
        })
    }
}

fn strings(v: redis::Value) -> Result<Vec<Option<String>>, CacheUnavailable> {
    redis::from_redis_value::<Vec<Option<String>>>(v).map_err(|_| CacheUnavailable)
}

/// The authors of a page's tweets as hydration finds them: sorted ids, each with its user
/// object once found (`None`: not yet, or not cached).
#[derive(Default)]
struct Authors {
    ids: Vec<i64>,
    users: Vec<Option<CachedUser>>,
    /// Ids already asked of Redis (a miss there is not asked again).
    asked: Vec<i64>,
}

impl Authors {
    /// Adds the authors `ids` (of tweets read from Redis), taking those the near cache holds
    /// from it.
    fn add(
        &mut self,
        cache: &Cache,
        near: &super::near::Near<NearId, NearObject>,
        mut new: Vec<i64>,
    ) {
        new.retain(|id| self.ids.binary_search(id).is_err());
        new.sort_unstable();
        new.dedup();
        if new.is_empty() {
            return;
        }
        let wanted: Vec<NearId> = new.iter().map(|id| NearId::User(*id)).collect();
        let held = near
            .get_many(cache, &wanted)
            .unwrap_or_else(|| vec![None; wanted.len()]);
        for (id, held) in new.into_iter().zip(held) {
            self.insert(id, held);
        }
    }

    /// Adds author `id` (unless known) with what the near cache holds of them.
    fn insert(&mut self, id: i64, held: Option<NearObject>) {
        let user = match held {
            Some(NearObject::User(u)) => Some(u),
            _ => None,
        };
        if let Err(at) = self.ids.binary_search(&id) {
            self.ids.insert(at, id);
            self.users.insert(at, user);
        }
    }

    /// Authors not found yet and not asked of Redis yet (marks them asked).
    fn missing(&mut self) -> Vec<i64> {
        let ask: Vec<i64> = (self.ids.iter().zip(&self.users))
            .filter(|(id, u)| u.is_none() && !self.asked.contains(id))
            .map(|(id, _)| *id)
            .collect();
        self.asked.extend(&ask);
        ask
    }

    /// Takes the reply of an `MGET` of the users `asked`.
    fn decode(
        &mut self,
        asked: &[i64],
        values: Vec<Option<String>>,
        found: &mut Vec<(NearId, NearObject)>,
    ) {
        for (id, value) in asked.iter().zip(values) {
            let Some(user) = value.and_then(|v| CachedUser::decode(*id, &v)) else {
                continue;
            };
            if let Ok(at) = self.ids.binary_search(id) {
                found.push((NearId::User(user.id), NearObject::User(user.clone())));
                self.users[at] = Some(user);
            }
        }
    }
}

/// `SET tweet json NX EX ttl`: caches a tweet object unless the key exists (a tombstone wins).
pub(crate) fn pipe_put_tweet(
    pipe: &mut redis::Pipeline,
    keys: &Keys,
    tweet: &TweetRecord,
    ttl: u64,
) {
    pipe_put_cached_tweet(pipe, keys, &CachedTweet::of(tweet), ttl);
}

/// [`pipe_put_tweet`] of a tweet already in its cached form.
fn pipe_put_cached_tweet(pipe: &mut redis::Pipeline, keys: &Keys, tweet: &CachedTweet, ttl: u64) {
    pipe.cmd("SET")
        .arg(keys.tweet(tweet.id))
        .arg(tweet.encode())
        .arg("NX")
        .arg("EX")
        .arg(ttl)
        .ignore();
}

/// `SMISMEMBER liked -1 -2 ids...` (decode its reply with [`decode_liked`]).
pub(crate) fn pipe_liked(pipe: &mut redis::Pipeline, keys: &Keys, user: i64, tweet_ids: &[i64]) {
    pipe.cmd("SMISMEMBER")
        .arg(keys.liked(user))
        .arg(LIKED_MARKER)
        .arg(TOO_MANY_MARKER)
        .arg(tweet_ids);
}

/// `SRANDMEMBER liked {count}`: up to `count` members of `user`'s liked set, all of them when
/// it holds fewer (decode its reply with [`decode_sample`]; what it says of a page:
/// [`liked_from_sample`]; of the whole set: [`HeldLikes::from_sample`]).
pub(crate) fn pipe_liked_sample(pipe: &mut redis::Pipeline, keys: &Keys, user: i64, count: usize) {
    pipe.cmd("SRANDMEMBER").arg(keys.liked(user)).arg(count);
}

/// Decodes the reply of [`pipe_liked_sample`].
pub(crate) fn decode_sample(value: redis::Value) -> Result<Vec<i64>, CacheUnavailable> {
    redis::from_redis_value(value).map_err(|_| CacheUnavailable)
}

/// Members of a liked set that a newsfeed read samples with its range (`SRANDMEMBER liked 8`,
/// [`crate::cache::Window::owner_likes`]): a set with fewer comes whole, and a reader who liked
/// fewer than 7 tweets needs no `SMISMEMBER` (22 replies fewer per page); one with more parses
/// these 8 in vain.
pub const LIKED_SAMPLE: usize = 8;

/// What a sample of a user's liked set (`SRANDMEMBER liked` [`LIKED_SAMPLE`]) tells of
/// `tweet_ids`: `None` if it may be only part of the set (ask with `SMISMEMBER`). An empty
/// sample is a set that is not cached; the markers say the rest (see [`LIKED_MARKER`]).
pub fn liked_from_sample(tweet_ids: &[i64], sample: &[i64]) -> Option<LikedAmong> {
    if sample.is_empty() {
        return Some(LikedAmong::Miss);
    }
    if sample.len() >= LIKED_SAMPLE || !sample.contains(&LIKED_MARKER) {
        return None;
    }
    if sample.contains(&TOO_MANY_MARKER) {
        return Some(LikedAmong::TooMany);
    }
    Some(LikedAmong::Liked(
        tweet_ids
            .iter()
            .copied()
            .filter(|id| sample.contains(id))
            .collect(),
    ))
}

/// Decodes `SMISMEMBER liked -1 -2 ids...`.
fn liked_from_flags(tweet_ids: &[i64], flags: Vec<bool>) -> LikedAmong {
    let mut flags = flags.into_iter();
    let (cached, too_many) = (flags.next() == Some(true), flags.next() == Some(true));
    match (cached, too_many) {
        (false, _) => LikedAmong::Miss,
        (true, true) => LikedAmong::TooMany,
        (true, false) => LikedAmong::Liked(
            tweet_ids
                .iter()
                .zip(flags)
                .filter(|(_, f)| *f)
                .map(|(id, _)| *id)
                .collect(),
        ),
    }
}

/// A stored tweet object value as the read path takes it (for the consistency checker).
pub fn decode_stored_tweet(value: &str) -> Cached<CachedTweet> {
    decode_tweet(Some(value.to_owned()))
}

/// A stored user object value (`"{version}|{user JSON}"`), `None` if unreadable (for the
/// consistency checker).
pub fn decode_stored_user(value: &str) -> Option<UserRecord> {
    decode_user(Some(value.to_owned()))
}

fn decode_tweet(v: Option<String>) -> Cached<CachedTweet> {
    match v {
        None => Cached::Miss,
        Some(t) if t == TOMBSTONE => Cached::Deleted,
        Some(value) => CachedTweet::decode(value).map_or(Cached::Miss, Cached::Hit),
    }
}

/// `"{version}|{user JSON}"`.
pub(crate) fn encode_user(user: &UserRecord) -> Option<String> {
    let json = serde_json::to_string(user).ok()?;
    Some(stored_user(user.version, &json))
}

/// The stored value of a user object: `"{version}|{json}"`.
fn stored_user(version: i64, json: &str) -> String {
    format!("{version}|{json}")
}

fn decode_user(v: Option<String>) -> Option<UserRecord> {
    let (_, json) = v.as_deref()?.split_once('|')?;
    serde_json::from_str(json).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Place;

    #[test]
    fn a_whole_liked_set_sample_answers_the_page_and_a_partial_one_does_not() {
        let page = [10, 11, 12];
        let liked = |s: &[i64]| match liked_from_sample(&page, s) {
            Some(LikedAmong::Liked(ids)) => {
                let mut ids: Vec<i64> = ids.into_iter().collect();
                ids.sort_unstable();
                Some(ids)
            }
            _ => None,
        };
        assert!(matches!(
            liked_from_sample(&page, &[]),
            Some(LikedAmong::Miss)
        ));
        assert_eq!(liked(&[LIKED_MARKER]), Some(vec![]), "liked nothing");
        assert_eq!(liked(&[11, LIKED_MARKER, 99]), Some(vec![11]));
        assert!(matches!(
            liked_from_sample(&page, &[TOO_MANY_MARKER, LIKED_MARKER]),
            Some(LikedAmong::TooMany)
        ));
        // Eight members may be part of a bigger set; a set without its marker is not trusted.
        let eight: Vec<i64> = (0..7).chain([LIKED_MARKER]).collect();
        assert_eq!(eight.len(), LIKED_SAMPLE);
        assert!(liked_from_sample(&page, &eight).is_none());
        assert!(liked_from_sample(&page, &[10]).is_none());
    }

    #[test]
    fn prefetched_counters_and_likes_answer_only_for_the_tweets_they_were_read_for() {
        let c = |likes| TweetCounts {
            likes,
            comments: 0,
            version: 1,
        };
        let liked = LikedAmong::Liked([20].into_iter().collect());
        let ahead = Prefetched {
            ids: &[30, 20, 10],
            counts: &[Some(c(3)), None, Some(c(1))],
            liked: Some(&liked),
        };
        // The same page, in the same order.
        assert_eq!(ahead.get(0, 30), Some(c(3)));
        assert_eq!(ahead.get(1, 20), None, "not known: asked again");
        // A new tweet on top moves the others down; it was not read ahead.
        assert_eq!(ahead.get(0, 40), None);
        assert_eq!(ahead.get(1, 30), Some(c(3)));
        assert_eq!(ahead.get(3, 10), Some(c(1)));
        // A short reply answers nothing for the ids it did not cover.
        let short = Prefetched {
            counts: &[Some(c(3))],
            ..ahead
        };
        assert_eq!(short.get(2, 10), None);
        // Likes answer a page only if every one of its tweets was asked about.
        assert_eq!(ahead.liked_of(&[30, 20]), Some(liked.clone()));
        assert_eq!(ahead.liked_of(&[40, 30, 20]), None);
        assert_eq!(Prefetched::default().liked_of(&[30]), None);
    }

    #[test]
    fn a_liked_set_is_held_whole_only_from_a_sample_that_asked_for_more_than_it_holds() {
        let (m, many) = (LIKED_MARKER, TOO_MANY_MARKER);
        let all = |ids: &[i64]| Some(HeldLikes::All(ids.into()));
        // Not cached: nothing to hold.
        assert_eq!(HeldLikes::from_sample(&[], HeldLikes::SAMPLE), None);
        assert_eq!(HeldLikes::from_sample(&[5, 3], HeldLikes::SAMPLE), None);
        // Whole: fewer members than asked, sorted, without the marker.
        assert_eq!(
            HeldLikes::from_sample(&[9, m, 3], HeldLikes::SAMPLE),
            all(&[3, 9])
        );
        assert_eq!(HeldLikes::from_sample(&[m], LIKED_SAMPLE), all(&[]));
        assert_eq!(
            HeldLikes::from_sample(&[m, many], LIKED_SAMPLE),
            Some(HeldLikes::TooMany)
        );
        // As many as asked: a part of a larger set, with or without its marker.
        let full: Vec<i64> = std::iter::once(m)
            .chain(1..HeldLikes::SAMPLE as i64)
            .collect();
        assert_eq!(full.len(), HeldLikes::SAMPLE);
        assert_eq!(
            HeldLikes::from_sample(&full, HeldLikes::SAMPLE),
            Some(HeldLikes::Many)
        );
        let unmarked: Vec<i64> = (1..=HeldLikes::SAMPLE as i64).collect();
        assert_eq!(
            HeldLikes::from_sample(&unmarked, HeldLikes::SAMPLE),
            Some(HeldLikes::Many)
        );
        let eight: Vec<i64> = std::iter::once(m).chain(1..LIKED_SAMPLE as i64).collect();
        assert_eq!(
            HeldLikes::from_sample(&eight, LIKED_SAMPLE),
            None,
            "maybe small"
        );
        let whole: Vec<i64> = std::iter::once(m).chain(1..=NEAR_LIKES as i64).collect();
        assert_eq!(
            HeldLikes::from_sample(&whole, HeldLikes::SAMPLE),
            Some(HeldLikes::All((1..=NEAR_LIKES as i64).collect())),
        );
        // What they say of a page.
        let liked = |held: &HeldLikes| match held.among(&[1, 3, 9, 12]) {
            Some(LikedAmong::Liked(ids)) => {
                let mut ids: Vec<i64> = ids.into_iter().collect();
                ids.sort_unstable();
                Some(ids)
            }
            _ => None,
        };
        assert_eq!(liked(&HeldLikes::All([3, 9, 10].into())), Some(vec![3, 9]));
        assert_eq!(HeldLikes::Many.among(&[1]), None);
        assert_eq!(HeldLikes::TooMany.among(&[1]), Some(LikedAmong::TooMany));
    }

    #[test]
    fn near_ids_travel_as_messages_and_come_from_their_keys() {
        for id in [
            NearId::Tweet(17),
            NearId::User(42),
            NearId::Counts(17),
            NearId::Tweet(i64::MAX),
            NearId::Head(ListKey::timeline(keys::Owner::User(42), "posts")),
            NearId::Head(ListKey::timeline(keys::Owner::Circle(3), "items")),
            NearId::Head(ListKey::timeline(keys::Owner::List(7), "items")),
            NearId::Likes(42),
        ] {
            assert_eq!(NearId::from_message(&id.to_message()), Some(id));
        }
        for bad in [
            "", "t", "x17", "t-", "u4 2", "h", "hx7", "hch5", "hu", "l", "lx",
        ] {
            assert_eq!(NearId::from_message(bad), None, "{bad:?}");
        }
        let keys = Keys::new("p").unwrap();
        assert_eq!(NearId::of_key(&keys.tweet(17)), Some(NearId::Tweet(17)));
        assert_eq!(NearId::of_key(&keys.user(42)), Some(NearId::User(42)));
        assert_eq!(
            NearId::of_key(&keys.tweet_counts(17)),
            Some(NearId::Counts(17))
        );
        assert_eq!(NearId::of_key(&keys.user_counts(42)), None);
        assert_eq!(NearId::of_key(&keys.liked(42)), Some(NearId::Likes(42)));
        assert_eq!(
            NearId::of_key(&keys.list(ListKey::new(keys::Owner::User(42), "home"))),
            None
        );
        // Heads are held of a user's own tweets, a circle's and a list's timeline, never of a
        // newsfeed (changed by every fan-out batch).
        let posts = ListKey::timeline(keys::Owner::User(42), "posts");
        let circle = ListKey::timeline(keys::Owner::Circle(3), "items");
        let list = ListKey::timeline(keys::Owner::List(7), "items");
        for held in [posts, circle, list] {
            assert!(held.head_held());
            assert_eq!(NearId::of_key(&keys.list(held)), Some(NearId::Head(held)));
        }
        for other in [
            ListKey::timeline(keys::Owner::User(42), "feed"),
            ListKey::timeline(keys::Owner::List(7), "feed"),
        ] {
            assert!(!other.head_held(), "{other}");
            assert_eq!(NearId::of_key(&keys.list(other)), None, "{other}");
        }
        assert!(!ListKey::new(keys::Owner::User(42), "posts").head_held());
        // A write's repairs evict the heads of the held lists they invalidate.
        let repairs = [
            crate::cache::Repair::Invalidate {
                key: keys.list(posts),
            },
            crate::cache::Repair::InvalidateMany {
                prefix: "p".to_owned(),
                tag: "c".to_owned(),
                name: "items".to_owned(),
                ids: vec![3, 4],
            },
            crate::cache::Repair::InvalidateMany {
                prefix: "p".to_owned(),
                tag: "u".to_owned(),
                name: "feed".to_owned(),
                ids: vec![42],
            },
            // Lists' timelines invalidated together (as `Repair::invalidate_lists` groups
            // them; a list fan-out batch stages an `Invalidate` of each, mapped as above).
            crate::cache::Repair::InvalidateMany {
                prefix: "p".to_owned(),
                tag: "l".to_owned(),
                name: "items".to_owned(),
                ids: vec![7],
            },
        ];
        let circle4 = ListKey::timeline(keys::Owner::Circle(4), "items");
        assert_eq!(
            crate::cache::update::near_evictions(&repairs),
            [posts, circle, circle4, list].map(NearId::Head)
        );
    }

    #[test]
    fn a_cached_tweet_round_trips_and_reads_the_older_format() {
        let tweet = TweetRecord {
            id: 17,
            user_id: 42,
            content: "say \"hi\" | ok, 1,2".to_owned(),
            created_at: crate::time::from_micros(1_763_900_000_123_456),
            circle_id: Some(3),
            photo_urls: vec!["/media/a.png".to_owned()],
            coordinates: Some(vec![-73.9, 40.7]),
            place: Some(sqlx::types::Json(Place {
                full_name: "New York, NY".to_owned(),
                bbox: [-74.3, 40.5, -73.7, 40.9],
            })),
        };
        let cached = CachedTweet::of(&tweet);
        assert!(
            cached
                .members
                .starts_with(r#""id":17,"created_at":"2025-11-23T12:13:20.123456Z","content""#),
            "{}",
            cached.members
        );
        assert_eq!(cached.record(), Some(tweet.clone()));
        let stored = cached.encode();
        assert!(
            stored.starts_with("3|42|1763900000123456|\"id\":17,"),
            "{stored}"
        );
        assert_eq!(CachedTweet::decode(stored.clone()), Some(cached.clone()));
        let v2 = format!("2|42|{}", cached.members);
        assert_eq!(CachedTweet::decode(v2), Some(cached.clone()));
        let older = serde_json::to_string(&tweet).unwrap();
        assert_eq!(CachedTweet::decode(older), Some(cached));
        assert_eq!(CachedTweet::decode("3|1|x".to_owned()), None);
        assert_eq!(CachedTweet::decode("3|1|x|\"id\":1,".to_owned()), None);
        assert_eq!(
            CachedTweet::decode("2|1|\"id\":1,\"content\":\"\"".to_owned()),
            None
        );
        assert!(matches!(decode_tweet(Some("-".into())), Cached::Deleted));
    }

    #[test]
    fn a_cached_users_public_json_is_cut_from_the_stored_object() {
        for nickname in [None, Some(r#"a ,"version":1 \ "x" | ü"#.to_owned())] {
            let user = UserRecord {
                id: 42,
                username: "alice".to_owned(),
                nickname: nickname.clone(),
                avatar_url: Some("/media/a.png".to_owned()),
                version: 7,
                created_at: crate::time::from_micros(1_763_900_000_123_456),
            };
            let stored = encode_user(&user).unwrap();
            let cached = CachedUser::decode(42, &stored).unwrap();
            let public = serde_json::to_string(&crate::users::User::from(user.clone())).unwrap();
            assert_eq!(
                cached.public_head().map(|head| format!("{head}}}")),
                Some(public),
                "{nickname:?}"
            );
            assert_eq!(cached.record(), Some(user));
        }
        assert_eq!(CachedUser::decode(42, "7|"), None, "a floor is a miss");
        let odd = CachedUser::decode(42, r#"7|{"username":"x","id":42,"version":7}"#).unwrap();
        assert_eq!(
            odd.public_head(),
            None,
            "another member order is parsed instead"
        );
    }
}
