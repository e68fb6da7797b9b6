//! A `streaming/user` stream's place in its newsfeed ([`Cursor`], its token) and the
//! catch-up reads from Postgres (see the module docs of [`super`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;

use sqlx::PgPool;

use crate::cache::Cache;
use crate::newsfeeds;
use crate::time::{self, Timestamp};
use crate::timeline::{self, ListEntry};
use crate::tweets::Tweet;

use super::RECENT_MAX;

/// A `streaming/user` client's position in its newsfeed; its text form is the opaque resume
/// token (`Last-Event-ID`). See the module docs. Rows are placed by their entry times, which
/// their writers assign under the newsfeed's head lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// A row at the base (its id anchors the token's ids).
    base: i64,
    /// Every row of the newsfeed with an entry time (`created_at`, µs) up to this was
    /// delivered (or predates the stream): a catch-up reads the rows after it.
    base_at_us: i64,
    /// The newest entry time delivered (µs), or the base's: how old a token is.
    newest_us: i64,
    /// Rows delivered above the base: id → entry time (µs; [`UNKNOWN`] for those a token
    /// listed). At most [`RECENT_MAX`]: a full cursor settles before it takes another.
    delivered: BTreeMap<i64, i64>,
    /// Rows delivered that a catch-up then no longer found (deleted: an unfollow's unmerge),
    /// with their entry times (µs; for a row a token listed, the token's newest, which bounds
    /// it), newest last, at most [`GONE_KEPT`]. A fan-out batch that read such a row before its
    /// delete (it streams the rows it found there as well as those it inserted) may still
    /// publish it: it is not delivered twice, on this connection nor, since the token lists
    /// those above the base, on the client's next one.
    gone: VecDeque<(i64, i64)>,
}

/// How many forgotten rows a cursor remembers ([`Cursor::caught_up`]).
const GONE_KEPT: usize = 1024;

/// The entry time of a row a token listed (the token does not carry it): such a row stays
/// listed until its resume's catch-up has read the whole newsfeed.
const UNKNOWN: i64 = i64::MAX;

/// What a `Last-Event-ID` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    /// A token of this version: [`Cursor::token`].
    Current(Cursor),
    /// A token made before the cursor followed Postgres's order (`{base}.{floor µs}.{span}.{id
    /// − base}…`): rows up to `base`, rows that arrived (by a process's clock) before
    /// `floor_us` and `skip` were delivered. Read once, at the resume ([`legacy_catch_up`]).
    Legacy {
        base: i64,
        floor_us: i64,
        skip: Vec<i64>,
    },
}

impl Token {
    /// Parses a token made by [`Cursor::token`] (or by an earlier version); `None` if malformed.
    pub fn parse(token: &str) -> Option<Self> {
        let token = token.trim();
        if let Some(rest) = token.strip_prefix('n') {
            return Cursor::parse(rest).map(Token::Current);
        }
        let mut parts = token.split('.');
        let base: i64 = parts.next()?.parse().ok()?;
        let floor_us: i64 = parts.next()?.parse().ok()?;
        let span: i64 = parts.next()?.parse().ok()?;
        if base < 0 || span < 0 {
            return None;
        }
        let skip = deltas(base, parts)?;
        if skip.iter().any(|id| *id <= base) {
            return None;
        }
        Some(Token::Legacy {
            base,
            floor_us,
            skip,
        })
    }

    /// When it was made, near enough (µs): the newest entry it had delivered (a legacy token:
    /// its floor). A stream resumes from at most 30 days back.
    pub fn made_us(&self) -> i64 {
        match self {
            Token::Current(c) => c.newest_us,
            Token::Legacy { floor_us, .. } => *floor_us,
        }
    }
}

/// Ids written as `.{id − base}` (not 0) after a token's head; `None` if malformed or more
/// than [`RECENT_MAX`].
fn deltas<'a>(base: i64, parts: impl Iterator<Item = &'a str>) -> Option<Vec<i64>> {
    let mut ids = Vec::new();
    for p in parts.filter(|p| !p.is_empty()) {
        let delta: i64 = p.parse().ok()?;
        if delta == 0 || ids.len() >= RECENT_MAX {
            return None;
        }
        ids.push(base.checked_add(delta)?);
    }
    Some(ids)
}

