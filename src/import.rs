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
//! - **Replies** whose parent is in the data become comments on it (on the root tweet of a reply
//!   chain), keeping their id; other replies are tweets.
//! - **Newsfeeds**: one row for every follower of every imported tweet's author, and one for the
//!   author, made with set-based SQL, so feeds are complete right after the import.
//!
//! Everything is loaded with `COPY` into temporary staging tables and moved into the real
//! tables with `insert … select … on conflict do nothing`, in one transaction: a failed import
//! changes nothing, and importing the same data twice adds nothing. Malformed lines (bad edge,
//! unparsable JSON, tweet without id, author, date or text) are counted, reported with file and
//! line, and skipped.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write as _};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::{DateTime, TimeZone, Utc};
use flate2::read::MultiGzDecoder;
use indicatif::{ProgressBar, ProgressStyle};
use rand::seq::SliceRandom;
use rand::{RngCore, SeedableRng};
use serde::Deserialize;
use sqlx::{PgConnection, PgPool};

use crate::accounts;
use crate::config::ImportArgs;
use crate::time::Timestamp;

/// How many examples of skipped lines the summary shows per file.
const EXAMPLES: usize = 5;

/// What was skipped while reading, with a few examples (`file:line: reason`).
#[derive(Debug, Default)]
pub struct Skipped {
    pub count: usize,
    pub examples: Vec<String>,
}

impl Skipped {
    fn add(&mut self, path: &Path, line: usize, reason: impl std::fmt::Display) {
        self.count += 1;
        if self.examples.len() < EXAMPLES {
            self.examples
                .push(format!("{}:{line}: {reason}", path.display()));
        }
    }
}

/// What an import did.
#[derive(Debug, Default)]
pub struct Summary {
    /// `(phase, seconds)` in order.
    pub phases: Vec<(String, f64)>,
    /// `(table, rows after the import)`.
    pub tables: Vec<(String, i64)>,
    pub skipped_edges: Skipped,
    pub skipped_tweets: Skipped,
    pub duplicate_edges: usize,
    pub self_follows: usize,
    pub duplicate_tweets: usize,
    pub tokens_written: usize,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "phase                         seconds")?;
        for (phase, secs) in &self.phases {
            writeln!(f, "{phase:<28} {secs:>8.2}")?;
        }
        let total: f64 = self.phases.iter().map(|p| p.1).sum();
        writeln!(f, "{:<28} {total:>8.2}", "total")?;
        writeln!(f, "\ntable                         rows")?;
        for (table, rows) in &self.tables {
            writeln!(f, "{table:<28} {rows:>10}")?;
        }
        writeln!(
            f,
            "\nedges: {} duplicate, {} self-follows dropped, {} malformed lines skipped",
            self.duplicate_edges, self.self_follows, self.skipped_edges.count
        )?;
        writeln!(
            f,
            "tweets: {} duplicate ids dropped, {} malformed lines skipped",
            self.duplicate_tweets, self.skipped_tweets.count
        )?;
        for e in self
            .skipped_edges
            .examples
            .iter()
            .chain(&self.skipped_tweets.examples)
        {
            writeln!(f, "  skipped {e}")?;
        }
        if self.tokens_written > 0 {
            writeln!(f, "tokens written: {}", self.tokens_written)?;
        }
        Ok(())
    }
}

/// One tweet as read from the input.
#[derive(Debug, Clone)]
struct InTweet {
    id: i64,
    author: i64,
    created_at: Timestamp,
    text: String,
    reply_to: Option<i64>,
}

#[derive(Deserialize)]
struct RawTweet {
    id_str: Option<String>,
    created_at: Option<String>,
    user: Option<RawUser>,
    text: Option<String>,
    full_text: Option<String>,
    extended_tweet: Option<RawExtended>,
    in_reply_to_status_id_str: Option<String>,
}

#[derive(Deserialize)]
struct RawUser {
    id_str: Option<String>,
}

#[derive(Deserialize)]
struct RawExtended {
    full_text: Option<String>,
}

fn bar(len: u64, msg: &'static str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{msg:<18} [{bar:30}] {bytes}/{total_bytes} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(msg);
    pb
}

fn spinner(msg: String) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg:<28} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    pb.set_message(msg);
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

