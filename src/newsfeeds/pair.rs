//! A friendship's newsfeed rows: the (newsfeed, followee) [`Pair`] whose steps a follow's
//! backfill and an unfollow's unmerge run ([`crate::fanout`]), and the bulk fill of
//! `chirp import` ([`fill_from_friendships`]).

use sqlx::PgConnection;

use crate::fanout::{self, Pair};
use crate::jobs::Worker;
use crate::timeline::Timeline;

/// The followee's tweets a follow's backfill copies (`$1` the follower, `$2` the followee, `$3`
/// how many), locked `for key share`: its newest, but pulled ones after the friendship's
/// `visible_from` and replies that do not reach the follower ([`crate::reply_reaches`]).
macro_rules! backfill_source {
    () => {
        concat!(
            "select id, created_at, retweeted_tweet_id from tweets t where user_id = $2
               and (not pulled or created_at <= (
                   select coalesce(visible_from, '-infinity') from friendships
                   where from_user_id = $1 and to_user_id = $2))
               and ",
            crate::reply_reaches!("t", "$1"),
            " order by created_at desc limit $3 for key share"
        )
    };
}

/// The friendship's row (`$1` follows `$2`): the pair exists while it does. Both the check
/// and the unmerge's delete ask it ([`Pair::remove`]).
macro_rules! friendship_row {
    () => {
        "select 1 from friendships where from_user_id = $1 and to_user_id = $2"
    };
}

