//! What each process holds in its near cache ([`super::near`]): the ids of held objects
//! ([`NearId`]), their values, and what a range read takes from and gives to that memory.

use super::liked::HeldLikes;
use super::objects::{CachedTweet, CachedUser};
use crate::cache::keys::Object;
use crate::cache::near::{Lookup, NearKey};
use crate::cache::{Cache, Keys, ListKey};
use crate::model::TweetCounts;

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
/// 7's timeline; [`ListKey::has_held_head`]) changes with a tweet written or deleted, or a fan-out
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
    /// A viewer's hidden set (`v42`, [`super::hidden::Hidden`]): changed by a mute or block,
    /// whose outbox repair (a versioned write) evicts it the same way.
    Hidden(i64),
}

impl NearKey for NearId {
    fn to_message(&self) -> String {
        match self {
            NearId::Tweet(id) => format!("t{id}"),
            NearId::User(id) => format!("u{id}"),
            NearId::Counts(id) => format!("c{id}"),
            NearId::Head(list) => format!("h{}", list.owner),
            NearId::Likes(user) => format!("l{user}"),
            NearId::Hidden(user) => format!("v{user}"),
        }
    }
    fn from_message(text: &str) -> Option<Self> {
        match text.split_at_checked(1)? {
            ("t", id) => id.parse().ok().map(NearId::Tweet),
            ("u", id) => id.parse().ok().map(NearId::User),
            ("c", id) => id.parse().ok().map(NearId::Counts),
            ("l", id) => id.parse().ok().map(NearId::Likes),
            ("v", id) => id.parse().ok().map(NearId::Hidden),
            ("h", tag) => {
                let (letter, id) = tag.split_at_checked(1)?;
                ListKey::held_list_of(Some((letter, id.parse().ok()?)), None).map(NearId::Head)
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
        if let Some(user) = Keys::parse_hidden(key) {
            return Some(NearId::Hidden(user));
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
    Hidden(std::sync::Arc<super::hidden::Hidden>),
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

impl Cache {
    /// What this process holds in its near cache for a range read: the head of `head` (a held
    /// list's newest entries, [`ListKey::has_held_head`]), the counters of `tweet_ids`, in order
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::keys;

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
            NearId::Hidden(42),
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
        assert_eq!(NearId::of_key(&keys.hidden(42)), Some(NearId::Hidden(42)));
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
            assert!(held.has_held_head());
            assert_eq!(NearId::of_key(&keys.list(held)), Some(NearId::Head(held)));
        }
        for other in [
            ListKey::timeline(keys::Owner::User(42), "feed"),
            ListKey::timeline(keys::Owner::List(7), "feed"),
        ] {
            assert!(!other.has_held_head(), "{other}");
            assert_eq!(NearId::of_key(&keys.list(other)), None, "{other}");
        }
        assert!(!ListKey::new(keys::Owner::User(42), "posts").has_held_head());
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
}