/// Opens a plain or gzipped file, with a progress bar over its bytes on disk.
fn open(path: &Path, msg: &'static str) -> anyhow::Result<(Box<dyn BufRead>, ProgressBar)> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let pb = bar(len, msg);
    let raw = pb.wrap_read(file);
    let gz = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gz"));
    let reader: Box<dyn Read> = if gz {
        Box::new(MultiGzDecoder::new(raw))
    } else {
        Box::new(raw)
    };
    Ok((Box::new(BufReader::with_capacity(1 << 20, reader)), pb))
}

/// Calls `each(line_number, line)` for every line; a line that is not UTF-8 is passed as `Err`.
/// An I/O error (unreadable or corrupt file) stops with the file and line.
fn for_each_line(
    path: &Path,
    reader: &mut dyn BufRead,
    mut each: impl FnMut(usize, Result<&str, &str>),
) -> anyhow::Result<()> {
    let mut buf = Vec::with_capacity(4096);
    let mut n = 0;
    loop {
        buf.clear();
        let read = reader
            .read_until(b'\n', &mut buf)
            .with_context(|| format!("reading {} after line {n}", path.display()))?;
        if read == 0 {
            return Ok(());
        }
        n += 1;
        while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            buf.pop();
        }
        match std::str::from_utf8(&buf) {
            Ok(line) => each(n, Ok(line)),
            Err(_) => each(n, Err("not UTF-8")),
        }
    }
}

struct Edges {
    edges: Vec<(i64, i64)>,
    skipped: Skipped,
    duplicates: usize,
    self_follows: usize,
}

fn read_follows(path: &Path) -> anyhow::Result<Edges> {
    let (mut reader, pb) = open(path, "follows")?;
    let mut seen = HashSet::new();
    let mut out = Edges {
        edges: Vec::new(),
        skipped: Skipped::default(),
        duplicates: 0,
        self_follows: 0,
    };
    for_each_line(path, &mut *reader, |n, line| {
        let line = match line {
            Ok(l) => l.trim(),
            Err(reason) => return out.skipped.add(path, n, reason),
        };
        if line.is_empty() || line.starts_with('#') {
            return;
        }
        let mut parts = line.split_whitespace();
        let parsed = match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(b), None) => a.parse::<i64>().ok().zip(b.parse::<i64>().ok()),
            _ => None,
        };
        match parsed {
            None => out.skipped.add(path, n, "expected two integer ids"),
            Some((a, b)) if a == b => out.self_follows += 1,
            Some(edge) => {
                if seen.insert(edge) {
                    out.edges.push(edge);
                } else {
                    out.duplicates += 1;
                }
            }
        }
    })?;
    pb.finish();
    Ok(out)
}

fn parse_twitter_time(s: &str) -> Option<Timestamp> {
    DateTime::parse_from_str(s, "%a %b %d %H:%M:%S %z %Y")
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

fn parse_tweet(line: &str) -> Result<InTweet, &'static str> {
    let raw: RawTweet = serde_json::from_str(line).map_err(|_| "not a JSON tweet object")?;
    let id = raw
        .id_str
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or("no id_str")?;
    let author = raw
        .user
        .and_then(|u| u.id_str)
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or("no author")?;
    let created_at = raw
        .created_at
        .as_deref()
        .and_then(parse_twitter_time)
        .ok_or("no valid created_at")?;
    let text = raw
        .extended_tweet
        .and_then(|e| e.full_text)
        .or(raw.full_text)
        .or(raw.text)
        .map(|t| t.replace('\0', ""))
        .filter(|t| !t.trim().is_empty())
        .ok_or("no text")?;
    let reply_to = raw
        .in_reply_to_status_id_str
        .and_then(|s| s.parse::<i64>().ok());
    Ok(InTweet {
        id,
        author,
        created_at,
        text,
        reply_to,
    })
}

