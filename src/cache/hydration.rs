//! A page's hydration in one round trip: tweets, counters, authors and the viewer's likes
//! ([`super::Cache::fetch_for_hydration`]), less what this process holds.

use std::sync::atomic::Ordering;

use super::held::{NearId, NearObject};
use super::liked::{
    HeldLikes, LikedAmong, decode_liked, decode_sample, liked_from_sample, pipe_liked,
    pipe_liked_sample,
};
use super::objects::{Cached, CachedTweet, CachedUser, decode_tweet};
use crate::cache::counts::Versioned;
use crate::cache::keys::Object;
use crate::cache::{Cache, CacheUnavailable, Keys};
use crate::model::TweetCounts;

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

impl Cache {
    /// Counts the objects and counters hydration asked of Redis (`tweets`, `users`,
    /// `counters`) as hits or misses by what it `found` there; a tweet's tombstone (deleted:
    /// Postgres is not asked) is a hit too.
    fn count_found(
        &self,
        tweets: &[i64],
        users: &[i64],
        counters: &[i64],
        found: &[(NearId, NearObject)],
        tombstones: usize,
    ) {
        let Some(stats) = self.stats() else {
            return;
        };
        let counts = found
            .iter()
            .filter(|(k, _)| matches!(k, NearId::Counts(_)))
            .count();
        let objects = tombstones
            + found
                .iter()
                .filter(|(k, _)| matches!(k, NearId::Tweet(_) | NearId::User(_)))
                .count();
        let asked = tweets.len() + users.len();
        stats
            .object_hits
            .fetch_add(objects as u64, Ordering::Relaxed);
        (stats.object_misses).fetch_add(asked.saturating_sub(objects) as u64, Ordering::Relaxed);
        stats
            .counter_hits
            .fetch_add(counts as u64, Ordering::Relaxed);
        (stats.counter_misses).fetch_add(
            counters.len().saturating_sub(counts) as u64,
            Ordering::Relaxed,
        );
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
        let mut tombstones = 0;
        if !ask_tweets.is_empty() {
            let mut asked = strings(next("tweets")?)?.into_iter().map(decode_tweet);
            for t in tweets.iter_mut().filter(|t| matches!(t, Cached::Miss)) {
                *t = asked.next().unwrap_or(Cached::Miss);
                tombstones += usize::from(matches!(t, Cached::Deleted));
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
        self.count_found(&ask_tweets, &ask_users, &ask_counts, &found, tombstones);
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
                let before = found.len();
                authors.decode(&ask_users, values, &mut found);
                self.count_found(&[], &ask_users, &[], &found[before..], 0);
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
