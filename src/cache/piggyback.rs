//! What a read takes along on its one round trip to Redis: the read side's counterpart of the
//! write side's `Update::plan` ([`super::update`]).
//!
//! A page's range read ([`Cache::range`](super::Cache::range)) and its hydration
//! ([`Cache::fetch_for_hydration`](super::Cache::fetch_for_hydration)) each decide first, from
//! what this process holds in its near cache, which objects, counters and liked-set answers
//! they still need, as one [`Piggyback`]. [`Piggyback::push`] appends exactly those commands
//! to the read's pipeline and [`Piggyback::take`] decodes their replies in the same order, so
//! the two can not drift apart; the caller then only says what to do with what was [`Taken`].
//! The commands go in a fixed order: tweet objects, counters, user objects, the liked-set
//! question, the liked-set samples.

use super::hydration::{decode_counts, pipe_counts};
use super::keys::Object;
use super::liked::{
    HeldLikes, LIKED_SAMPLE, LikedAmong, decode_liked, decode_sample, pipe_liked, pipe_liked_sample,
};
use super::{CacheUnavailable, Keys};
use crate::model::TweetCounts;

/// What a read asks Redis for besides its list members (see the module docs). Every field
/// empty or `None`: nothing.
#[derive(Debug, Default)]
pub struct Piggyback<'a> {
    /// Tweet objects to read (`MGET`).
    pub tweets: Vec<i64>,
    /// Tweets whose counters to read (`MGET`).
    pub counts: Vec<i64>,
    /// User objects to read (`MGET`).
    pub users: Vec<i64>,
    /// A user whose liked set is asked which of these tweets it holds (`SMISMEMBER`).
    pub liked: Option<(i64, &'a [i64])>,
    /// A user whose liked set is sampled for hydration: up to [`LIKED_SAMPLE`] members
    /// (`SRANDMEMBER`; a newsfeed owner's, [`super::Window::owner_likes`]).
    pub sample: Option<i64>,
    /// A user whose liked set is sampled to be held in this process's memory if it is small:
    /// up to [`HeldLikes::SAMPLE`] members ([`HeldLikes::from_sample`]).
    pub hold: Option<i64>,
}

/// The replies to a [`Piggyback`], decoded, each in the order it was asked.
#[derive(Debug, Default)]
pub struct Taken {
    /// The tweet objects' stored values (`None`: not cached).
    pub tweets: Vec<Option<String>>,
    /// The counters (`None`: not cached, or malformed: read Postgres).
    pub counts: Vec<Option<TweetCounts>>,
    /// The user objects' stored values (`None`: not cached).
    pub users: Vec<Option<String>>,
    /// What the liked set said of the tweets asked about.
    pub liked: Option<LikedAmong>,
    /// The sample of [`Piggyback::sample`].
    pub sample: Option<Vec<i64>>,
    /// The sample of [`Piggyback::hold`].
    pub hold: Option<Vec<i64>>,
}

impl Piggyback<'_> {
    /// Whether it asks for nothing.
    pub fn is_empty(&self) -> bool {
        self.tweets.is_empty()
            && self.counts.is_empty()
            && self.users.is_empty()
            && self.liked.is_none()
            && self.sample.is_none()
            && self.hold.is_none()
    }

    /// Appends its commands to `pipe`, in the order [`Piggyback::take`] reads their replies.
    pub fn push(&self, pipe: &mut redis::Pipeline, keys: &Keys) {
        if !self.tweets.is_empty() {
            keys.pipe_mget(pipe, Object::Tweet, &self.tweets);
        }
        if !self.counts.is_empty() {
            pipe_counts(pipe, keys, &self.counts);
        }
        if !self.users.is_empty() {
            keys.pipe_mget(pipe, Object::User, &self.users);
        }
        if let Some((user, tweet_ids)) = self.liked {
            pipe_liked(pipe, keys, user, tweet_ids);
        }
        if let Some(user) = self.sample {
            pipe_liked_sample(pipe, keys, user, LIKED_SAMPLE);
        }
        if let Some(user) = self.hold {
            pipe_liked_sample(pipe, keys, user, HeldLikes::SAMPLE);
        }
    }

    /// Decodes the replies of [`Piggyback::push`]'s commands from `replies` (the read's own
    /// replies taken before them).
    ///
    /// # Errors
    /// A reply is missing or of another shape than its command's.
    pub fn take(
        &self,
        replies: &mut impl Iterator<Item = redis::Value>,
    ) -> Result<Taken, CacheUnavailable> {
        let mut next = |what: &'static str| {
            replies.next().ok_or_else(|| {
                tracing::warn!(what, "short pipeline reply");
                CacheUnavailable
            })
        };
        let mut taken = Taken::default();
        if !self.tweets.is_empty() {
            taken.tweets = strings(next("tweets")?)?;
        }
        if !self.counts.is_empty() {
            taken.counts = decode_counts(next("counts")?)?;
        }
        if !self.users.is_empty() {
            taken.users = strings(next("users")?)?;
        }
        if let Some((_, tweet_ids)) = self.liked {
            taken.liked = Some(decode_liked(tweet_ids, next("liked")?)?);
        }
        if self.sample.is_some() {
            taken.sample = Some(decode_sample(next("sample")?)?);
        }
        if self.hold.is_some() {
            taken.hold = Some(decode_sample(next("hold")?)?);
        }
        Ok(taken)
    }
}