/// The (newsfeed, followee) pair of a friendship, for [`fanout::backfill`] and
/// [`fanout::unmerge`].
fn friendship(follower: i64, followee: i64) -> Pair {
    Pair {
        timeline: Timeline::Newsfeed(follower),
        owner: follower,
        source: followee,
        lock: "newsfeed-pair",
        pull_clock: true,
        exists: concat!("select exists (", friendship_row!(), ")"),
        // Tweet rows before the head, the order of every writer (an undo holds its retweet's
        // row and then waits for its readers' heads): the copy's rows, locked first.
        lock_source: Some(backfill_source!()),
        // Takes the follower's head lock (see [`stamp`]) before the copy reads the newsfeed.
        head: Some(
            "insert into feed_heads as h (user_id, head) values ($1, '-infinity')
             on conflict (user_id) do update set head = h.head
             returning nullif(head, '-infinity')",
        ),
        // Locks the tweets it copies (newsfeeds have no foreign keys): a concurrent delete is
        // waited for, and its tweet skipped. Pulled tweets after the friendship's
        // `visible_from` are the reader's to pull (crate::hybrid), not copied. Tweets whose
        // status the newsfeed has already are skipped (the unique status index); the rest
        // are stamped above the head and the newest pulled tweet in their own order
        // (`greatest` of increasing sequences), and the head moves.
        copy: concat!(
            "with x as (",
            backfill_source!(),
            "),
               -- A status the newsfeed shows already (by itself or a retweet) is skipped,
               -- and of two entries of one status here the older is copied (crate::retweets).
               y as (
                   select distinct on (coalesce(retweeted_tweet_id, id)) id, created_at,
                          retweeted_tweet_id
                   from x
                   where not exists (
                       select 1 from newsfeeds n
                       where n.user_id = $1
                         and coalesce(n.status_id, n.tweet_id) = coalesce(x.retweeted_tweet_id, x.id))
                     -- nor a retweet of a tweet the follower pulls (crate::hybrid)
                     and not ",
            crate::pulls_tweet!("x.retweeted_tweet_id", "$1"),
            "
                   order by coalesce(retweeted_tweet_id, id), created_at),
               t as (
                   select id, created_at, retweeted_tweet_id,
                          row_number() over (order by created_at) as r
                   from y),
               ins as (
                   insert into newsfeeds (user_id, tweet_id, status_id, created_at, arrived_at)
                   select $1, t.id, t.retweeted_tweet_id,
                          greatest(t.created_at,
                                   (select head from feed_heads where user_id = $1)
                                       + t.r * interval '1 microsecond',
                                   (select at from pull_clock) + t.r * interval '1 microsecond'),
                          clock_timestamp()
                   from t order by t.r
                   returning id, tweet_id, created_at),
               up as (
                   update feed_heads set prev = nullif(head, '-infinity'),
                                         head = greatest(head, (select max(created_at) from ins))
                   where user_id = $1 and exists (select 1 from ins))
               select ins.id, ins.tweet_id, $2::bigint as author_id, ins.created_at,
                      (extract(epoch from ins.created_at - t.created_at) * 1000000)::bigint as shift
               from ins join t on t.id = ins.tweet_id"
        ),
        remove: concat!(
            "delete from newsfeeds n using tweets t
             where n.user_id = $1 and t.user_id = $2 and n.tweet_id = t.id
               and not exists (",
            friendship_row!(),
            ")
             returning n.id, n.tweet_id, t.user_id as author_id, n.created_at,",
            shift_column!()
        ),
        // A retweet's status, or a tweet that someone else retweeted: another followee may
        // bring it (crate::retweets::reveal decides); in id order, the order of their locks.
        reveals: Some(
            "select distinct coalesce(n.status_id, n.tweet_id) as s
             from newsfeeds n join tweets t on t.id = n.tweet_id
             where n.user_id = $1 and t.user_id = $2
               and (n.status_id is not null
                    or exists (select 1 from tweets r
                               where r.retweeted_tweet_id = n.tweet_id and r.user_id <> $2))
             order by 1",
        ),
    }
}

/// Follow backfill: if the friendship still exists, copies the followee's newest
/// `backfill_limit` tweets into the follower's newsfeed and merges them into the cached list.
///
/// # Errors
/// Postgres failed; the job is retried.
#[tracing::instrument(name = "newsfeeds::backfill", skip(worker))]
pub async fn backfill(worker: &Worker, follower: i64, followee: i64) -> anyhow::Result<()> {
    fanout::backfill(worker, &friendship(follower, followee)).await
}

/// Unfollow unmerge: unless the follower follows again by now, removes the followee's tweets
/// from the follower's newsfeed and from the cached list.
///
/// # Errors
/// Postgres failed; the job is retried.
#[tracing::instrument(name = "newsfeeds::unmerge", skip(worker))]
pub async fn unmerge(worker: &Worker, follower: i64, followee: i64) -> anyhow::Result<()> {
    fanout::unmerge(worker, &friendship(follower, followee)).await
}

/// Fans out the tweets staged in `import_tweets` (the temporary table `chirp import` fills
/// inside its transaction, so call this on that transaction's connection): one newsfeed row
/// for every follower of each staged tweet's author, as `friendships` says, and one for the
/// author, at the tweet's `created_at` (a reply only to the followers who follow the replied-to
/// user too: [`crate::replies`]). Rows already there are left alone, and so is a status a
/// reader's newsfeed has: of a tweet and its retweets the oldest entry is written
/// ([`crate::retweets`]). Imported rows have
/// no `arrived_at`: they are not late for anyone's refresh. Returns how many rows were added.
pub async fn fill_from_friendships(conn: &mut PgConnection) -> sqlx::Result<u64> {
    // Tweets first: a reader gets each once (self-follows are not imported). The reply rule
    // ([`crate::reply_reaches`]) as a join: `--reset` loads without the friendships' indexes,
    // and its correlated `exists` scanned all of them once per (reply, follower) pair (the
    // import of the shared data ran for minutes in this statement instead of seconds).
    let tweets = sqlx::query(
        "insert into newsfeeds (user_id, tweet_id, created_at, arrived_at)
         select f.from_user_id, t.id, t.created_at, null::timestamptz
         from import_tweets i join tweets t on t.id = i.id join friendships f on f.to_user_id = t.user_id
         left join friendships rr on rr.from_user_id = f.from_user_id
                                 and rr.to_user_id = t.in_reply_to_user_id
         where t.retweeted_tweet_id is null
           and (t.in_reply_to_user_id is null or t.in_reply_to_user_id = t.user_id
                or t.in_reply_to_user_id = f.from_user_id or rr.from_user_id is not null)
         union all
         select t.user_id, t.id, t.created_at, null from import_tweets i join tweets t on t.id = i.id
         where t.retweeted_tweet_id is null
         on conflict do nothing",
    )
    .execute(&mut *conn)
    .await?;
    // Then retweets, each reader's oldest of a status it does not show yet. Explicit, not by
    // the unique index alone: `--reset` drops the indexes during the load.
    let retweets = sqlx::query(
        "with x as (
             select f.from_user_id as r, t.id as t, t.retweeted_tweet_id as s, t.created_at as at
             from import_tweets i join tweets t on t.id = i.id
             join friendships f on f.to_user_id = t.user_id
             where t.retweeted_tweet_id is not null
             union all
             select t.user_id, t.id, t.retweeted_tweet_id, t.created_at
             from import_tweets i join tweets t on t.id = i.id
             where t.retweeted_tweet_id is not null),
         -- Rows of those statuses already there: one scan with a hashed filter (no index is
         -- needed, and `--reset` has none), joined below instead of probed per pair.
         had as (
             select n.user_id, coalesce(n.status_id, n.tweet_id) as s from newsfeeds n
             where coalesce(n.status_id, n.tweet_id) in (select s from x))
         insert into newsfeeds (user_id, tweet_id, status_id, created_at, arrived_at)
         select distinct on (x.r, x.s) x.r, x.t, x.s, x.at, null::timestamptz
         from x left join had on had.user_id = x.r and had.s = x.s
         where had.user_id is null
         order by x.r, x.s, x.at
         on conflict do nothing",
    )
    .execute(&mut *conn)
    .await?;
    let added = tweets.rows_affected() + retweets.rows_affected();
    // The readers' heads (see [`stamp`]) move up to the newest entry they got.
    sqlx::query(
        "insert into feed_heads as h (user_id, head)
         select n.user_id, max(n.created_at) from newsfeeds n
         where n.user_id in (select f.from_user_id from import_tweets i join tweets t on t.id = i.id
                             join friendships f on f.to_user_id = t.user_id
                             union select t.user_id from import_tweets i join tweets t on t.id = i.id)
         group by n.user_id
         on conflict (user_id) do update set head = greatest(h.head, excluded.head)",
    )
    .execute(conn)
    .await?;
    Ok(added)
}
