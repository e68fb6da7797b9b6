//! Typed builders for every Redis key chirp writes, all under `CHIRP_REDIS_PREFIX` (`{p}`).
//!
//! Every key of one owner carries the owner's hash tag (`{u42}` for user 42, `{t17}` for tweet
//! 17), so a list and its generation, and every multi-key command or Lua script on one owner,
//! stay in one Redis Cluster slot. The prefix itself may not contain `{` or `}`.
//!
//! Timeline lists fit Redis's compact listpack encoding when Redis runs with
//! `zset-max-listpack-entries` above `CHIRP_CACHE_LIST_LIMIT` (`scripts/services` starts Redis
//! with 1025; see docs/cache.md, "Running Redis for chirp"): about 23 bytes per imported
//! newsfeed entry instead of 110.
//!
//! [`pack_entry`]: super::lists::pack_entry
//!
//! | key | type | holds |
//! |---|---|---|
//! | `{p}:{u42}:feed` | sorted set | user 42's newsfeed: [`pack_entry`]`(created_at, [newsfeed_id, tweet_id])`: score = whole seconds since 2000, member = the µs within the second, then the packed ids |
//! | `{p}:{u42}:posts` | sorted set | user 42's own tweets: [`pack_entry`]`(created_at, [tweet_id])` |
//! | `{p}:{l7}:items` | sorted set | list 7's timeline: [`pack_entry`]`(created_at, [tweet_id])` |
//! | `{p}:{c3}:items` | sorted set | circle 3's tweets: [`pack_entry`]`(created_at, [tweet_id])` |
//! | `{p}:{h9}:items` | sorted set | the tweets with hashtag 9 (`hashtags.id`): [`pack_entry`]`(created_at, [tweet_id])` |
//! | `{p}:{c3d20261122}:rank` | sorted set | circle 3's rank of 2026-11-22 (UTC): member `"{created_at µs, 17 digits}:{tweet_id}:{author_id}"`, score = likes + comments |
//! | `{p}:{ch5}:msgs` | sorted set | chat channel 5's recent backlog: member `"{id}\|{user_id}\|{created_at µs}\|{content}"`, score = message id |
//! | `{p}:{c3d20261122}:rank:ver` | hash | the `counts_version` each rank score was written with |
//! | `{p}:{u42}:liked` | set | ids of the tweets user 42 liked, plus the marker `-1` (an integer, so the set stays an intset) |
//! | `{p}:{u42}:hidden` | string | whom user 42 must not see: `"{hidden_version}\|h{,id}...;{,id}..."` (muted or blocked either way; then those who block 42), see [`super::hidden`] |
//! | `{list}:gen` | hash | the generations of a list or set: `w` (bumped by every write), `r` (by every removal) |
//! | `{p}:{u42}:user` | string | `"{version}\|{user JSON}"` |
//! | `{p}:{u42}:cnt` | string | `"{counts_version}\|{followers}\|{followings}\|{tweets}"` |
//! | `{p}:{t17}:tweetv4` | string | the tweet object `"{edit_version}\|{user_id}\|{created_at µs}\|{mentioned user ids, comma-separated}\|{JSON members}"`, or the tombstone `-` once deleted (`v4`: versioned, with hashtags, reply ids and mentions; older builds' `tweet`, `tweetv`, `tweetv2` and `tweetv3` keys expire with their TTL) |
//! | `{p}:{t17}:cnt3` | string | `"{counts_version}\|{likes}\|{comments}\|{replies}\|{retweets}"` (`3`: with retweets; older builds' `cnt` and `cnt2` keys expire with their TTL) |
//! | `{p}:{t17}:thread` | string | a thread's shape, on its first tweet: `"{threads.version}\|{JSON [[id, parent or 0, created_at µs, author], …]}"` ([`crate::cache::threads`]) |
//! | `{p}:{k<sha256 hex>}:token` | string | the user id of a bearer token, or the tombstone `-` after logout |
//! | `{p}:{bus}:revoked` | pub/sub channel | hashes of revoked tokens, for every process's token cache (see [`crate::cache::tokens`]) |
//! | `{p}:{trends}:1h`, `{p}:{trends}:24h` | string | the last count of that window's trends (JSON), with a TTL of its freshness (500 ms); `…:lock`: the count in progress (see [`super::trends`]) |
//! | `{p}:epoch` | string | the cache epoch, also kept in Postgres (see [`super::epoch`]) |

use std::fmt;