impl Cursor {
    /// A cursor after the row `base` whose entry time is `base_at` (µs): a new stream starts
    /// after the newsfeed's newest entry, a row or a pulled tweet
    /// ([`crate::newsfeeds::newest_entry`]; `(0, 0)` when it has none), a `since=T` resume
    /// after T (`base` the newest row at or before it, `base_at` = T).
    pub fn after(base: i64, base_at_us: i64) -> Self {
        Cursor {
            base: base.max(0),
            base_at_us,
            newest_us: base_at_us,
            delivered: BTreeMap::new(),
            gone: VecDeque::new(),
        }
    }

    /// The cursor with `now_us` as the time its token was made, if later than its newest entry:
    /// a stream opened on a newsfeed that is empty, or whose newest entry is older than a
    /// resume may reach back, still gives a token that resumes (its first `id:`).
    pub fn made_at(mut self, now_us: i64) -> Self {
        self.newest_us = self.newest_us.max(now_us);
        self
    }

    /// Parses what follows the token's `n`: `{base}.{base_at µs}.{newest − base_at µs}.{id −
    /// base}…`.
    fn parse(token: &str) -> Option<Self> {
        let mut parts = token.split('.');
        let base: i64 = parts.next()?.parse().ok()?;
        let base_at_us: i64 = parts.next()?.parse().ok()?;
        let span: i64 = parts.next()?.parse().ok()?;
        if base < 0 || span < 0 {
            return None;
        }
        let delivered = deltas(base, parts)?
            .into_iter()
            .map(|id| (id, UNKNOWN))
            .collect();
        Some(Cursor {
            base,
            base_at_us,
            newest_us: base_at_us.checked_add(span)?,
            delivered,
            gone: VecDeque::new(),
        })
    }

    /// The resume token: `n{base}.{base_at µs}.{newest − base_at µs}.{id − base}…`, every
    /// delivered row above the base listed, forgotten ones too (at most [`RECENT_MAX`]).
    pub fn token(&self) -> String {
        let mut out = format!(
            "n{}.{}.{}",
            self.base,
            self.base_at_us,
            self.newest_us.saturating_sub(self.base_at_us)
        );
        for id in self.delivered.keys() {
            let _ = write!(out, ".{}", id - self.base);
        }
        // Forgotten rows above the base are delivered ones too, to a client that resumes
        // (newest first, as many as the token has room for).
        let room = RECENT_MAX.saturating_sub(self.delivered.len());
        let gone = (self.gone.iter().rev())
            .filter(|(id, at)| *at > self.base_at_us && *id != self.base)
            .filter(|(id, _)| !self.delivered.contains_key(id))
            .take(room);
        for (id, _) in gone {
            let _ = write!(out, ".{}", id - self.base);
        }
        out
    }

    /// Whether the row `id` with entry time `at_us` was delivered already (or was delivered,
    /// then deleted: [`Cursor::caught_up`]).
    pub fn seen(&self, id: i64, at_us: i64) -> bool {
        at_us <= self.base_at_us
            || self.delivered.contains_key(&id)
            || self.gone.iter().any(|(g, _)| *g == id)
    }

    /// Records the live delivery of row `id` whose entry time is `at_us`.
    pub fn advance(&mut self, id: i64, at_us: i64) {
        if at_us > self.base_at_us {
            self.delivered.insert(id, at_us);
            self.newest_us = self.newest_us.max(at_us);
        }
    }

    /// Whether [`RECENT_MAX`] rows wait above the base: settle before taking another.
    pub fn full(&self) -> bool {
        self.delivered.len() >= RECENT_MAX
    }

    /// The entry time (µs) a catch-up reads after: the base's.
    pub fn base_at_us(&self) -> i64 {
        self.base_at_us
    }