fn strings(v: redis::Value) -> Result<Vec<Option<String>>, CacheUnavailable> {
    redis::from_redis_value::<Vec<Option<String>>>(v).map_err(|_| CacheUnavailable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// Each command of `pipe` as its words (command name and arguments).
    fn words(pipe: &redis::Pipeline) -> Vec<Vec<String>> {
        pipe.cmd_iter()
            .map(|c| {
                let packed = String::from_utf8_lossy(&c.get_packed_command()).into_owned();
                // RESP: `*n`, then `$len` and the word for each.
                packed
                    .split("\r\n")
                    .skip(2)
                    .step_by(2)
                    .map(str::to_owned)
                    .collect()
            })
            .filter(|w: &Vec<String>| !w.is_empty())
            .collect()
    }

    #[test]
    fn a_piggyback_pushes_what_it_asks_and_takes_the_replies_in_the_same_order() {
        let keys = Keys::new("t").expect("a valid prefix");
        let page = [30, 20];
        let ask = Piggyback {
            tweets: vec![30],
            counts: vec![30, 20],
            users: vec![7],
            liked: Some((9, &page)),
            sample: Some(9),
            hold: Some(8),
        };
        let mut pipe = redis::pipe();
        ask.push(&mut pipe, &keys);
        let (liked9, liked8) = (keys.liked(9), keys.liked(8));
        let (sample, hold) = (LIKED_SAMPLE.to_string(), HeldLikes::SAMPLE.to_string());
        let w = |words: &[&str]| -> Vec<String> { words.iter().map(|x| x.to_string()).collect() };
        let counts = |id| keys.object(Object::TweetCounts, id);
        let want = vec![
            w(&["MGET", &keys.tweet(30)]),
            w(&["MGET", &counts(30), &counts(20)]),
            w(&["MGET", &keys.object(Object::User, 7)]),
            w(&["SMISMEMBER", &liked9, "-1", "-2", "30", "20"]),
            w(&["SRANDMEMBER", &liked9, &sample]),
            w(&["SRANDMEMBER", &liked8, &hold]),
        ];
        assert_eq!(words(&pipe), want);
        let replies = vec![
            Value::Array(vec![bulk("tweet 30")]),
            Value::Array(vec![Value::Nil, Value::Nil]),
            Value::Array(vec![bulk("user 7")]),
            // the markers (cached, not too many), then the page's tweets
            Value::Array(vec![
                Value::Int(1),
                Value::Int(0),
                Value::Int(0),
                Value::Int(1),
            ]),
            Value::Array(vec![bulk("-1"), bulk("20")]),
            Value::Array(vec![bulk("-1")]),
        ];
        let taken = ask.take(&mut replies.into_iter()).expect("decodes");
        assert_eq!(taken.tweets, [Some("tweet 30".to_owned())]);
        assert_eq!(taken.counts, [None, None]);
        assert_eq!(taken.users, [Some("user 7".to_owned())]);
        assert_eq!(
            taken.liked,
            Some(LikedAmong::Liked([20].into_iter().collect()))
        );
        assert_eq!(taken.sample, Some(vec![-1, 20]));
        assert_eq!(taken.hold, Some(vec![-1]));

        // A short reply is an error, not a guess.
        let short = vec![Value::Array(vec![bulk("tweet 30")])];
        assert!(ask.take(&mut short.into_iter()).is_err());

        // Part of it: only what is asked is pushed, and taken in its place.
        let part = Piggyback {
            counts: vec![20],
            hold: Some(8),
            ..Piggyback::default()
        };
        let mut pipe = redis::pipe();
        part.push(&mut pipe, &keys);
        assert_eq!(
            words(&pipe),
            [
                w(&["MGET", &counts(20)]),
                w(&["SRANDMEMBER", &liked8, &hold])
            ]
        );
        let replies = vec![
            Value::Array(vec![bulk("5:0:1")]),
            Value::Array(vec![bulk("-1"), bulk("3")]),
        ];
        let taken = part.take(&mut replies.into_iter()).expect("decodes");
        assert_eq!(taken.counts.len(), 1);
        assert_eq!(taken.hold, Some(vec![-1, 3]));
        assert!(taken.tweets.is_empty() && taken.users.is_empty());
        assert!(taken.liked.is_none() && taken.sample.is_none());

        // Nothing asked: nothing pushed, nothing taken.
        let none = Piggyback::default();
        assert!(none.is_empty());
        let mut pipe = redis::pipe();
        none.push(&mut pipe, &keys);
        assert!(pipe.is_empty());
        let taken = none
            .take(&mut Vec::new().into_iter())
            .expect("nothing to decode");
        assert!(taken.counts.is_empty() && taken.hold.is_none());
    }
}
