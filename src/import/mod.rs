//! `chirp import`: loads a real follower graph and real tweets into a chirp database.
//!
//! Input: any SNAP-style edge list (`A B` per line, A follows B; e.g. SNAP's ego-Twitter
//! `twitter_combined.txt`) and any Twitter API v1.1 JSON-lines files, plain or gzipped.
//!
//! The mapping, deterministic for the same input:
//! - **Accounts**: one per graph node. The user id is the node id, the username `u{node id}`,
//!   the email `u{node id}@import.invalid`, and the password unusable (`!`: no login, no
//!   hashing). Duplicate edges and self-follows are dropped; friendship `created_at` is
//!   2012-01-01T00:00:00Z (the crawl's year) plus the edge's position in the file in µs.
//! - **Tweets** keep their Twitter id. Their authors are ranked by number of tweets (ties: lower
//!   author id first) and graph accounts by number of followers (ties: lower id first); the
//!   author of rank *i* becomes the account of rank *i* (modulo the number of accounts), so the
//!   most active authors get the most-followed accounts. Text is `extended_tweet.full_text`, else
//!   `full_text`, else `text`. `created_at` is parsed from Twitter's format and made unique, as
//!   chirp requires, by moving each tweet that collides to 1 µs after the one before it, in
//!   `(created_at, id)` order.
//! - **Replies** whose parent is in the data stay replies (`in_reply_to_tweet_id`,
//!   `in_reply_to_user_id`, their thread, the parents' `replies_count`: [`crate::replies`]);
//!   a reply to a tweet outside the data is a plain tweet.
//! - **Mentions** (`entities.user_mentions`, the extended tweet's when there is one) name the
//!   accounts of the mentioned users who are authors in the data, in order, once each, at most
//!   [`crate::mentions::MAX_MENTIONS`] ([`crate::mentions`]); the text keeps the original
//!   screen names, and nobody is notified.
//! - **Newsfeeds**: one row for every follower of every imported tweet's author (a reply only
//!   for followers who follow the replied-to account too), and one for the author, made with
//!   set-based SQL, so feeds are complete right after the import.
//! - **Lists** (`--circles`, SNAP ego-Twitter circles: `ego<TAB>circle name<TAB>member…`): each
//!   circle becomes a list named as in the file, owned by the ego's account, with its members;
//!   every list's timeline is filled with its members' tweets. Egos and members that are not
//!   accounts yet become accounts as graph nodes do. `--circles` works alone or with a graph.
//!
//! Everything is loaded with `COPY` into temporary staging tables and moved into the real
//! tables with `insert … select … on conflict do nothing`, in one transaction: a failed import
//! changes nothing, and importing the same data twice adds nothing. Malformed lines (bad edge,
//! unparsable JSON, tweet without id, author, date or text) are counted, reported with file and
//! line, and skipped.

mod load;
mod map;
mod read;
pub mod replay;
mod report;

use sqlx::PgPool;

use crate::config::ImportArgs;
use report::Phases;
pub use report::{Skipped, Summary};

/// Runs the import described by `args` against `db` (already migrated). See the module docs.
///
/// # Errors
/// A missing or unreadable file, an empty graph, or a database error; the database is then
/// left as it was.
pub async fn run(db: &PgPool, args: &ImportArgs) -> anyhow::Result<Summary> {
    if args.follows.is_none() && args.circles.is_none() {
        anyhow::bail!("nothing to import: give --follows and --tweets, or --circles, or both");
    }
    let mut phases = Phases::new();
    let mut summary = Summary::default();
    let graph = match &args.follows {
        Some(follows) => {
            let edges = phases.timed("read follows", || read::read_follows(follows))?;
            let (tweets, skipped_tweets, duplicate_tweets) =
                phases.timed("read tweets", || read::read_tweets(&args.tweets))?;
            summary.skipped_edges = edges.skipped.clone();
            summary.duplicate_edges = edges.duplicates;
            summary.self_follows = edges.self_follows;
            summary.skipped_tweets = skipped_tweets;
            summary.duplicate_tweets = duplicate_tweets;
            Some((edges, tweets))
        }
        None => None,
    };
    let circles = match &args.circles {
        Some(path) => Some(phases.timed("read circles", || read::read_circles(path))?),
        None => None,
    };

    let mut tx = db.begin().await?;
    let mut deferred = None;
    if args.reset {
        phases.start("reset");
        load::reset(&mut tx).await?;
        if graph.is_some() {
            deferred = Some(load::defer_indexes(&mut tx, &["friendships", "newsfeeds"]).await?);
        }
    }
    if let Some((edges, tweets)) = &graph {
        phases.start("map authors and times");
        let mapped = map::map(tweets, &edges.edges)?;
        summary.dropped_retweets = mapped.dropped_retweets;
        load::create_staging(&mut tx).await?;
        phases.start("load users");
        load::users(&mut tx, &mapped).await?;
        phases.start("load friendships");
        load::friendships(&mut tx, &mapped, &edges.edges).await?;
        phases.start("load tweets and replies");
        load::tweets_and_replies(&mut tx, &mapped).await?;
        phases.start("fan out newsfeeds");
        load::newsfeeds(&mut tx).await?;
    }
    if let Some(circles) = &circles {
        phases.start("load lists");
        load::lists(&mut tx, &circles.lists).await?;
        summary.skipped_circles = circles.skipped.clone();
        summary.duplicate_members = circles.duplicate_members;
    }
    phases.start("fill list timelines");
    load::list_feeds(&mut tx).await?;
    if let Some(deferred) = deferred {
        phases.start("build indexes");
        load::restore_indexes(&mut tx, deferred).await?;
    }
    phases.start("count");
    load::counts_and_sequences(&mut tx).await?;
    let mut tokens_written = 0;
    if let Some(path) = &args.tokens_out {
        phases.start("tokens");
        tokens_written = load::write_tokens(&mut tx, path, args.tokens).await?;
    }
    phases.start("commit");
    tx.commit().await?;
    phases.start("vacuum and analyze");
    load::vacuum_analyze(db).await?;
    summary.phases = phases.finish();
    summary.tables = load::table_counts(db).await?;
    summary.tokens_written = tokens_written;
    Ok(summary)
}