    /// Every entry of the newsfeed up to entry `id` (entry time `at_us`) has been delivered: a
    /// catch-up read it, in newsfeed order, after all the entries before it. It becomes the
    /// base (a pulled tweet's entry, whose id is negative, moves the base's time only: the
    /// token's ids stay anchored on a row's).
    pub fn settle(&mut self, id: i64, at_us: i64) {
        if at_us <= self.base_at_us {
            return;
        }
        if id >= 0 {
            self.base = id;
        }
        self.base_at_us = at_us;
        self.newest_us = self.newest_us.max(at_us);
        self.delivered.retain(|_, at| *at > at_us);
        // A row a token listed keeps an unknown time: settled, it lies at the base (and the
        // token could not list the base, `.0`).
        self.delivered.remove(&id);
        self.delivered.remove(&self.base);
    }

    /// A catch-up read the newsfeed to its end, and no live event came in between: every row
    /// delivered before had committed, so one it did not find again was deleted. The cursor
    /// forgets them as delivered rows and remembers the last [`GONE_KEPT`] of them as gone (its
    /// token lists those above the base), so that a late event of one is not delivered again.
    pub fn caught_up(&mut self) {
        for (id, at) in std::mem::take(&mut self.delivered) {
            if self.gone.len() == GONE_KEPT {
                self.gone.pop_front();
            }
            let at = if at == UNKNOWN { self.newest_us } else { at };
            self.gone.push_back((id, at));
        }
    }
}

/// Rows of a catch-up page.
#[derive(Debug, sqlx::FromRow)]
struct Arrival {
    id: i64,
    tweet_id: i64,
    author_id: i64,
    created_at: Timestamp,
}

/// Most rows one catch-up page reads.
pub const CATCH_UP_PAGE: usize = 100;

/// The next page of user `user_id`'s newsfeed after entry time `after_us`, in newsfeed order
/// (see the module docs): its rows and, if it follows any of the pull sources `authors`
/// ([`crate::hybrid`], as [`crate::hybrid::PullAuthors::current`] gives them), their pulled
/// tweets after the friendship's `visible_from`, as entries whose id is the tweet's negated
/// (as [`crate::newsfeeds::page`]'s): rows and pulled tweets commit in the order of their
/// times (the pull clock), so a catch-up reads them in one order too. A resume's or a
/// settle's catch-up. Entries `seen(id, entry µs)` (delivered already) are not sent but count
/// as read. Rows copied by `chirp import` (no `arrived_at`) are not streamed. Tweets are
/// hydrated through the cache-aside read path (objects from Redis, misses from Postgres);
/// entries of tweets deleted meanwhile are left out. Reads the primary key `(user_id,
/// created_at)`, and per followed pull source its pulled tweets' index.
///
/// # Errors
/// Postgres failed.
pub async fn catch_up_page(
    db: &PgPool,
    cache: &Cache,
    (user_id, authors): (i64, &[i64]),
    after_us: i64,
    seen: impl Fn(i64, i64) -> bool,
) -> sqlx::Result<CaughtUp> {
    let after = time::from_micros(after_us);
    let rows: Vec<Arrival> = if authors.is_empty() {
        sqlx::query_as(
            "select n.id, n.tweet_id, t.user_id as author_id, n.created_at
             from newsfeeds n join tweets t on t.id = n.tweet_id
             where n.user_id = $1 and n.created_at > $2 and n.arrived_at is not null
             order by n.created_at limit $3",
        )
        .bind(user_id)
        .bind(after)
        .bind(CATCH_UP_PAGE as i64)
        .fetch_all(db)
        .await?
    } else {
        sqlx::query_as(
            "(select n.id, n.tweet_id, t.user_id as author_id, n.created_at
              from newsfeeds n join tweets t on t.id = n.tweet_id
              where n.user_id = $1 and n.created_at > $2 and n.arrived_at is not null
              order by n.created_at limit $3)
             union all
             (select -t.id, t.id, t.user_id, t.created_at
              from friendships f
              cross join lateral (
                  select t.id, t.user_id, t.created_at from tweets t
                  where t.user_id = f.to_user_id and t.pulled
                    and t.created_at > coalesce(f.visible_from, '-infinity')
                    and t.created_at > $2
                  order by t.created_at limit $3) t
              where f.from_user_id = $1 and f.to_user_id = any($4))
             order by created_at limit $3",
        )
        .bind(user_id)
        .bind(after)
        .bind(CATCH_UP_PAGE as i64)
        .bind(authors)
        .fetch_all(db)
        .await?
    };
    let last = rows.last().map(|r| (r.id, time::to_micros(r.created_at)));
    let more = rows.len() == CATCH_UP_PAGE;
    let unseen = rows
        .into_iter()
        .filter(|r| !seen(r.id, time::to_micros(r.created_at)))
        .collect();
    Ok(CaughtUp {
        tweets: hydrate(db, cache, user_id, unseen).await?,
        last,
        more,
    })
}

