//! A page's hydration in one round trip: tweets, counters, authors and the viewer's likes
//! ([`super::Cache::fetch_for_hydration`]), less what this process holds.

use std::sync::atomic::Ordering;

use super::held::{NearId, NearObject};
use super::liked::{HeldLikes, LikedAmong, liked_from_sample};
use super::objects::{Cached, CachedTweet, CachedUser, decode_tweet};
use super::piggyback::{Piggyback, Taken};
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

/// Whether hydration also reads the page's tweets' authors ([`Cache::fetch_for_hydration`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authors {
    /// The authors too: a page of tweets to render.
    Read,
    /// The tweets alone (their authors are read elsewhere, or not needed).
    Skip,
}

/// The authors of a page's tweets as hydration finds them: sorted ids, each with its user
/// object once found (`None`: not yet, or not cached).
#[derive(Default)]
struct PageAuthors {
    ids: Vec<i64>,
    users: Vec<Option<CachedUser>>,
    /// Ids already asked of Redis (a miss there is not asked again).
    asked: Vec<i64>,
}

impl PageAuthors {
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

    /// Tweet objects, their counts, their authors (with [`Authors::Read`]) and the viewer's
    /// likes of them, in one pipeline. Tweets, counters and authors this process holds in its
    /// near cache ([`super::near`]) are taken from there and not asked for: a warm page then
    /// asks Redis for the likes alone, if for anything.
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
    ///
    /// In three steps: what memory holds ([`Cache::held_for_hydration`]), one round trip for
    /// the rest (a [`Piggyback`]), and the authors of the tweets that round trip found.
    pub async fn fetch_for_hydration(
        &self,
        tweet_ids: &[i64],
        authors: Authors,
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
        // The viewer's likes, if a sample or the range read answered them.
        let known = viewer_likes
            .and_then(|sample| liked_from_sample(tweet_ids, sample))
            .or_else(|| prefetched.liked_of(tweet_ids));
        let likes_of = viewer.filter(|_| known.is_none());
        let mut page = self.held_for_hydration(tweet_ids, authors, likes_of, prefetched);
        page.liked = known.or(page.liked);
        let plan = Piggyback {
            tweets: (tweet_ids.iter().zip(&page.tweets))
                .filter(|(_, t)| matches!(t, Cached::Miss))
                .map(|(id, _)| *id)
                .collect(),
            counts: (tweet_ids.iter().zip(&page.counts))
                .filter(|(_, c)| c.is_none())
                .map(|(id, _)| *id)
                .collect(),
            users: page.authors.missing(),
            liked: viewer
                .filter(|_| page.liked.is_none())
                .map(|v| (v, tweet_ids)),
            // A liked set not held: a sample too, to hold it from now on if it is small.
            hold: likes_of.filter(|_| !page.held_likes && near.may_store(&lookup)),
            sample: None,
        };
        let taken = if plan.is_empty() {
            if let Some(stats) = self.stats() {
                stats.prefetched.fetch_add(1, Ordering::Relaxed);
            }
            Taken::default()
        } else {
            let mut pipe = redis::pipe();
            plan.push(&mut pipe, keys);
            let replies = self.run::<Vec<redis::Value>>(&pipe).await?;
            plan.take(&mut replies.into_iter())?
        };
        let mut found = Vec::new();
        let mut read_authors = Vec::new();
        let mut tombstones = 0;
        let mut read = taken.tweets.into_iter().map(decode_tweet);
        for t in page.tweets.iter_mut().filter(|t| matches!(t, Cached::Miss)) {
            *t = read.next().unwrap_or(Cached::Miss);
            tombstones += usize::from(matches!(t, Cached::Deleted));
            if let Cached::Hit(tweet) = t {
                found.push((NearId::Tweet(tweet.id), NearObject::Tweet(tweet.clone())));
                read_authors.push(tweet.user_id);
            }
        }
        // `plan.counts` are the unknown ones, in order: each takes its reply (`None`: not
        // cached, hydration reads Postgres).
        let mut read = plan.counts.iter().zip(taken.counts);
        for c in page.counts.iter_mut().filter(|c| c.is_none()) {
            if let Some((id, counts)) = read.next() {
                if let Some(counts) = counts {
                    found.push((NearId::Counts(*id), NearObject::Counts(counts)));
                }
                *c = counts;
            }
        }
        if !plan.users.is_empty() {
            page.authors.decode(&plan.users, taken.users, &mut found);
        }
        self.count_found(&plan.tweets, &plan.users, &plan.counts, &found, tombstones);
        if taken.liked.is_some() {
            page.liked = taken.liked;
        }
        if let (Some(v), Some(sample)) = (plan.hold, &taken.hold) {
            found.extend(HeldLikes::entry(v, sample, HeldLikes::SAMPLE));
        }
        if matches!(authors, Authors::Read) && !read_authors.is_empty() {
            // The authors of the tweets just read: from the near cache, else one more MGET.
            page.authors.add(self, near, read_authors);
            let more = Piggyback {
                users: page.authors.missing(),
                ..Piggyback::default()
            };
            if !more.is_empty() {
                let mut pipe = redis::pipe();
                more.push(&mut pipe, keys);
                let replies = self.run::<Vec<redis::Value>>(&pipe).await?;
                let taken = more.take(&mut replies.into_iter())?;
                let before = found.len();
                page.authors.decode(&more.users, taken.users, &mut found);
                self.count_found(&[], &more.users, &[], &found[before..], 0);
            }
        }
        if !found.is_empty() {
            near.insert(self, lookup, found);
        }
        Ok(Fetched {
            tweets: page.tweets,
            counts: page.counts,
            authors: page.authors.ids,
            users: page.authors.users,
            liked: viewer.and(page.liked),
        })
    }