fn read_tweets(paths: &[std::path::PathBuf]) -> anyhow::Result<(Vec<InTweet>, Skipped, usize)> {
    let mut tweets = Vec::new();
    let mut seen = HashSet::new();
    let mut skipped = Skipped::default();
    let mut duplicates = 0;
    for path in paths {
        let (mut reader, pb) = open(path, "tweets")?;
        for_each_line(path, &mut *reader, |n, line| match line.map(parse_tweet) {
            Err(reason) | Ok(Err(reason)) => {
                if !line.is_ok_and(|l| l.trim().is_empty()) {
                    skipped.add(path, n, reason);
                }
            }
            Ok(Ok(t)) => {
                if seen.insert(t.id) {
                    tweets.push(t);
                } else {
                    duplicates += 1;
                }
            }
        })?;
        pb.finish();
    }
    Ok((tweets, skipped, duplicates))
}

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

/// `COPY` text-format escaping.
fn copy_text(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\0' => {}
            c => out.push(c),
        }
    }
}

fn copy_time(t: &Timestamp) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.6f+00").to_string()
}

/// Streams rows (already in COPY text format, one per line) into `table`.
async fn copy_rows(
    conn: &mut PgConnection,
    statement: &str,
    rows: impl Iterator<Item = String>,
) -> anyhow::Result<u64> {
    let mut copy = conn.copy_in_raw(statement).await?;
    let mut chunk = String::with_capacity(1 << 20);
    for row in rows {
        chunk.push_str(&row);
        chunk.push('\n');
        if chunk.len() >= 1 << 20 {
            copy.send(std::mem::take(&mut chunk).into_bytes()).await?;
        }
    }
    if !chunk.is_empty() {
        copy.send(chunk.into_bytes()).await?;
    }
    Ok(copy.finish().await?)
}

struct Phases {
    summary: Summary,
    started: Instant,
    pb: Option<ProgressBar>,
}

impl Phases {
    fn start(&mut self, name: &str) {
        self.end();
        self.pb = Some(spinner(name.to_owned()));
        self.started = Instant::now();
        self.summary.phases.push((name.to_owned(), 0.0));
    }

    fn end(&mut self) {
        if let Some(pb) = self.pb.take() {
            pb.finish();
            if let Some(last) = self.summary.phases.last_mut() {
                last.1 = self.started.elapsed().as_secs_f64();
            }
        }
    }
}