/// Whose keys: the hash tag every key of one owner carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Owner {
    /// A user (`{u42}`).
    User(i64),
    /// A list (`{l7}`).
    List(i64),
    /// A circle (`{c3}`).
    Circle(i64),
    /// One UTC day of a circle (`{c3d20261122}`: circle 3, day `yyyymmdd`), for its rank.
    CircleDay(i64, u32),
    /// A chat channel (`{ch5}`).
    Channel(i64),
    /// A hashtag, by its id in `hashtags` (`{h9}`).
    Hashtag(i64),
}

impl Owner {
    /// The hash tag's letters and id (`("u", 42)` for `{u42}`); `None` for a circle's day,
    /// whose tag holds two numbers.
    pub fn tag(self) -> Option<(&'static str, i64)> {
        match self {
            Owner::User(id) => Some(("u", id)),
            Owner::List(id) => Some(("l", id)),
            Owner::Circle(id) => Some(("c", id)),
            Owner::Channel(id) => Some(("ch", id)),
            Owner::Hashtag(id) => Some(("h", id)),
            Owner::CircleDay(..) => None,
        }
    }
}

impl fmt::Display for Owner {
    /// The hash tag's content.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::User(id) => write!(f, "u{id}"),
            Owner::List(id) => write!(f, "l{id}"),
            Owner::Circle(id) => write!(f, "c{id}"),
            Owner::CircleDay(id, day) => write!(f, "c{id}d{day}"),
            Owner::Channel(id) => write!(f, "ch{id}"),
            Owner::Hashtag(id) => write!(f, "h{id}"),
        }
    }
}

/// A cached, generation-guarded collection of one owner: a timeline list, a rank or the liked
/// set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ListKey {
    /// The owner (the hash tag).
    pub owner: Owner,
    /// The collection's name after the hash tag (`feed`, `posts`, `items`, `liked`, `rank`).
    pub name: &'static str,
    /// A timeline list in the split-time layout: scores are whole seconds and each member
    /// starts with its sub-second part ([`super::lists::pack_entry`]). Other sorted sets (a
    /// chat backlog) are ordered by their score alone.
    pub split_time: bool,
}

impl ListKey {
    /// The collection `name` of `owner`, ordered by its score alone.
    pub const fn new(owner: Owner, name: &'static str) -> Self {
        ListKey {
            owner,
            name,
            split_time: false,
        }
    }

    /// The timeline list `name` of `owner`, in the split-time layout ([`ListKey::split_time`]).
    pub const fn timeline(owner: Owner, name: &'static str) -> Self {
        ListKey {
            owner,
            name,
            split_time: true,
        }
    }

    /// Whether a process may hold this list's head (its newest entries) in its near cache
    /// ([`super::near`]): a user's own tweets (`{u42}:posts`) and a circle's tweets
    /// (`{c3}:items`), which change only with a tweet written or deleted by one request, whose
    /// outbox repair ([`super::Repair::Invalidate`]) evicts the head everywhere before the write
    /// answers; and a list's timeline (`{l7}:items`), which changes with the fan-out batches of
    /// its members' tweets, with its membership jobs and with its deletion, whose repairs (an
    /// [`super::Repair::Invalidate`] of the list) evict it the same way, in a job's cache step
    /// right after the batch's merge reached Redis (docs/decisions/0016-held-timeline-heads.md:
    /// a tweet's fan-out reaches 0.6 lists on average on the imported data, 266 at most). (A
    /// tweet deleted from more than [`crate::tweets::MAX_EAGER_REMOVALS`] timelines is removed
    /// from none: a held head may still name it, and the page that meets its tombstone forgets
    /// the head and reads again.)
    /// Newsfeeds are not held: every fan-out batch changes a thousand of them.
    pub fn has_held_head(self) -> bool {
        self.split_time && ListKey::held_list_of(self.owner.tag(), Some(self.name)) == Some(self)
    }

    /// The held list ([`ListKey::has_held_head`]) of the hash tag `(tag, id)` (`("u", 42)`: the
    /// tweets of user 42), checked against `name` if given; `None` for any other list.
    pub fn held_list_of(tag: Option<(&str, i64)>, name: Option<&str>) -> Option<ListKey> {
        let (owner, held) = match tag? {
            ("u", id) => (Owner::User(id), "posts"),
            ("c", id) => (Owner::Circle(id), "items"),
            ("l", id) => (Owner::List(id), "items"),
            _ => return None,
        };
        name.is_none_or(|n| n == held)
            .then_some(ListKey::timeline(owner, held))
    }
}

impl fmt::Display for ListKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} of {}", self.name, self.owner)
    }
}

