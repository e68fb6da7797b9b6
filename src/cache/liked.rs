//! Liked sets (`has_liked`): each user's cached set of liked tweets, its samples read with a
//! page, and the sets held whole in each process's memory ([`HeldLikes`]). The set also holds
//! the user's retweets as marks below its markers (`-id - 2`,
//! `crate::retweets::retweet_mark`): `has_retweeted` is asked of the same set.

use std::collections::HashSet;

use super::held::{NearId, NearObject};
use crate::cache::{Cache, CacheUnavailable, Generation, Keys, ListKey, keys, scripts};

/// The member that marks a liked set as cached (an integer, so the set keeps Redis's compact
/// intset encoding; tweet ids are positive).
pub const LIKED_MARKER: i64 = -1;

/// The member of a liked set that says "too many likes to cache: ask Postgres per page".
pub const TOO_MANY_MARKER: i64 = -2;

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
        // Tweet ids and retweet marks (crate::retweets::retweet_mark), not the markers.
        let mut ids: Vec<i64> = (sample.iter().copied())
            .filter(|id| *id > 0 || *id < TOO_MANY_MARKER)
            .collect();
        ids.sort_unstable();
        Some(HeldLikes::All(ids.into()))
    }

    /// The near-cache entry of `user`'s liked set from a sample ([`HeldLikes::from_sample`]).
    pub(super) fn entry(user: i64, sample: &[i64], asked: usize) -> Option<(NearId, NearObject)> {
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

/// Decodes the reply of [`pipe_liked`] for `tweet_ids`.
pub(crate) fn decode_liked(
    tweet_ids: &[i64],
    value: redis::Value,
) -> Result<LikedAmong, CacheUnavailable> {
    let flags = redis::from_redis_value::<Vec<bool>>(value).map_err(|_| CacheUnavailable)?;
    Ok(liked_from_flags(tweet_ids, flags))
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

impl Cache {
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
        let mut pipe = redis::pipe();
        let fill = LikedFill {
            user,
            generation,
            tweet_ids,
        };
        fill.push(&mut pipe, keys, ttl);
        let _ = self.run_bulk::<()>(&pipe, fill.items()).await;
    }
}

/// A liked set loaded from Postgres, to store with [`scripts::SET_FILL`] ([`Cache::fill_liked`]
/// alone, or in a cold page's fill pipeline: [`Cache::fill_hydrated`]).
#[derive(Debug, Clone, Copy)]
pub struct LikedFill<'a> {
    /// Whose set.
    pub user: i64,
    /// From [`Cache::begin_load_liked`] or [`Cache::begin_page_load`], before the snapshot.
    pub generation: &'a Generation,
    /// The set's tweet ids (and retweet marks); `None` stores the "too many" marker.
    pub tweet_ids: Option<&'a [i64]>,
}

impl LikedFill<'_> {
    /// How many items the fill writes (its ids, or the marker): it sizes the round trip's
    /// timeout ([`Cache::run_bulk`]).
    pub(crate) fn items(&self) -> usize {
        self.tweet_ids.map_or(1, <[i64]>::len)
    }

    /// Adds the `SET_FILL` (its reply ignored) to `pipe`.
    pub(crate) fn push(&self, pipe: &mut redis::Pipeline, keys: &Keys, ttl: u64) {
        let key = keys.liked(self.user);
        let mut inv = scripts::SET_FILL.key(&key);
        inv.key(Keys::gen_of(&key)).arg(&self.generation.0).arg(ttl);
        match self.tweet_ids {
            Some(ids) => {
                for id in ids {
                    inv.arg(*id);
                }
            }
            None => {
                inv.arg(TOO_MANY_MARKER);
            }
        }
        pipe.invoke_script(&inv).ignore();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
