//! Mapping what was read to chirp's rows: authors to accounts, replies to the tweets they answer
//! (with the root of their chain, their thread), and unique times. Pure: no I/O.

use std::collections::{HashMap, HashSet};

use anyhow::{Context, bail};
use chrono::{TimeZone, Utc};

use super::read::InTweet;
use crate::model::Place;
use crate::time::Timestamp;

/// Author → account: authors by tweets desc, accounts by followers desc; rank i → rank i.
fn assign_accounts(tweets: &[InTweet], edges: &[(i64, i64)]) -> anyhow::Result<HashMap<i64, i64>> {
    let mut followers: HashMap<i64, u64> = HashMap::new();
    for (a, b) in edges {
        followers.entry(*a).or_default();
        *followers.entry(*b).or_default() += 1;
    }
    if followers.is_empty() {
        bail!("the follows file has no edges: there are no accounts to give tweets to");
    }
    let mut accounts: Vec<(i64, u64)> = followers.into_iter().collect();
    accounts.sort_unstable_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
    let mut activity: HashMap<i64, u64> = HashMap::new();
    for t in tweets {
        *activity.entry(t.author).or_default() += 1;
    }
    let mut authors: Vec<(i64, u64)> = activity.into_iter().collect();
    authors.sort_unstable_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
    Ok(authors
        .iter()
        .enumerate()
        .map(|(i, (author, _))| (*author, accounts[i % accounts.len()].0))
        .collect())
}

/// Makes timestamps unique: in `(created_at, id)` order, each one not after the one before
/// moves to 1 µs after it.
fn unique_times(items: &mut [(i64, Timestamp)]) {
    items.sort_unstable_by(|x, y| x.1.cmp(&y.1).then(x.0.cmp(&y.0)));
    let mut last: Option<Timestamp> = None;
    for item in items.iter_mut() {
        if let Some(prev) = last
            && item.1 <= prev
        {
            item.1 = prev + chrono::Duration::microseconds(1);
        }
        last = Some(item.1);
    }
}

/// One row of `tweets`.
pub(super) struct Post<'a> {
    pub(super) id: i64,
    pub(super) user_id: i64,
    pub(super) content: &'a str,
    pub(super) created_at: Timestamp,
    /// `[lon, lat]`, if it has coordinates.
    pub(super) coordinates: Option<[f64; 2]>,
    /// Where it was posted, if it names a place.
    pub(super) place: Option<&'a Place>,
    /// The tweet it retweets (then `content` is empty, as a retweet posted through the API).
    pub(super) retweeted_tweet_id: Option<i64>,
    /// The accounts it mentions: those of its mentioned users who are authors in the data,
    /// in order, once each, at most [`crate::mentions::MAX_MENTIONS`] (none for a retweet).
    pub(super) mentioned_user_ids: Vec<i64>,
}

/// What the import writes, derived from what was read. The rows are made as they are
/// iterated, so they are never all in memory at once.
pub(super) struct Mapped<'a> {
    /// Every graph node once, ascending: the accounts.
    pub(super) nodes: Vec<i64>,
    /// The time of the first friendship; the edge at position i is i µs later.
    crawl: Timestamp,
    /// Tweet author → account.
    account_of: HashMap<i64, i64>,
    /// Reply → the tweet it replies to, for replies whose parent is in the data.
    parent: HashMap<i64, i64>,
    /// Retweet → the tweet it retweets (in the data: embedded originals are read too).
    retweeted: HashMap<i64, i64>,
    /// Retweets left out: a second retweet of one tweet by one account (two authors of the
    /// data may share an account), or a retweet of a retweet.
    pub(super) dropped_retweets: usize,
    by_id: HashMap<i64, &'a InTweet>,
    /// `(id, unique created_at)` of the tweets (replies included), in time order.
    tweet_times: Vec<(i64, Timestamp)>,
}