/// Builds keys under one prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

/// The kinds of per-object cache entries that hydration reads in bulk ([`Keys::pipe_mget`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Object {
    /// A tweet object, `{p}:{t17}:tweetv4`.
    Tweet,
    /// A tweet's counts, `{p}:{t17}:cnt3`.
    TweetCounts,
    /// A user object, `{p}:{u42}:user`.
    User,
}

impl Object {
    /// The hash tag's letter and the key's name.
    fn parts(self) -> (&'static str, &'static str) {
        match self {
            Object::Tweet => ("t", "tweetv4"),
            Object::TweetCounts => ("t", "cnt3"),
            Object::User => ("u", "user"),
        }
    }
}

impl Keys {
    /// Keys under `prefix` (e.g. `chirp`).
    ///
    /// # Errors
    /// An empty prefix, or one with `{` or `}` (it would move the hash tag), `:` (a prefix
    /// `a` would then own the keys of a prefix `a:b`, e.g. in [`crate::cache::Cache::clear`]) or
    /// a glob character (`*?[]\`).
    pub fn new(prefix: &str) -> anyhow::Result<Self> {
        if prefix.is_empty() || prefix.contains(['{', '}', ':', '*', '?', '[', ']', '\\']) {
            anyhow::bail!(
                "CHIRP_REDIS_PREFIX must be non-empty and contain none of {{ }} : * ? [ ] \\"
            );
        }
        Ok(Keys {
            prefix: prefix.to_owned(),
        })
    }

    /// The key of a list or set.
    pub fn list(&self, list: ListKey) -> String {
        match list.owner.tag() {
            Some((tag, id)) => self.tagged(tag, id, list.name),
            None => format!("{}:{{{}}}:{}", self.prefix, list.owner, list.name),
        }
    }

    /// `{prefix}:{{tag}{id}}:{name}` under any prefix (what [`Keys::list`] builds for an owner
    /// with [`Owner::tag`] `(tag, id)`), for repairs that store the prefix and ids.
    pub fn tagged_key(prefix: &str, tag: &str, id: i64, name: &str) -> String {
        let mut key = String::with_capacity(prefix.len() + tag.len() + name.len() + 24);
        Self::write_tagged(&mut key, prefix, tag, id, name);
        key
    }

    /// `{prefix}:{{tag}{id}}:{name}`, built without `format!` (hydration builds dozens of keys
    /// per page).
    fn tagged(&self, tag: &str, id: i64, name: &str) -> String {
        Self::tagged_key(&self.prefix, tag, id, name)
    }

    /// [`Keys::tagged_key`] written into `key` (cleared first).
    fn write_tagged(key: &mut String, prefix: &str, tag: &str, id: i64, name: &str) {
        key.clear();
        key.push_str(prefix);
        key.push_str(":{");
        key.push_str(tag);
        key.push_str(itoa::Buffer::new().format(id));
        key.push_str("}:");
        key.push_str(name);
    }

    /// Appends `MGET` of the objects `ids` of one kind to `pipe`, each key built in one reused
    /// buffer: hydration asks for dozens per page, and a `String` and a `Vec` of them per page
    /// showed up in its profile.
    pub fn pipe_mget(&self, pipe: &mut redis::Pipeline, object: Object, ids: &[i64]) {
        let (tag, name) = object.parts();
        let mut key = String::with_capacity(self.prefix.len() + tag.len() + name.len() + 24);
        pipe.cmd("MGET");
        for id in ids {
            Self::write_tagged(&mut key, &self.prefix, tag, *id, name);
            pipe.arg(key.as_bytes());
        }
    }

    /// The version hash of a rank (same slot as the rank).
    pub fn versions_of(list_key: &str) -> String {
        format!("{list_key}:ver")
    }

    /// The generation hash of a list or set (same slot as the list).
    pub fn gen_of(list_key: &str) -> String {
        format!("{list_key}:gen")
    }

    /// A tweet object.
    pub fn tweet(&self, id: i64) -> String {
        self.object(Object::Tweet, id)
    }

    /// The object and id of a key built by [`Keys::object`] (any prefix); `None` for other
    /// keys.
    pub fn parse_object(key: &str) -> Option<(Object, i64)> {
        let (letter, id, name) = Self::parse_tagged(key)?;
        [Object::Tweet, Object::TweetCounts, Object::User]
            .into_iter()
            .find(|o| o.parts() == (letter, name))
            .map(|o| (o, id))
    }

