//! `chirp replay`: posts real tweets, live, as imported accounts, through the same code path as
//! `POST /api/tweets/` ([`crate::tweets::create`]: the transaction, the outbox, the fan-out job,
//! the stream events), at a steady rate. For driving the streams (and any load test) with real
//! text, places and coordinates.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use sqlx::PgPool;
use tokio::sync::Semaphore;

use super::read::{self, InTweet};
use crate::cache::Cache;
use crate::config::ReplayArgs;
use crate::tweets::{self, NewTweet, validate_content};

/// What a replay did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Replayed {
    /// Tweets posted.
    pub posted: u64,
    /// Tweets that failed (logged).
    pub failed: u64,
    /// Wall time.
    pub elapsed: Duration,
}

impl std::fmt::Display for Replayed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        write!(
            f,
            "replayed {} tweets ({} failed) in {:.1} s: {:.1} tweets/s",
            self.posted,
            self.failed,
            secs,
            self.posted as f64 / secs
        )
    }
}

/// Authors ranked by tweets in the file → accounts ranked by followers, as `chirp import`
/// maps them (rank *i* → rank *i*, modulo the number of accounts).
async fn accounts_for(db: &PgPool, tweets: &[InTweet]) -> anyhow::Result<HashMap<i64, i64>> {
    let mut activity: HashMap<i64, u64> = HashMap::new();
    for t in tweets {
        *activity.entry(t.author).or_default() += 1;
    }
    let mut authors: Vec<(i64, u64)> = activity.into_iter().collect();
    authors.sort_unstable_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
    let accounts: Vec<i64> =
        sqlx::query_scalar("select id from users order by followers_count desc, id limit $1")
            .bind(authors.len() as i64)
            .fetch_all(db)
            .await
            .context("reading the accounts")?;
    if accounts.is_empty() {
        anyhow::bail!("no accounts: run `chirp import` first");
    }
    Ok(authors
        .iter()
        .enumerate()
        .map(|(i, (author, _))| (*author, accounts[i % accounts.len()]))
        .collect())
}

/// Replays `args.tweets` at `args.rate` tweets/s (at most `args.limit`, 0 for all), in file
/// order, each as a new tweet of the account its author maps to, with the tweet's text (cut to
/// 280 characters), place and coordinates. Up to 64 posts are in flight at once.
///
/// # Errors
/// An unreadable file, or no accounts in the database.
pub async fn run(
    db: &PgPool,
    cache: &Cache,
    pull: &crate::hybrid::PullPolicy,
    args: &ReplayArgs,
) -> anyhow::Result<Replayed> {
    let (tweets, skipped, _) = read::read_tweets(&args.tweets)?;
    if skipped.count > 0 {
        tracing::info!(skipped = skipped.count, "unusable tweet lines skipped");
    }
    let account_of = accounts_for(db, &tweets).await?;
    let total = match args.limit {
        0 => tweets.len(),
        n => n.min(tweets.len()),
    };
    let pb = ProgressBar::new(total as u64);
    pb.set_style(
        ProgressStyle::with_template("replay {bar:30} {pos}/{len} {per_sec} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let in_flight = Arc::new(Semaphore::new(64));
    let failed = Arc::new(AtomicU64::new(0));
    let interval = Duration::from_secs_f64(1.0 / args.rate.max(0.001));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, t) in tweets.into_iter().take(total).enumerate() {
        tokio::time::sleep_until((start + interval.mul_f64(i as f64)).into()).await;
        let Some(&author) = account_of.get(&t.author) else {
            continue;
        };
        let content: String = t.text.chars().take(tweets::MAX_CONTENT_CHARS).collect();
        let Ok(content) = validate_content(&content) else {
            failed.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let new = NewTweet {
            content,
            coordinates: t.coordinates,
            place: t.place,
            ..NewTweet::default()
        };
        let permit = in_flight.clone().acquire_owned().await?;
        let (db, cache, failed, pb) = (db.clone(), cache.clone(), failed.clone(), pb.clone());
        let pull = *pull;
        tasks.spawn(async move {
            // Its fan-out job is queued: wake the workers of `chirp serve` / `chirp worker`.
            let wake = || {
                let (cache, db) = (cache.clone(), db.clone());
                tokio::spawn(async move { crate::jobs::wake_others(&cache, &db, "").await });
            };
            if let Err(e) = tweets::create(&db, &cache, &pull, author, &new, wake).await {
                tracing::warn!(error = %e, "posting a replayed tweet failed");
                failed.fetch_add(1, Ordering::Relaxed);
            }
            pb.inc(1);
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    pb.finish();
    let failed = failed.load(Ordering::Relaxed);
    Ok(Replayed {
        posted: total as u64 - failed,
        failed,
        elapsed: start.elapsed(),
    })
}