/// Runs the import described by `args` against `db` (already migrated). See the module docs.
///
/// # Errors
/// A missing or unreadable file, an empty graph, or a database error; the database is then
/// left as it was.
pub async fn run(db: &PgPool, args: &ImportArgs) -> anyhow::Result<Summary> {
    let mut ph = Phases {
        summary: Summary::default(),
        started: Instant::now(),
        pb: None,
    };

    let t0 = Instant::now();
    let edges = read_follows(&args.follows)?;
    ph.summary
        .phases
        .push(("read follows".into(), t0.elapsed().as_secs_f64()));
    let t0 = Instant::now();
    let (tweets, skipped_tweets, duplicate_tweets) = read_tweets(&args.tweets)?;
    ph.summary
        .phases
        .push(("read tweets".into(), t0.elapsed().as_secs_f64()));
    ph.summary.skipped_tweets = skipped_tweets;
    ph.summary.duplicate_tweets = duplicate_tweets;

    ph.start("map authors and times");
    let account_of = assign_accounts(&tweets, &edges.edges)?;
    let ids: HashSet<i64> = tweets.iter().map(|t| t.id).collect();
    let parent: HashMap<i64, i64> = tweets
        .iter()
        .filter_map(|t| Some((t.id, t.reply_to.filter(|p| ids.contains(p) && *p != t.id)?)))
        .collect();
    // A reply whose parent is in the data becomes a comment on the root of its chain.
    let root_of = |mut id: i64| -> i64 {
        for _ in 0..1000 {
            match parent.get(&id) {
                Some(p) => id = *p,
                None => break,
            }
        }
        id
    };
    let mut tweet_times: Vec<(i64, Timestamp)> = Vec::new();
    let mut comment_times: Vec<(i64, Timestamp)> = Vec::new();
    for t in &tweets {
        if parent.contains_key(&t.id) {
            comment_times.push((t.id, t.created_at));
        } else {
            tweet_times.push((t.id, t.created_at));
        }
    }
    unique_times(&mut tweet_times);
    unique_times(&mut comment_times);
    let by_id: HashMap<i64, &InTweet> = tweets.iter().map(|t| (t.id, t)).collect();
    let crawl = Utc
        .with_ymd_and_hms(2012, 1, 1, 0, 0, 0)
        .single()
        .context("crawl date")?;
    let mut nodes: Vec<i64> = edges.edges.iter().flat_map(|(a, b)| [*a, *b]).collect();
    nodes.sort_unstable();
    nodes.dedup();

    let mut tx = db.begin().await?;
    if args.reset {
        ph.start("reset");
        sqlx::query(
            "truncate users, auth_tokens, tweets, friendships, newsfeeds, jobs, cache_outbox,
                      comments, tweet_likes, comment_likes restart identity",
        )
        .execute(&mut *tx)
        .await?;
    }
    sqlx::raw_sql(
        "create temp table import_users (id bigint) on commit drop;
         create temp table import_follows (a bigint, b bigint, created_at timestamptz) on commit drop;
         create temp table import_tweets (id bigint, user_id bigint, content text, created_at timestamptz) on commit drop;
         create temp table import_comments (id bigint, tweet_id bigint, user_id bigint, content text, created_at timestamptz) on commit drop;",
    )
    .execute(&mut *tx)
    .await?;

    ph.start("load users");
    copy_rows(
        &mut tx,
        "copy import_users (id) from stdin",
        nodes.iter().map(|n| n.to_string()),
    )
    .await?;
    sqlx::query(
        "insert into users (id, username, email, password_hash, created_at)
         select id, 'u' || id, 'u' || id || '@import.invalid', '!', timestamptz '2012-01-01' from import_users
         on conflict do nothing",
    )
    .execute(&mut *tx)
    .await?;

    ph.start("load friendships");
    copy_rows(
        &mut tx,
        "copy import_follows (a, b, created_at) from stdin",
        edges.edges.iter().enumerate().map(|(i, (a, b))| {
            let t = crawl + chrono::Duration::microseconds(i as i64);
            format!("{a}\t{b}\t{}", copy_time(&t))
        }),
    )
    .await?;
    sqlx::query(
        "insert into friendships (from_user_id, to_user_id, created_at)
         select a, b, created_at from import_follows on conflict do nothing",
    )
    .execute(&mut *tx)
    .await?;

    ph.start("load tweets and comments");
    let row = |id: i64, at: &Timestamp, with_parent: bool| -> Option<String> {
        let t = by_id.get(&id)?;
        let user = account_of.get(&t.author)?;
        let mut line = String::with_capacity(t.text.len() + 64);
        let _ = write!(line, "{id}\t");
        if with_parent {
            let _ = write!(line, "{}\t", root_of(id));
        }
        let _ = write!(line, "{user}\t");
        copy_text(&t.text, &mut line);
        let _ = write!(line, "\t{}", copy_time(at));
        Some(line)
    };
    copy_rows(
        &mut tx,
        "copy import_tweets (id, user_id, content, created_at) from stdin",
        tweet_times
            .iter()
            .filter_map(|(id, at)| row(*id, at, false)),
    )
    .await?;
    copy_rows(
        &mut tx,
        "copy import_comments (id, tweet_id, user_id, content, created_at) from stdin",
        comment_times
            .iter()
            .filter_map(|(id, at)| row(*id, at, true)),
    )
    .await?;
    sqlx::query(
        "insert into tweets (id, user_id, content, created_at)
         select id, user_id, content, created_at from import_tweets on conflict do nothing",
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "insert into comments (id, tweet_id, user_id, content, created_at)
         select c.id, c.tweet_id, c.user_id, c.content, c.created_at
         from import_comments c join tweets t on t.id = c.tweet_id on conflict do nothing",
    )
    .execute(&mut *tx)
    .await?;

    ph.start("fan out newsfeeds");
    sqlx::query(
        "insert into newsfeeds (user_id, tweet_id, created_at)
         select f.from_user_id, t.id, t.created_at
         from import_tweets i join tweets t on t.id = i.id join friendships f on f.to_user_id = t.user_id
         union all
         select t.user_id, t.id, t.created_at from import_tweets i join tweets t on t.id = i.id
         on conflict do nothing",
    )
    .execute(&mut *tx)
    .await?;

    ph.start("count");
    // Recomputed from the rows for everyone, so they are right whatever was there before.
    sqlx::query(
        "update users u set followers_count = c.followers, followings_count = c.followings,
                tweets_count = c.tweets, counts_version = u.counts_version + 1
         from (select u.id,
                      (select count(*) from friendships where to_user_id = u.id) as followers,
                      (select count(*) from friendships where from_user_id = u.id) as followings,
                      (select count(*) from tweets where user_id = u.id) as tweets
               from users u) c
         where c.id = u.id and (u.followers_count, u.followings_count, u.tweets_count)
                               is distinct from (c.followers, c.followings, c.tweets)",
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "update tweets t set comments_count = c.n, counts_version = t.counts_version + 1
         from (select tweet_id, count(*) as n from comments group by tweet_id) c
         where c.tweet_id = t.id and t.comments_count <> c.n",
    )
    .execute(&mut *tx)
    .await?;
    // Later sign-ups, tweets and comments get ids above the imported ones.
    sqlx::query(
        "select setval(pg_get_serial_sequence('users', 'id'), greatest((select max(id) from users), 1)),
                setval(pg_get_serial_sequence('tweets', 'id'), greatest((select max(id) from tweets), 1)),
                setval(pg_get_serial_sequence('comments', 'id'), greatest((select max(id) from comments), 1))",
    )
    .execute(&mut *tx)
    .await?;

    if let Some(path) = &args.tokens_out {
        ph.start("tokens");
        ph.summary.tokens_written = write_tokens(&mut tx, path, args.tokens).await?;
    }

    ph.start("commit");
    tx.commit().await?;
    ph.start("analyze");
    sqlx::query("analyze users, tweets, friendships, newsfeeds, comments")
        .execute(db)
        .await?;
    ph.end();

    let counts: (i64, i64, i64, i64, i64, i64) = sqlx::query_as(
        "select (select count(*) from users), (select count(*) from friendships), (select count(*) from tweets),
                (select count(*) from comments), (select count(*) from newsfeeds), (select count(*) from auth_tokens)",
    )
    .fetch_one(db)
    .await?;
    ph.summary.tables = vec![
        ("users".into(), counts.0),
        ("friendships".into(), counts.1),
        ("tweets".into(), counts.2),
        ("comments".into(), counts.3),
        ("newsfeeds".into(), counts.4),
        ("auth_tokens".into(), counts.5),
    ];
    ph.summary.skipped_edges = edges.skipped;
    ph.summary.duplicate_edges = edges.duplicates;
    ph.summary.self_follows = edges.self_follows;
    Ok(ph.summary)
}