    /// The held list ([`ListKey::has_held_head`]) a list key names (any prefix); `None` for any
    /// other key.
    pub fn parse_held_list(key: &str) -> Option<ListKey> {
        let (letter, id, name) = Self::parse_tagged(key)?;
        ListKey::held_list_of(Some((letter, id)), Some(name))
    }

    /// The user whose liked set a key names (any prefix); `None` for any other key.
    pub fn parse_liked(key: &str) -> Option<i64> {
        match Self::parse_tagged(key)? {
            ("u", id, LIKED) => Some(id),
            _ => None,
        }
    }

    /// The one-letter tag, id and name of a key `{prefix}:{{letter}{id}}:{name}`.
    fn parse_tagged(key: &str) -> Option<(&str, i64, &str)> {
        let (head, name) = key.rsplit_once(':')?;
        let (_, tag) = head.rsplit_once(":{")?;
        let (letter, id) = tag.strip_suffix('}')?.split_at_checked(1)?;
        Some((letter, id.parse().ok()?, name))
    }

    /// A tweet's counts.
    pub fn tweet_counts(&self, id: i64) -> String {
        self.object(Object::TweetCounts, id)
    }

    /// A user object.
    pub fn user(&self, id: i64) -> String {
        self.object(Object::User, id)
    }

    /// The key of an object cache entry.
    pub fn object(&self, object: Object, id: i64) -> String {
        let (tag, name) = object.parts();
        self.tagged(tag, id, name)
    }

    /// The cached shape of the thread whose first tweet is `root` ([`crate::cache::threads`]).
    pub fn thread(&self, root: i64) -> String {
        self.tagged("t", root, "thread")
    }

    /// A user's profile counts.
    pub fn user_counts(&self, id: i64) -> String {
        self.tagged("u", id, "cnt")
    }

    /// A bearer token (by the SHA-256 it is stored under).
    pub fn token(&self, hash: &[u8]) -> String {
        format!("{}:{{k{}}}:token", self.prefix, hex(hash))
    }

    /// The set of tweets a user liked.
    pub fn liked(&self, user_id: i64) -> String {
        self.list(ListKey::new(Owner::User(user_id), LIKED))
    }

    /// `{p}:{u<id>}:hidden`: whom the user must not see ([`super::hidden`]).
    pub fn hidden(&self, user_id: i64) -> String {
        self.tagged("u", user_id, HIDDEN)
    }

    /// The user whose hidden set a key names (any prefix); `None` for any other key.
    pub fn parse_hidden(key: &str) -> Option<i64> {
        match Self::parse_tagged(key)? {
            ("u", id, HIDDEN) => Some(id),
            _ => None,
        }
    }

    /// `{p}:{u<id>}:wrote`: the user wrote recently ([`super::writers`]).
    pub fn wrote(&self, user_id: i64) -> String {
        self.tagged("u", user_id, "wrote")
    }

    /// `{p}:{<subject>}:rl:<class>`: the rate limiter's state of `subject` (`u42`, `i10.0.0.1`,
    /// `n<hash>`) for one class ([`super::limits`]).
    pub fn rate_limit(&self, subject: &str, class: &str) -> String {
        format!("{}:{{{subject}}}:rl:{class}", self.prefix)
    }

    /// `{p}:{bus}:<topic>`: a pub/sub channel ([`super::pubsub`]).
    pub fn topic(&self, topic: &str) -> String {
        format!("{}:{{bus}}:{topic}", self.prefix)
    }

    /// `{p}:{bus}:live:<topic>`: the registry of the processes that may hold a lease on their
    /// memory of `topic`'s values ([`super::lease`]).
    pub fn registry(&self, topic: &str) -> String {
        format!("{}:{{bus}}:live:{topic}", self.prefix)
    }

    /// `{p}:{r<nonce>}:acks`: the processes that acknowledged eviction `nonce`
    /// ([`super::near`]).
    pub fn acks(&self, nonce: &str) -> String {
        format!("{}:{{r{nonce}}}:acks", self.prefix)
    }

    /// The `SCAN` pattern of every key under the prefix (`{p}:*`: a fence clears them).
    pub fn everything_pattern(&self) -> String {
        format!("{}:*", self.prefix)
    }

    /// The `SCAN` pattern of every cached chat backlog (`{p}:{ch<id>}:msgs`).
    pub fn backlogs_pattern(&self) -> String {
        format!("{}:{{ch*}}:msgs", self.prefix)
    }

