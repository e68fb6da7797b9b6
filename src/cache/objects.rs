//! Per-object caches used for hydration: tweet objects (versioned by their edits; a tombstone
//! once deleted) with their counts, user objects (versioned, so a slow reader can not put back an
//! old profile) and bearer tokens (tombstoned on logout). Liked sets are [`super::liked`],
//! what each process holds [`super::held`], a page's one-round-trip read
//! [`super::hydration`].

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use super::held::{NearId, NearObject};
use super::hydration::{Authors, Prefetched};
use super::liked::LikedFill;
use super::near::Lookup;
use crate::cache::Scored;
use crate::cache::counts::Versioned;
use crate::cache::{Cache, CacheUnavailable, Generation, Keys, ListKey};
use crate::model::{TweetCounts, TweetRecord, UserRecord};

/// The value a deleted tweet's object key (or a revoked token's key) holds, so no reader can
/// cache it again.
pub const TOMBSTONE: &str = "-";

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

/// A tweet object as cached: its author, version and public fields as ready JSON object
/// members in the order of the public `Tweet`:
/// `"id":17,"created_at":"…","content":"…","circle_id":null,"photo_urls":[],"coordinates":null,"place":null,"edited_at":null,"hashtags":[],"in_reply_to_tweet_id":null,"in_reply_to_user_id":null`, and a retweet's `,"retweeted_tweet_id":5` last.
/// Timeline pages splice the members into the response as they are
/// ([`crate::tweets::TweetJson`]): no parsing, escaping or timestamp formatting per tweet.
/// Stored as `"{version}|{user_id}|{created_at µs}|{mentioned ids}|{members}"` (the ids of the
/// users it mentions comma-separated, often none: [`CachedTweet::mentions`]), `version` being
/// the tweet's `edit_version`: every write of it is a `SET_IF_NEWER`
/// ([`super::scripts::SET_IF_NEWER`]),
/// so a reader that loaded the text before an edit can not put it back over the edited one,
/// and the tombstone of a deleted tweet is final. (The timestamp, so a timeline page takes each
/// item's time from its tweet instead of asking Redis for its list entry's score.)
#[derive(Debug, Clone, PartialEq)]
pub struct CachedTweet {
    pub id: i64,
    pub user_id: i64,
    pub created_at: crate::time::Timestamp,
    /// The tweet's `edit_version` (0: never edited).
    pub version: i64,
    /// Shared: a near-cached tweet is cloned into every page that lists it.
    pub members: std::sync::Arc<str>,
    /// The tweet it retweets (its members' last, `"retweeted_tweet_id"`), found once when
    /// encoded or decoded, so a page learns which items are retweets without parsing.
    pub retweeted_tweet_id: Option<i64>,
    /// The users its text mentions, in order ([`crate::mentions`]): not among the members,
    /// whose public `mentions` are user objects hydrated at read time like the author.
    /// Shared, as the members.
    pub mentions: std::sync::Arc<[i64]>,
}

/// What leads the last member of a retweet's members. Inside a JSON string every `"` is
/// escaped, so the unescaped `,"` can only start a member.
const RETWEETED_MEMBER: &str = ",\"retweeted_tweet_id\":";