/// Issues tokens for a seeded random sample of `n` accounts that follow someone, and writes
/// `user_id<TAB>token` lines to `path`.
async fn write_tokens(conn: &mut PgConnection, path: &Path, n: usize) -> anyhow::Result<usize> {
    let mut readers: Vec<i64> =
        sqlx::query_scalar("select id from users where followings_count > 0 order by id")
            .fetch_all(&mut *conn)
            .await?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(20121101);
    readers.shuffle(&mut rng);
    readers.truncate(n);
    let mut tokens = Vec::with_capacity(readers.len());
    let mut sys = rand::rng();
    for id in &readers {
        let mut bytes = [0u8; 32];
        sys.fill_bytes(&mut bytes);
        use base64::Engine;
        tokens.push((
            *id,
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes),
        ));
    }
    copy_rows(
        conn,
        "copy auth_tokens (token_hash, user_id) from stdin",
        tokens.iter().map(|(id, token)| {
            let hash: String = accounts::hash_token(token)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("\\\\x{hash}\t{id}")
        }),
    )
    .await?;
    let mut out = std::io::BufWriter::new(
        File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    for (id, token) in &tokens {
        writeln!(out, "{id}\t{token}")?;
    }
    out.flush()?;
    Ok(tokens.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twitter_dates_parse() {
        let t = parse_twitter_time("Wed Nov 09 06:57:54 +0000 2016").unwrap();
        assert_eq!(crate::time::format(&t), "2016-11-09T06:57:54.000000Z");
    }

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

    #[test]
    fn copy_text_escapes_control_characters() {
        let mut out = String::new();
        copy_text("a\tb\nc\\d\0", &mut out);
        assert_eq!(out, "a\\tb\\nc\\\\d");
    }
}