    /// User objects for `ids` (in order; `None`: not cached): those this process's near cache
    /// holds from there, the rest in one `MGET` (then held). For the users a page's tweets
    /// mention ([`crate::mentions::attach`]), known only once the tweets are.
    ///
    /// # Errors
    /// Redis failed or is not configured.
    pub async fn fetch_users(
        &self,
        ids: &[i64],
    ) -> Result<Vec<Option<CachedUser>>, CacheUnavailable> {
        let keys = self.keys().ok_or(CacheUnavailable)?;
        let near = self.near_objects().ok_or(CacheUnavailable)?;
        let lookup = near.begin(self);
        let mut users = PageAuthors::default();
        users.add(self, near, ids.to_vec());
        let more = Piggyback {
            users: users.missing(),
            ..Piggyback::default()
        };
        let mut found = Vec::new();
        if !more.is_empty() {
            let mut pipe = redis::pipe();
            more.push(&mut pipe, keys);
            let replies = self.run::<Vec<redis::Value>>(&pipe).await?;
            let taken = more.take(&mut replies.into_iter())?;
            users.decode(&more.users, taken.users, &mut found);
            self.count_found(&[], &more.users, &[], &found, 0);
        }
        if !found.is_empty() {
            near.insert(self, lookup, found);
        }
        Ok(ids
            .iter()
            .map(|id| {
                let at = users.ids.binary_search(id).ok()?;
                users.users[at].clone()
            })
            .collect())
    }

    /// What this process's near cache holds of a page's hydration: the tweets, the counters
    /// not `prefetched`, the liked set of `likes_of` and, in the same lookup, the held tweets'
    /// authors (with [`Authors::Read`]).
    fn held_for_hydration(
        &self,
        tweet_ids: &[i64],
        authors: Authors,
        likes_of: Option<i64>,
        prefetched: Prefetched<'_>,
    ) -> HeldPage {
        let mut counts: Vec<Option<TweetCounts>> = (tweet_ids.iter().enumerate())
            .map(|(at, id)| prefetched.get(at, *id))
            .collect();
        let wanted: Vec<NearId> = (tweet_ids.iter().map(|id| NearId::Tweet(*id)))
            .chain(
                (tweet_ids.iter().zip(&counts))
                    .filter(|(_, c)| c.is_none())
                    .map(|(id, _)| NearId::Counts(*id)),
            )
            .chain(likes_of.map(NearId::Likes))
            .collect();
        let author_of = |o: &NearObject| match o {
            NearObject::Tweet(t) if matches!(authors, Authors::Read) => {
                Some(NearId::User(t.user_id))
            }
            _ => None,
        };
        let (mut held, held_authors) = self
            .near_objects()
            .and_then(|near| near.get_many_then(self, &wanted, author_of))
            .unwrap_or_else(|| (vec![None; wanted.len()], Vec::new()));
        let held_likes = match likes_of.and_then(|_| held.pop()) {
            Some(Some(NearObject::Likes(l))) => Some(l),
            _ => None,
        };
        let mut held_counts = held.split_off(tweet_ids.len()).into_iter();
        for c in counts.iter_mut().filter(|c| c.is_none()) {
            if let Some(Some(NearObject::Counts(held))) = held_counts.next() {
                *c = Some(held);
            }
        }
        let tweets = held
            .into_iter()
            .map(|o| match o {
                Some(NearObject::Tweet(t)) => Cached::Hit(t),
                _ => Cached::Miss,
            })
            .collect();
        let mut page_authors = PageAuthors::default();
        for (key, user) in held_authors {
            if let NearId::User(id) = key {
                page_authors.insert(id, user);
            }
        }
        HeldPage {
            tweets,
            counts,
            authors: page_authors,
            held_likes: held_likes.is_some(),
            liked: held_likes.and_then(|l| l.among(tweet_ids)),
        }
    }
}

/// A page's hydration as [`Cache::held_for_hydration`] found it in memory, completed by
/// [`Cache::fetch_for_hydration`]'s round trip.
struct HeldPage {
    /// The page's tweets, in order ([`Cached::Miss`]: not known yet).
    tweets: Vec<Cached<CachedTweet>>,
    /// Their counters, in order (`None`: not known yet; after the round trip: not cached).
    counts: Vec<Option<TweetCounts>>,
    authors: PageAuthors,
    /// The viewer's liked set is held (no sample to hold it).
    held_likes: bool,
    /// What the viewer's liked set says of the page, if known.
    liked: Option<LikedAmong>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetched_counters_and_likes_answer_only_for_the_tweets_they_were_read_for() {
        let c = |likes| TweetCounts {
            likes,
            comments: 0,
            replies: 0,
            retweets: 0,
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