/// The retweeted tweet's id of cached `members` ([`CachedTweet::retweeted_tweet_id`]).
fn retweeted_in(members: &str) -> Option<i64> {
    let (_, id) = members.rsplit_once(RETWEETED_MEMBER)?;
    id.parse().ok()
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
    #[serde(serialize_with = "crate::time::serialize_option")]
    edited_at: Option<crate::time::Timestamp>,
    /// Derived from `content` ([`crate::hashtags::parse`]).
    hashtags: Vec<String>,
    in_reply_to_tweet_id: Option<i64>,
    in_reply_to_user_id: Option<i64>,
    /// Only on a retweet ([`crate::retweets`]), and last (see [`retweeted_in`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    retweeted_tweet_id: Option<i64>,
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
            edited_at: tweet.edited_at,
            hashtags: crate::hashtags::parse(&tweet.content),
            in_reply_to_tweet_id: tweet.in_reply_to_tweet_id,
            in_reply_to_user_id: tweet.in_reply_to_user_id,
            retweeted_tweet_id: tweet.retweeted_tweet_id,
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
            version: tweet.edit_version,
            members,
            retweeted_tweet_id: tweet.retweeted_tweet_id,
            mentions: tweet.mentioned_user_ids.as_slice().into(),
        }
    }

    /// The typed tweet (parses the members); `None` if they do not parse.
    pub fn record(&self) -> Option<TweetRecord> {
        let json = format!(
            "{{\"user_id\":{},\"edit_version\":{},{}}}",
            self.user_id, self.version, self.members
        );
        let mut record: TweetRecord = serde_json::from_str(&json).ok()?;
        record.mentioned_user_ids = self.mentions.to_vec();
        Some(record)
    }

    /// The stored value.
    pub(crate) fn encode(&self) -> String {
        let mentions: Vec<String> = self.mentions.iter().map(i64::to_string).collect();
        format!(
            "{}|{}|{}|{}|{}",
            self.version,
            self.user_id,
            crate::time::to_micros(self.created_at),
            mentions.join(","),
            self.members
        )
    }

    /// A stored value (the members are copied once, into the shared buffer); `None` for a
    /// floor (`"{version}|"`, see [`super::update::Repair::SetIfNewer`]) or garbage.
    fn decode(value: &str) -> Option<Self> {
        let (version, rest) = value.split_once('|')?;
        let (user, rest) = rest.split_once('|')?;
        let (micros, rest) = rest.split_once('|')?;
        let (mentioned, members) = rest.split_once('|')?;
        let mentions: std::sync::Arc<[i64]> = match mentioned {
            "" => std::sync::Arc::new([]),
            ids => ids
                .split(',')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?,
        };
        // `"id":` leads the members.
        let id = members
            .strip_prefix("\"id\":")?
            .split(',')
            .next()?
            .parse()
            .ok()?;
        Some(CachedTweet {
            id,
            user_id: user.parse().ok()?,
            created_at: crate::time::from_micros(micros.parse().ok()?),
            version: version.parse().ok()?,
            retweeted_tweet_id: retweeted_in(members),
            mentions,
            members: members.into(),
        })
    }
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

/// The objects of a cold page's rows as Postgres gave them, and the lookup of this process's
/// near cache begun before that read ([`Cache::begin_object_load`]; `None`: the cache is off):
/// what [`Cache::fill_hydrated`] stores.
#[derive(Debug, Clone, Copy)]
pub struct LoadedObjects<'a> {
    pub objects: &'a [Hydrated],
    pub lookup: Option<Lookup>,
}