/// A page of [`catch_up_page`].
#[derive(Debug)]
pub struct CaughtUp {
    /// The tweets to send, each with its `(newsfeed row id, entry µs)`.
    pub tweets: Vec<(Tweet, i64, i64)>,
    /// The last row read, `(id, entry µs)`; `None`: nothing was left to read.
    pub last: Option<(i64, i64)>,
    /// The page was full: more rows may follow.
    pub more: bool,
}

/// The next page of the rows a token of the earlier version ([`Token::Legacy`]) missed: rows
/// after `base` that arrived after `floor_us` and are not in `skip`, after `after` (the
/// `(arrived_at µs, id)` of the previous page's last row), in arrival order. Read once, when
/// such a stream resumes; the second value is where the next page starts (`None`: the last).
///
/// # Errors
/// Postgres failed.
pub async fn legacy_catch_up(
    db: &PgPool,
    cache: &Cache,
    user_id: i64,
    (base, floor_us, skip): (i64, i64, &[i64]),
    after: Option<(i64, i64)>,
) -> sqlx::Result<(Vec<(Tweet, i64, i64)>, Option<(i64, i64)>)> {
    let (after_at, after_id) = after.unwrap_or((floor_us, 0));
    let rows: Vec<(i64, i64, i64, Timestamp, Timestamp)> = sqlx::query_as(
        "select n.id, n.tweet_id, t.user_id, n.created_at, n.arrived_at
         from newsfeeds n join tweets t on t.id = n.tweet_id
         where n.user_id = $1 and n.arrived_at > $2 and n.id > $3 and n.id <> all($4)
           and (n.arrived_at, n.id) > ($5, $6)
         order by n.arrived_at, n.id limit $7",
    )
    .bind(user_id)
    .bind(time::from_micros(floor_us))
    .bind(base)
    .bind(skip)
    .bind(time::from_micros(after_at))
    .bind(after_id)
    .bind(CATCH_UP_PAGE as i64)
    .fetch_all(db)
    .await?;
    let next = (rows.len() == CATCH_UP_PAGE)
        .then(|| rows.last().map(|r| (time::to_micros(r.4), r.0)))
        .flatten();
    let rows = rows
        .into_iter()
        .map(|(id, tweet_id, author_id, created_at, _)| Arrival {
            id,
            tweet_id,
            author_id,
            created_at,
        })
        .collect();
    Ok((hydrate(db, cache, user_id, rows).await?, next))
}