    /// The channel of a chat backlog's key (from [`Keys::backlogs_pattern`]'s scan).
    pub fn backlog_channel(&self, key: &str) -> Option<i64> {
        key.strip_prefix(&self.prefix)?
            .strip_prefix(":{ch")?
            .strip_suffix("}:msgs")?
            .parse()
            .ok()
    }

    /// The shared count of the trends of `window` (`1h`, `24h`): `{p}:{trends}:1h`, and its
    /// lock (`{p}:{trends}:1h:lock`), in one slot (see [`super::trends`]).
    pub fn trends(&self, window: &str) -> (String, String) {
        let key = format!("{}:{{trends}}:{window}", self.prefix);
        let lock = format!("{key}:lock");
        (key, lock)
    }

    /// The cache epoch (see [`super::epoch`]).
    pub fn epoch(&self) -> String {
        format!("{}:epoch", self.prefix)
    }

    /// The prefix itself (for `SCAN MATCH {prefix}:*`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

/// Lowercase hex of `bytes` (token hashes in keys and revocation messages).
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * bytes.len());
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}

/// The name of a user's liked set.
pub const LIKED: &str = "liked";

/// The name of a user's hidden set ([`Keys::hidden`]).
pub const HIDDEN: &str = "hidden";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_built_for_other_layers_keep_the_layout_they_had() {
        let keys = Keys::new("p").unwrap();
        assert_eq!(keys.rate_limit("u42", "read"), "p:{u42}:rl:read");
        assert_eq!(keys.acks("00ff"), "p:{r00ff}:acks");
        assert_eq!(keys.topic("streams"), "p:{bus}:streams");
        assert_eq!(keys.registry("objects"), "p:{bus}:live:objects");
        assert_eq!(keys.backlogs_pattern(), "p:{ch*}:msgs");
        assert_eq!(keys.everything_pattern(), "p:*");
        let backlog = keys.list(crate::cache::backlog::backlog_key(5));
        assert_eq!(backlog, "p:{ch5}:msgs");
        assert_eq!(keys.backlog_channel(&backlog), Some(5));
        assert_eq!(keys.backlog_channel("q:{ch5}:msgs"), None, "another prefix");
        assert_eq!(keys.backlog_channel("p:{chx}:msgs"), None);
    }

    #[test]
    fn every_key_of_one_owner_shares_its_hash_tag() {
        let keys = Keys::new("p").unwrap();
        let feed = keys.list(ListKey::new(Owner::User(42), "home"));
        assert_eq!(
            keys.list(ListKey::new(Owner::List(7), "timeline")),
            "p:{l7}:timeline"
        );
        assert_eq!(
            keys.list(ListKey::new(Owner::Circle(3), "timeline")),
            "p:{c3}:timeline"
        );
        assert_eq!(
            keys.list(ListKey::new(Owner::Channel(5), "msgs")),
            "p:{ch5}:msgs"
        );
        let rank = keys.list(ListKey::new(Owner::CircleDay(3, 20261122), "rank"));
        assert_eq!(rank, "p:{c3d20261122}:rank");
        assert_eq!(Keys::versions_of(&rank), "p:{c3d20261122}:rank:ver");
        assert_eq!(feed, "p:{u42}:home");
        assert_eq!(Keys::gen_of(&feed), "p:{u42}:home:gen");
        assert_eq!(keys.liked(42), "p:{u42}:liked");
        assert_eq!(keys.user(42), "p:{u42}:user");
        assert_eq!(keys.user_counts(42), "p:{u42}:cnt");
        assert_eq!(keys.tweet(7), "p:{t7}:tweetv4");
        assert_eq!(keys.tweet_counts(7), "p:{t7}:cnt3");
        assert_eq!(keys.thread(7), "p:{t7}:thread");
        for object in [Object::Tweet, Object::TweetCounts, Object::User] {
            let ids = [7, 1_234_567_890_123, 42];
            let (mut bulk, mut one_by_one) = (redis::pipe(), redis::pipe());
            keys.pipe_mget(&mut bulk, object, &ids);
            one_by_one.cmd("MGET").arg(
                ids.iter()
                    .map(|id| keys.object(object, *id))
                    .collect::<Vec<_>>(),
            );
            assert_eq!(
                bulk.get_packed_pipeline(),
                one_by_one.get_packed_pipeline(),
                "{object:?}"
            );
        }
        assert_eq!(keys.token(&[0xab, 0x01]), "p:{kab01}:token");
        assert!(Keys::new("a{b").is_err());
        assert!(Keys::new("a:b").is_err());
        assert!(Keys::new("a*").is_err());
        assert!(Keys::new("").is_err());
    }
}