/// Whether `held`, what this process holds of one of `o`'s objects, is `o`'s version of it or a
/// newer one. This process holds an object only once it read it from Redis or gave it to Redis
/// ([`Cache::fill_hydrated`]), and Redis replaces a version only with a newer one
/// ([`super::scripts::SET_IF_NEWER`]): Redis then holds that version or a newer one, unless it
/// lost the key since, which costs a later miss and nothing else (every read is correct with
/// any key missing).
fn at_least(held: &NearObject, o: &Hydrated) -> bool {
    match held {
        NearObject::Tweet(t) => t.id == o.tweet.id && t.version >= o.tweet.version,
        NearObject::Counts(c) => c.version >= o.counts.version,
        NearObject::User(u) => {
            u.id == o.author.id && u.version().is_some_and(|v| v >= o.author_version)
        }
        _ => false,
    }
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

    /// The user's version (the stored object's `version` member); `None` if the JSON is not in
    /// the stored shape.
    pub fn version(&self) -> Option<i64> {
        let rest = self.json.get(self.public_end? + VERSION_MEMBER.len()..)?;
        let end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        rest[..end].parse().ok()
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
    pub(super) fn decode(id: i64, value: &str) -> Option<Self> {
        let (_, json) = value.split_once('|')?;
        json.starts_with('{').then(|| CachedUser {
            id,
            public_end: public_end(json),
            json: json.into(),
        })
    }
}

/// What leads a stored user object's `version` member ([`public_end`], [`CachedUser::version`]).
const VERSION_MEMBER: &str = ",\"version\":";

/// The offset of the last `,"version":` in a stored user object that begins with `{"id":`.
/// A `,"version":` inside a string value would have its quotes escaped, so the last one (near
/// the end, where `version` and `created_at` are) is the member. A backward scan over commas:
/// `str::rfind` set up a two-way searcher per call, 4 % of a warm newsfeed page (callgrind).
fn public_end(json: &str) -> Option<usize> {
    if !json.starts_with("{\"id\":") {
        return None;
    }
    let bytes = json.as_bytes();
    let mut end = bytes.len();
    while let Some(comma) = bytes[..end].iter().rposition(|&b| b == b',') {
        if bytes[comma..].starts_with(VERSION_MEMBER.as_bytes()) {
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

impl Cache {
    /// Tweet objects and their counts for `ids`, in order, in one round trip (two `MGET`s in
    /// one pipeline).
    pub async fn get_tweets(
        &self,
        ids: &[i64],
    ) -> Result<(Vec<Cached<CachedTweet>>, Vec<Option<TweetCounts>>), CacheUnavailable> {
        let f = self
            .fetch_for_hydration(ids, Authors::Skip, None, None, Prefetched::default())
            .await?;
        Ok((f.tweets, f.counts))
    }

    /// Caches tweets and counts loaded from Postgres unless a newer version (or a tombstone)
    /// is cached, and tombstones for ids Postgres did not have. Best effort.
    pub async fn put_tweets(&self, rows: &[(TweetRecord, TweetCounts)], missing: &[i64]) {
        let (Some(keys), Some(ttl)) = (self.keys(), self.ttl()) else {
            return;
        };
        let mut pipe = redis::pipe();
        let mut versioned = Vec::with_capacity(2 * rows.len());
        for (tweet, counts) in rows {
            let cached = CachedTweet::of(tweet);
            versioned.push((keys.tweet(tweet.id), cached.version, cached.encode()));
            versioned.push((keys.tweet_counts(tweet.id), counts.version, counts.encode()));
        }
        self.pipe_put_versioned_many(&mut pipe, versioned);
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
    /// objects are in the cached form the page itself is written from, encoded once. `liked`:
    /// the reader's liked set, loaded beside the page ([`Cache::begin_page_load`]), stored in
    /// the same round trip too.
    ///
    /// Objects this process holds at their loaded version or a newer one are not sent
    /// (`at_least`: Redis was given them already; most of a returning reader's objects were
    /// stored by other readers' pages, and each sent cost Redis 5–6 µs under load: decision
    /// 0039); the others are sent and then held, unless a write evicted them since
    /// [`LoadedObjects::lookup`] began.
    pub async fn fill_hydrated(
        &self,
        list: ListKey,
        generation: &Generation,
        complete: bool,
        entries: &[Scored],
        loaded: LoadedObjects<'_>,
        liked: Option<LikedFill<'_>>,
    ) -> Result<bool, CacheUnavailable> {
        let LoadedObjects { objects, lookup } = loaded;
        let inner = self.live()?;
        let mut pipe = redis::pipe();
        let mut items = 0;
        if let Some(liked) = liked {
            liked.push(&mut pipe, &inner.keys, inner.ttl_secs);
            items += liked.items();
        }
        // Each object once (a page shows an author many times).
        let mut seen = HashSet::new();
        let wanted: Vec<(NearId, &Hydrated)> = objects
            .iter()
            .flat_map(|o| {
                let id = o.tweet.id;
                [
                    NearId::Tweet(id),
                    NearId::Counts(id),
                    NearId::User(o.author.id),
                ]
                .map(|k| (k, o))
            })
            .filter(|(k, _)| seen.insert(*k))
            .collect();
        // Those this process holds at the fill's version or a newer one are not sent: Redis was
        // given that version already (decision 0039).
        let near = self.near_objects().zip(lookup);
        let held = near
            .and_then(|(near, _)| {
                let ids: Vec<NearId> = wanted.iter().map(|(k, _)| *k).collect();
                near.get_many_uncounted(self, &ids)
            })
            .unwrap_or_default();
        let mut versioned = Vec::with_capacity(wanted.len());
        let mut sent = Vec::with_capacity(wanted.len());
        let mut skipped = 0;
        for (i, (k, o)) in wanted.into_iter().enumerate() {
            if held
                .get(i)
                .and_then(Option::as_ref)
                .is_some_and(|h| at_least(h, o))
            {
                skipped += 1;
                continue;
            }
            let (key, version, value, object) = match k {
                NearId::Tweet(id) => (
                    inner.keys.tweet(id),
                    o.tweet.version,
                    o.tweet.encode(),
                    NearObject::Tweet(o.tweet.clone()),
                ),
                NearId::Counts(id) => (
                    inner.keys.tweet_counts(id),
                    o.counts.version,
                    o.counts.encode(),
                    NearObject::Counts(o.counts),
                ),
                _ => (
                    inner.keys.user(o.author.id),
                    o.author_version,
                    stored_user(o.author_version, &o.author.json),
                    NearObject::User(o.author.clone()),
                ),
            };
            versioned.push((key, version, value));
            sent.push((k, object));
        }
        if let Some(stats) = self.stats() {
            stats
                .fill_objects_held
                .fetch_add(skipped, Ordering::Relaxed);
        }
        self.pipe_put_versioned_many(&mut pipe, versioned);
        let stored = self
            .fill_with(list, generation, complete, entries, (pipe, items))
            .await?;
        // Given to Redis (whether or not the list was stored): held from now on, unless evicted
        // since the load began, like a value read from Redis.
        if let Some((near, lookup)) = near
            && !sent.is_empty()
        {
            near.insert(self, lookup, sent);
        }
        Ok(stored)
    }

    /// Call before the Postgres read of the objects a fill stores, and hand the lookup to
    /// [`Cache::fill_hydrated`] ([`LoadedObjects::lookup`]): what it gives Redis is then held
    /// in this process's memory too, unless a write evicted it meanwhile
    /// ([`super::near::Near::begin`]). `None` if the cache is off.
    pub fn begin_object_load(&self) -> Option<Lookup> {
        self.near_objects().map(|near| near.begin(self))
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
        let token = match value.as_deref() {
            None => CachedToken::Miss,
            Some(TOMBSTONE) => CachedToken::Revoked,
            Some(id) => id.parse().map_or(CachedToken::Miss, CachedToken::User),
        };
        if let Some(stats) = self.stats() {
            let counter = match token {
                CachedToken::Miss => &stats.token_misses,
                _ => &stats.token_hits,
            };
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(token)
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
        let mut pipe = redis::pipe();
        self.pipe_set_token_nx(&mut pipe, hash, value, secs);
        let _ = self.run::<()>(&pipe).await;
    }

    /// Adds `SET {token key} value NX EX secs` to a pipeline (nothing with the cache off).
    pub(crate) fn pipe_set_token_nx(
        &self,
        pipe: &mut redis::Pipeline,
        hash: &[u8],
        value: &str,
        secs: u64,
    ) {
        let Some(keys) = self.keys() else {
            return;
        };
        pipe.cmd("SET")
            .arg(keys.token(hash))
            .arg(value)
            .arg("NX")
            .arg("EX")
            .arg(secs)
            .ignore();
    }
}

/// `SET_IF_NEWER tweet version value ttl`: caches a tweet object unless a newer version or a
/// tombstone is cached.
pub(crate) fn pipe_put_tweet(
    pipe: &mut redis::Pipeline,
    keys: &Keys,
    tweet: &TweetRecord,
    ttl: u64,
) {
    let cached = CachedTweet::of(tweet);
    pipe.invoke_script(
        super::scripts::SET_IF_NEWER
            .key(keys.tweet(tweet.id))
            .arg(cached.version)
            .arg(cached.encode())
            .arg(ttl),
    )
    .ignore();
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

pub(super) fn decode_tweet(v: Option<String>) -> Cached<CachedTweet> {
    match v {
        None => Cached::Miss,
        Some(t) if t == TOMBSTONE => Cached::Deleted,
        Some(value) => CachedTweet::decode(&value).map_or(Cached::Miss, Cached::Hit),
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
    fn a_cached_tweet_round_trips_with_its_version() {
        let mut tweet = TweetRecord {
            id: 17,
            user_id: 42,
            content: "say \"hi\" | ok, 1,2 #Rust".to_owned(),
            created_at: crate::time::from_micros(1_763_900_000_123_456),
            circle_id: Some(3),
            photo_urls: vec!["/media/a.png".to_owned()],
            coordinates: Some(vec![-73.9, 40.7]),
            place: Some(sqlx::types::Json(Place {
                full_name: "New York, NY".to_owned(),
                bbox: [-74.3, 40.5, -73.7, 40.9],
            })),
            edited_at: None,
            edit_version: 0,
            in_reply_to_tweet_id: Some(5),
            in_reply_to_user_id: Some(8),
            retweeted_tweet_id: None,
            mentioned_user_ids: Vec::new(),
        };
        let cached = CachedTweet::of(&tweet);
        assert_eq!(cached.retweeted_tweet_id, None);
        assert!(
            cached
                .members
                .starts_with(r#""id":17,"created_at":"2025-11-23T12:13:20.123456Z","content""#),
            "{}",
            cached.members
        );
        assert!(
            cached
                .members
                .ends_with(r#","edited_at":null,"hashtags":["rust"],"in_reply_to_tweet_id":5,"in_reply_to_user_id":8"#),
            "{}",
            cached.members
        );
        assert_eq!(cached.record(), Some(tweet.clone()));
        let stored = cached.encode();
        assert!(
            stored.starts_with("0|42|1763900000123456||\"id\":17,"),
            "{stored}"
        );
        assert_eq!(CachedTweet::decode(&stored), Some(cached));

        tweet.content = "edited #Tokio #tokio".to_owned();
        tweet.edited_at = Some(crate::time::from_micros(1_763_900_060_000_001));
        tweet.edit_version = 2;
        let edited = CachedTweet::of(&tweet);
        assert!(
            edited
                .members
                .contains(r#","edited_at":"2025-11-23T12:14:20.000001Z","hashtags":["tokio"],"#),
            "{}",
            edited.members
        );
        assert_eq!(edited.record(), Some(tweet.clone()));
        // A retweet names its tweet last, found without parsing (also after a decode); a
        // text that quotes the member's name does not fool it.
        let retweet = TweetRecord {
            content: r#"x,"retweeted_tweet_id":3"#.to_owned(),
            retweeted_tweet_id: Some(99),
            ..tweet.clone()
        };
        let cached_retweet = CachedTweet::of(&retweet);
        assert!(
            cached_retweet
                .members
                .ends_with(r#","retweeted_tweet_id":99"#)
        );
        assert_eq!(cached_retweet.retweeted_tweet_id, Some(99));
        let decoded = CachedTweet::decode(&cached_retweet.encode());
        assert_eq!(
            decoded.as_ref().and_then(|c| c.retweeted_tweet_id),
            Some(99)
        );
        assert_eq!(decoded.and_then(|c| c.record()), Some(retweet.clone()));
        let quoting = TweetRecord {
            retweeted_tweet_id: None,
            ..retweet.clone()
        };
        assert_eq!(CachedTweet::of(&quoting).retweeted_tweet_id, None);
        let stored = edited.encode();
        assert!(stored.starts_with("2|42|"), "{stored}");
        assert_eq!(CachedTweet::decode(&stored), Some(edited));

        // The mentioned users ride beside the members, in order, through a round trip.
        let mentioning = TweetRecord {
            content: "@bob @al | hi".to_owned(),
            mentioned_user_ids: vec![9, 4],
            ..tweet.clone()
        };
        let cached = CachedTweet::of(&mentioning);
        assert!(!cached.members.contains("mention"), "{}", cached.members);
        let stored = cached.encode();
        assert!(
            stored.starts_with("2|42|1763900000123456|9,4|\"id\":17,"),
            "{stored}"
        );
        let decoded = CachedTweet::decode(&stored);
        assert_eq!(
            decoded.as_ref().map(|c| c.mentions.to_vec()),
            Some(vec![9, 4])
        );
        assert_eq!(decoded.and_then(|c| c.record()), Some(mentioning));

        assert_eq!(CachedTweet::decode("3|1|x"), None);
        // A value of the older layout (no mentions segment) is a miss, not a misread.
        assert_eq!(
            CachedTweet::decode("0|42|1763900000123456|\"id\":17,\"x\":1"),
            None
        );
        assert_eq!(CachedTweet::decode("3|"), None, "a floor is a miss");
        assert_eq!(CachedTweet::decode("3|1|x|\"id\":1,"), None);
        assert_eq!(CachedTweet::decode("2|1|\"id\":1,\"content\":\"\""), None);
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

    /// The rule by which a cold fill leaves out an object this process holds (decision 0039):
    /// only a held version equal to the loaded one or newer, of the same object, counts; a held
    /// user's version is read from its stored JSON.
    #[test]
    fn a_fill_leaves_out_only_objects_held_at_their_version_or_newer() {
        let user = |version| UserRecord {
            id: 42,
            username: "alice".to_owned(),
            nickname: Some("A \"version\":9, really".to_owned()),
            avatar_url: None,
            version,
            created_at: crate::time::from_micros(1_763_900_000_123_456),
        };
        let tweet = |id, edit_version| {
            CachedTweet::of(&TweetRecord {
                id,
                user_id: 42,
                content: "hi".to_owned(),
                created_at: crate::time::from_micros(1_763_900_000_123_456),
                circle_id: None,
                photo_urls: Vec::new(),
                coordinates: None,
                place: None,
                edited_at: None,
                edit_version,
                in_reply_to_tweet_id: None,
                in_reply_to_user_id: None,
                retweeted_tweet_id: None,
                mentioned_user_ids: Vec::new(),
            })
        };
        let counts = |version| TweetCounts {
            version,
            ..TweetCounts::default()
        };
        let loaded = Hydrated {
            tweet: tweet(17, 2),
            counts: counts(5),
            author: CachedUser::of(&user(7)),
            author_version: 7,
        };
        assert_eq!(CachedUser::of(&user(7)).version(), Some(7));
        let stored = encode_user(&user(12)).unwrap();
        assert_eq!(CachedUser::decode(42, &stored).unwrap().version(), Some(12));
        for (held, left_out) in [
            (NearObject::Tweet(tweet(17, 1)), false),
            (NearObject::Tweet(tweet(17, 2)), true),
            (NearObject::Tweet(tweet(17, 3)), true),
            (NearObject::Tweet(tweet(18, 2)), false),
            (NearObject::Counts(counts(4)), false),
            (NearObject::Counts(counts(5)), true),
            (NearObject::Counts(counts(6)), true),
            (NearObject::User(CachedUser::of(&user(6))), false),
            (NearObject::User(CachedUser::of(&user(7))), true),
            (NearObject::User(CachedUser::of(&user(8))), true),
        ] {
            assert_eq!(at_least(&held, &loaded), left_out, "{held:?}");
        }
    }
}