/// Maps the tweets and follower graph as read (see the module docs of `import`).
///
/// # Errors
/// A graph without edges: there are no accounts to give the tweets to.
pub(super) fn map<'a>(tweets: &'a [InTweet], edges: &[(i64, i64)]) -> anyhow::Result<Mapped<'a>> {
    let account_of = assign_accounts(tweets, edges)?;
    let ids: HashSet<i64> = tweets.iter().map(|t| t.id).collect();
    let parent: HashMap<i64, i64> = tweets
        .iter()
        .filter_map(|t| Some((t.id, t.reply_to.filter(|p| ids.contains(p) && *p != t.id)?)))
        .collect();
    let mut tweet_times: Vec<(i64, Timestamp)> =
        tweets.iter().map(|t| (t.id, t.created_at)).collect();
    unique_times(&mut tweet_times);
    // Retweets in time order: an account's first retweet of a tweet stays (one per account
    // and tweet, as the API allows), and retweets of retweets go (v1.1 names the original).
    let by_id: HashMap<i64, &InTweet> = tweets.iter().map(|t| (t.id, t)).collect();
    let (mut retweeted, mut seen, mut dropped) = (HashMap::new(), HashSet::new(), HashSet::new());
    for (id, _) in &tweet_times {
        let Some(t) = by_id.get(id) else { continue };
        let Some(original) = t.retweet_of.filter(|o| ids.contains(o) && o != id) else {
            continue;
        };
        let by_retweet = by_id.get(&original).is_some_and(|o| o.retweet_of.is_some());
        let account = account_of.get(&t.author).copied();
        if by_retweet || !seen.insert((account, original)) {
            dropped.insert(*id);
        } else {
            retweeted.insert(*id, original);
        }
    }
    tweet_times.retain(|(id, _)| !dropped.contains(id));
    let crawl = Utc
        .with_ymd_and_hms(2012, 1, 1, 0, 0, 0)
        .single()
        .context("crawl date")?;
    let mut nodes: Vec<i64> = edges.iter().flat_map(|(a, b)| [*a, *b]).collect();
    nodes.sort_unstable();
    nodes.dedup();
    Ok(Mapped {
        nodes,
        crawl,
        account_of,
        parent,
        retweeted,
        dropped_retweets: dropped.len(),
        by_id,
        tweet_times,
    })
}

impl<'a> Mapped<'a> {
    /// `(follower, followed, created_at)` for each edge, in file order.
    pub(super) fn friendships<'e>(
        &self,
        edges: &'e [(i64, i64)],
    ) -> impl Iterator<Item = (i64, i64, Timestamp)> + 'e {
        let crawl = self.crawl;
        edges
            .iter()
            .enumerate()
            .map(move |(i, (a, b))| (*a, *b, crawl + chrono::Duration::microseconds(i as i64)))
    }

    /// The tweets' rows, replies included.
    pub(super) fn tweets(&self) -> impl Iterator<Item = Post<'a>> + '_ {
        self.tweet_times
            .iter()
            .filter_map(|(id, at)| self.post(*id, *at))
    }

    /// `(reply, the tweet it answers, its thread's root)` of each reply whose parent is in the
    /// data (a reply to a tweet outside it is a plain tweet, as the parent is unknown).
    pub(super) fn replies(&self) -> impl Iterator<Item = (i64, i64, i64)> + '_ {
        self.parent
            .iter()
            .map(|(reply, parent)| (*reply, *parent, self.root_of(*reply)))
    }

    fn post(&self, id: i64, created_at: Timestamp) -> Option<Post<'a>> {
        let t = self.by_id.get(&id)?;
        let user_id = *self.account_of.get(&t.author)?;
        let retweeted_tweet_id = self.retweeted.get(&id).copied();
        let mut mentioned_user_ids: Vec<i64> = Vec::new();
        for account in (t.mentions.iter()).filter_map(|m| self.account_of.get(m)) {
            if retweeted_tweet_id.is_none()
                && !mentioned_user_ids.contains(account)
                && mentioned_user_ids.len() < crate::mentions::MAX_MENTIONS
            {
                mentioned_user_ids.push(*account);
            }
        }
        Some(Post {
            mentioned_user_ids,
            id,
            user_id,
            content: if retweeted_tweet_id.is_some() {
                ""
            } else {
                &t.text
            },
            retweeted_tweet_id,
            created_at,
            coordinates: t.coordinates,
            place: t.place.as_ref(),
        })
    }

    /// The first tweet of a reply's chain within the data.
    fn root_of(&self, mut id: i64) -> i64 {
        for _ in 0..1000 {
            match self.parent.get(&id) {
                Some(p) => id = *p,
                None => break,
            }
        }
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import::read::parse_twitter_time;

    #[test]
    fn equal_times_become_unique_in_id_order() {
        let t = parse_twitter_time("Wed Nov 09 06:57:54 +0000 2016").unwrap();
        let mut items = vec![(3, t), (1, t), (2, t + chrono::Duration::microseconds(1))];
        unique_times(&mut items);
        let micros: Vec<(i64, i64)> = items
            .iter()
            .map(|(id, at)| (*id, (*at - t).num_microseconds().unwrap()))
            .collect();
        // 1 and 3 share a time: 3 moves to +1 µs, which pushes 2 (at +1 µs) to +2 µs.
        assert_eq!(micros, vec![(1, 0), (3, 1), (2, 2)]);
    }
}