/// `rows` as tweets of `user_id`'s newsfeed (in their order), each with its `(row id, entry
/// µs)`; deleted tweets (and retweets of deleted tweets) are left out.
async fn hydrate(
    db: &PgPool,
    cache: &Cache,
    user_id: i64,
    rows: Vec<Arrival>,
) -> sqlx::Result<Vec<(Tweet, i64, i64)>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let entries: Vec<ListEntry> = rows
        .iter()
        .map(|r| ListEntry {
            id: r.id,
            tweet_id: r.tweet_id,
            author_id: r.author_id,
            created_at: r.created_at,
            shift: 0,
        })
        .collect();
    let order: HashMap<i64, usize> = rows.iter().enumerate().map(|(i, r)| (r.id, i)).collect();
    let items = match timeline::hydrate_entries(db, cache, &entries, Some(user_id)).await? {
        Some(items) => items,
        None => {
            // Rows by their times, pulled tweets (negative ids) by their ids.
            let (pulled, rows_of): (Vec<&Arrival>, Vec<&Arrival>) =
                rows.iter().partition(|r| r.id < 0);
            let at: Vec<Timestamp> = rows_of.iter().map(|r| r.created_at).collect();
            let mut joined = newsfeeds::rows_at(db, user_id, &at).await?;
            let pulled: Vec<i64> = pulled.iter().map(|r| r.tweet_id).collect();
            joined.extend(newsfeeds::pulled_at(db, &pulled).await?);
            joined.sort_by_key(|r| order.get(&r.entry_id).copied().unwrap_or(usize::MAX));
            timeline::with_likes(db, cache, joined, Some(user_id)).await?
        }
    };
    // Retweets with their retweeted tweets (a retweet whose tweet is gone is left out).
    let items = crate::tweets::complete_page(db, cache, Some(user_id), items).await?;
    let entry_at: HashMap<i64, i64> = rows
        .iter()
        .map(|r| (r.id, time::to_micros(r.created_at)))
        .collect();
    Ok(items
        .into_iter()
        .filter(|item| !crate::retweets::is_orphan(item))
        .filter_map(|item| {
            let at = *entry_at.get(&item.id)?;
            let id = item.id;
            Some((Tweet::from_item(item)?, id, at))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_round_trips_and_lists_the_rows_above_its_base() {
        let mut c = Cursor::after(4, 10_000_000);
        c.advance(7, 10_000_002);
        c.advance(5, 10_000_001);
        c.advance(3, 9_000_000); // at or below the base: seen
        assert!(c.seen(3, 9_000_000));
        let t = c.token();
        assert_eq!(t, "n4.10000000.2.1.3");
        let Some(Token::Current(back)) = Token::parse(&t) else {
            panic!("parses")
        };
        assert!(back.seen(5, 0) && back.seen(7, 0) && !back.seen(6, 10_000_003));
        assert_eq!(back.token(), t);
        assert_eq!(back.newest_us, 10_000_002, "how old it is travels with it");
        for bad in [
            "nx.1.0", "n3.1", "n3.1.-1", "n3.1.0.0", "x.1.0", "3.1", "3.1.0.0",
        ] {
            assert_eq!(Token::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_settle_moves_the_base_and_keeps_what_came_after() {
        let mut c = Cursor::after(0, 0);
        c.advance(12, 2_000);
        c.advance(10, 1_000);
        c.advance(20, 3_000);
        // A settle's page read rows up to 12: 11 (never delivered) was sent by it.
        c.settle(12, 2_000);
        assert!(c.seen(11, 1_500) && c.seen(12, 2_000) && c.seen(20, 3_000));
        assert!(!c.seen(21, 3_500));
        assert_eq!(c.token(), "n12.2000.1000.8");
        // An older row never moves it back.
        c.settle(5, 500);
        assert_eq!(c.token(), "n12.2000.1000.8");
        // A full read found nothing more: 20 was deleted. It was delivered all the same: the
        // token keeps it while it lies above the base.
        c.caught_up();
        assert_eq!(c.token(), "n12.2000.1000.8");
        assert!(c.seen(20, 3_000));
    }

    /// What the history checker's seed 18216501852272590224 showed (row 64604 delivered
    /// live twice, 533 ms apart, with a catch-up that read past the base without it in
    /// between), as far as the record tells: the row was delivered, an unfollow's unmerge
    /// deleted it, a catch-up read to the end without it and forgot it, and a fan-out batch
    /// that had found the row before the delete published it again.
    #[test]
    fn a_row_forgotten_as_deleted_is_not_delivered_again_when_a_late_event_comes() {
        let mut c = Cursor::after(10, 1_000);
        c.advance(20, 3_000);
        c.settle(12, 2_000);
        c.caught_up(); // 20 was deleted
        assert!(c.seen(20, 3_000), "its late event is not delivered again");
        assert!(!c.seen(21, 3_100));
        // Nor on the client's next connection: the token lists it while it is above the base.
        assert_eq!(c.token(), "n12.2000.1000.8");
        let Some(Token::Current(mut next)) = Token::parse(&c.token()) else {
            panic!("the token parses");
        };
        assert!(
            next.seen(20, 3_000),
            "a new connection does not deliver it again"
        );
        assert!(!next.seen(21, 3_100));
        // That connection's catch-up does not find it either: it stays known (its time now
        // the token's newest) until the base passes it.
        next.caught_up();
        assert!(next.seen(20, 3_000));
        assert_eq!(next.token(), "n12.2000.1000.8");
        next.settle(30, 3_500);
        assert_eq!(
            next.token(),
            "n30.3500.0",
            "below the base: no longer listed"
        );
    }

    /// Pulled tweets are entries with the tweet's id negated ([`crate::hybrid`]): they travel
    /// in the token beside rows, and a settle on one keeps the token's anchor a row's id.
    #[test]
    fn pulled_entries_round_trip_in_the_token_and_settle_the_base_time() {
        let mut c = Cursor::after(40, 1_000);
        c.advance(-7, 1_100); // tweet 7, pulled
        c.advance(41, 1_200);
        let t = c.token();
        assert_eq!(t, "n40.1000.200.-47.1");
        let Some(Token::Current(back)) = Token::parse(&t) else {
            panic!("parses")
        };
        assert!(back.seen(-7, 0) && back.seen(41, 0) && !back.seen(-8, 1_300));
        c.settle(-7, 1_100);
        assert_eq!(c.token(), "n40.1100.100.1", "anchored on row 40 still");
        assert!(Token::parse(&c.token()).is_some());
        c.settle(-9, 1_300); // a pulled tweet newer than every row delivered
        assert_eq!(c.token(), "n40.1300.0");
        assert!(c.seen(41, 1_200) && !c.seen(-10, 1_400));
    }

    /// Review of the pulled streams, finding 1: a resume's catch-up settles on a row its token
    /// listed, then on a pulled tweet (which keeps the base's id): the token listed the base
    /// itself, as `.0`, which no longer parsed.
    #[test]
    fn a_token_never_lists_its_base() {
        let Some(Token::Current(mut c)) = Token::parse("n10.1000.600.2.5") else {
            panic!("parses")
        };
        c.settle(12, 1_200);
        c.settle(-7, 1_300);
        let t = c.token();
        assert!(Token::parse(&t).is_some(), "{t} parses");
        assert!(c.seen(12, 1_200) && c.seen(-7, 1_300) && c.seen(15, 0));
    }

    #[test]
    fn a_full_cursor_asks_for_a_settle_and_its_token_still_parses() {
        let mut c = Cursor::after(0, 0);
        for k in 1..=RECENT_MAX as i64 {
            c.advance(2 * k, k);
        }
        assert!(c.full());
        assert!(Token::parse(&c.token()).is_some(), "its token still parses");
        c.settle(2 * RECENT_MAX as i64, RECENT_MAX as i64);
        assert!(!c.full());
    }

    #[test]
    fn a_resumed_tokens_rows_stay_listed_until_its_catch_up_is_over() {
        let Some(Token::Current(mut c)) = Token::parse("n10.1000.600.2.5") else {
            panic!("parses")
        };
        // The catch-up's page reads rows 11 (sent) and 12 (listed: seen, not sent).
        assert!(!c.seen(11, 1_100) && c.seen(12, 1_200));
        c.settle(11, 1_100);
        assert!(c.seen(12, 1_200) && c.seen(15, 1_500), "still listed");
        c.settle(12, 1_200);
        c.caught_up(); // nothing more: 15 was deleted
        assert!(!c.seen(16, 1_600));
    }

    #[test]
    fn an_earlier_token_is_read_as_one() {
        assert_eq!(
            Token::parse("10.1000.5.2.10"),
            Some(Token::Legacy {
                base: 10,
                floor_us: 1000,
                skip: vec![12, 20],
            })
        );
    }
}
