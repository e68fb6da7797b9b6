//! The randomized history checker: what a *client* sees, over random histories with faults.
//!
//! The technique of Jepsen / Elle histories and of FoundationDB's simulation tests, at the
//! scale of a test: several chirp processes ([`Node`]s: the app, its job runners, its outbox
//! relay and its pub/sub subscription, as `chirp serve` runs them) share one Postgres and one
//! private `redis-server`; seeded random actors post, edit, delete, follow, unfollow, like,
//! unlike, retweet, undo retweets, rename, log out and read, each through a random process (a
//! third of the posts go into one of two circles all of them joined, a quarter of the others
//! reply to a tweet, and texts mention actors and carry one of two tags now and then), and keep
//! a course front end's views (a newsfeed, one user's tweets, and one circle's or one tag's
//! tweets: a first page, pull-to-refresh with
//! `created_at__gt=<newest held>`, endless paging with `created_at__lt=<oldest held>`, no
//! de-duplication); a fault task flushes, stalls, evicts and restarts Redis, kills the
//! subscriptions, leaves the last process's subscription alone half-open or stalled (it
//! reaches Redis through a [`Proxy`]) or cuts that process off from Redis (its writes hand
//! their rows off through Postgres), and leaves the first process's hand-off listener
//! half-open (its monitor reaches Postgres through another proxy), alone or while the last
//! process is cut off, on a schedule. Under `scripts/test --cluster` the processes share the
//! Redis Cluster instead, and the faults are the cluster's ([`cluster_fault`]): flushes,
//! killed subscriptions, a stalled master, evictions, a replica stopped, and failovers
//! (graceful or forced) whose old master stays up as a replica; and the half-open listener.
//! Every request and answer is recorded with its time; the invariants are checked as the
//! answers come and once more when the history is quiet:
//!
//! - **exactly once**: a view never receives an entry it holds already, and after a final
//!   refresh it holds every entry of its timeline at or above its oldest (none missed); a view
//!   of tweets (a user's, a circle's) is checked for holes each time it is dropped as well
//!   ([`check_complete`]);
//! - **read your writes, on every process**: a tweet is on its author's timeline and newsfeed
//!   (and its circle's) and readable; a deleted tweet is 404; a new nickname is shown; a revoked token is 401;
//!   a like shows as liked, a cancel as not, once the write answered;
//! - **no old text**: once an edit answered, no read begun after it, on any process, page or
//!   detail, shows the tweet with a text older than that edit's (also as a retweet's
//!   `retweeted_tweet`), and every tweet object mentions exactly the actors its shown text
//!   names;
//! - **at most once**: no newsfeed answer lists a tweet twice (by itself or by retweets), nor
//!   does any newsfeed when the history is quiet; a retweet reads back on every process (its
//!   retweeter's tweets, `has_retweeted`), an undone one or one whose tweet was deleted is 404;
//! - **streams deliver exactly once**: each actor also keeps a `streaming/user` client that
//!   drops its connection at random and resumes with its last `id:` through a random process
//!   ([`Watcher`]; pulled tweets too, in hybrid runs): it never receives a tweet twice, and
//!   after a final resume it has received every tweet its newsfeed gained since it first
//!   connected;
//! - no request fails (5xx); counts (likes, retweets, replies) are exact and
//!   `chirp check-cache` is clean at the end.
//!
//! A violation prints the seed, the violation and the part of the history that touches the
//! same ids, and the run repeats its schedule from `CHIRP_MODEL_SEED=<seed>`. The suite runs a
//! fresh seed for `CHIRP_MODEL_SECONDS` (default 20) and every seed of `seeds.txt` for
//! a few seconds; `scripts/model --seconds 600` runs it long. Odd seeds run with hybrid
//! timelines ([`chirp::hybrid`]) and a threshold of one follower, so actors' tweets are pulled
//! and fanned out by turns (`CHIRP_MODEL_HYBRID=1|0` forces it); `CHIRP_MODEL_FAULTS=6,7` draws
//! only those kinds of fault (the numbers of [`fault_loop`]), to hunt one finding down.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use chirp::cache::outbox;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::watch;

use crate::helpers::{Proxy, PubSub, RedisServer, Res, Stream, TestApp, unique_prefix, urlencode};

/// Processes sharing one Postgres and one Redis.
const NODES: usize = 2;
/// Circles every actor posts into and reads.
const CIRCLES: usize = 2;
/// Actors (users): each writes and reads through random processes, one request at a time.
const ACTORS: usize = 5;
/// The seeds that once found something: each runs for [`REGRESSION_SECONDS`] in the suite.
const REGRESSION_SEEDS: &str = include_str!("seeds.txt");
const REGRESSION_SECONDS: u64 = 3;

/// One chirp process of a run: the app and the background work `chirp serve` runs beside it.
struct Node {
    app: TestApp,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Node {
    /// A process on `db` and the Redis at `redis_url`; its monitor (outbox relay, hand-off
    /// listener) reaches Postgres through `monitor_db` where given (a proxy the faults break).
    async fn start(
        db: PgPool,
        monitor_db: Option<PgPool>,
        redis_url: String,
        prefix: String,
        hybrid: bool,
    ) -> Self {
        let app = TestApp::with(db, |c| {
            c.redis_url = redis_url;
            c.redis_prefix = prefix;
            // What `chirp serve` runs with (the suite's helpers lengthen it).
            c.near_lease_ms = chirp::cache::lease::DEFAULT_LENGTH_MS;
            if hybrid {
                // Hybrid timelines with a threshold the actors cross both ways: an actor with
                // three followers or more is pulled, one with one or none is fanned out again.
                c.fanout_pull_above = 2;
                c.fanout_pull_below = Some(2);
                c.fanout_pull_settle_ms = 400;
            }
        })
        .await;
        let state = app.state.clone();
        let (stop, stopped) = watch::channel(false);
        let tasks = vec![
            tokio::spawn(outbox::monitor(
                state.cache.clone(),
                monitor_db.unwrap_or_else(|| state.db.clone()),
                stopped.clone(),
            )),
            tokio::spawn(state.worker.clone().run(2, stopped)),
        ];
        state
            .subscriber
            .start(&state.cache, &state.shutdown.subscribe());
        Node { app, stop, tasks }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.app.state.shutdown.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// One text of a tweet and when the write that set it answered ([`World::texts`]).
type Text = (String, Option<Instant>);

/// A follow or an unfollow asked for ([`World::follow_changes`]).
#[derive(Debug, Clone, Copy)]
struct FollowChange {
    reader: i64,
    author: i64,
    follow: bool,
    asked: Instant,
    /// `None`: not yet, or no answer (it may have taken effect all the same).
    answered: Option<Instant>,
}

/// One recorded step of a history.
#[derive(Debug, Clone)]
struct Event {
    at: Duration,
    actor: usize,
    node: usize,
    what: String,
    /// Tweet, entry and user ids the step names (to cut the history down to a violation).
    ids: Vec<i64>,
}

/// The shared record of a run: its history and its first violation.
struct Record {
    started: Instant,
    events: Mutex<Vec<Event>>,
    violation: Mutex<Option<(String, Vec<i64>)>>,
}

impl Record {
    fn log(&self, actor: usize, node: usize, what: String, ids: Vec<i64>) {
        let at = self.started.elapsed();
        if let Ok(mut events) = self.events.lock() {
            events.push(Event {
                at,
                actor,
                node,
                what,
                ids,
            });
        }
    }

    fn violate(&self, what: String, ids: Vec<i64>) {
        // `CHIRP_MODEL_IGNORE`: invariants to leave unchecked (messages that start with one of
        // these, comma-separated), to look past a known violation for the next one.
        let ignored = std::env::var("CHIRP_MODEL_IGNORE").unwrap_or_default();
        if ignored
            .split(',')
            .any(|p| !p.trim().is_empty() && what.starts_with(p.trim()))
        {
            self.log(usize::MAX - 1, 0, format!("IGNORED {what}"), ids);
            return;
        }
        if let Ok(mut v) = self.violation.lock()
            && v.is_none()
        {
            *v = Some((what, ids));
        }
    }

    fn failed(&self) -> bool {
        self.violation.lock().map(|v| v.is_some()).unwrap_or(true)
    }

    /// The violation and the steps that name one of its ids (the last 150), or `None`.
    fn report(&self, seed: u64) -> Option<String> {
        let (what, ids) = self.violation.lock().ok()?.clone()?;
        let ids: HashSet<i64> = ids.into_iter().collect();
        let events = self.events.lock().ok()?;
        let related: Vec<&Event> = events
            .iter()
            .filter(|e| e.actor == usize::MAX || e.ids.iter().any(|i| ids.contains(i)))
            .collect();
        let mut out = format!(
            "history checker: VIOLATION with seed {seed} (re-run: CHIRP_MODEL_SEED={seed})\n  {what}\n\
             the {} of {} steps that name {ids:?} or are faults:\n",
            related.len().min(150),
            events.len()
        );
        for e in related.iter().rev().take(150).rev() {
            let _ = writeln!(
                out,
                "  {:>8.3}s actor {} node {}: {}",
                e.at.as_secs_f64(),
                e.actor,
                e.node,
                e.what
            );
        }
        Some(out)
    }
}

/// A course front end's view of one timeline: the entries it holds, newest first, as
/// `(entry id, created_at as sent, tweet id)`.
#[derive(Default)]
struct View {
    held: Vec<(i64, String, i64)>,
}

/// Which timeline a [`View`] shows.
#[derive(Clone, Copy, Debug)]
enum Shown {
    /// The actor's own newsfeed (entries are newsfeed rows).
    Newsfeed,
    /// A user's tweets (entries are tweets).
    UserTweets(i64),
    /// The tweets posted into a circle (entries are tweets).
    Circle(i64),
    /// The tweets that carry the tag `TAGS[k]` (entries are tweets).
    Tag(usize),
}

/// The hashtags posts carry now and then (`#h0`, `#h1`): few, so that their timelines fill.
const TAGS: [&str; 2] = ["h0", "h1"];

/// The ` #tag` words of a text (of [`TAGS`]), in order: an edit keeps them, so a tweet never
/// gains a tag after its post (the tag timelines' late-arrival exception, decision 0024, is
/// not the contract this checks).
fn tags_in(text: &str) -> String {
    text.split_whitespace()
        .filter(|w| w.strip_prefix('#').is_some_and(|t| TAGS.contains(&t)))
        .map(|w| format!(" {w}"))
        .collect()
}

impl Shown {
    fn uri(self) -> String {
        match self {
            Shown::Newsfeed => "/api/newsfeeds/?".to_owned(),
            Shown::UserTweets(u) => format!("/api/tweets/?user_id={u}&"),
            Shown::Circle(c) => format!("/api/circles/{c}/tweets/?"),
            Shown::Tag(k) => format!("/api/hashtags/{}/tweets/?", TAGS[k]),
        }
    }

    /// `(entry id, created_at, tweet id)` of a page's results.
    fn entries(self, body: &Value) -> Vec<(i64, String, i64)> {
        let results = body["results"].as_array().cloned().unwrap_or_default();
        results
            .iter()
            .map(|r| {
                let tweet = r.get("tweet").unwrap_or(r);
                (
                    r["id"].as_i64().unwrap_or(-1),
                    r["created_at"].as_str().unwrap_or("").to_owned(),
                    tweet["id"].as_i64().unwrap_or(-1),
                )
            })
            .collect()
    }
}

/// What one actor knows: its account, its tweets, whom it follows, what it likes.
struct Actor {
    index: usize,
    id: i64,
    name: String,
    token: String,
    nickname_seq: u64,
    tweets: Vec<i64>,
    /// Its retweets: tweet → the retweet that answered (it may be gone with its tweet).
    retweets: HashMap<i64, i64>,
    follows: HashSet<i64>,
    likes: HashSet<i64>,
    feed: View,
    tweets_view: Option<(Shown, View)>,
    /// A circle's tweets, as a member's front end shows them.
    circle_view: Option<(Shown, View)>,
}

/// One request of an actor: what [`World::call`] sends and records.
struct Req<'a> {
    method: Method,
    uri: &'a str,
    token: Option<&'a str>,
    body: Option<Value>,
    /// Ids the request names (with those of its answer, they cut the history to a violation).
    ids: Vec<i64>,
}

impl<'a> Req<'a> {
    /// A `GET` of `uri`.
    fn get(uri: &'a str, token: Option<&'a str>, ids: Vec<i64>) -> Self {
        Req {
            method: Method::GET,
            uri,
            token,
            body: None,
            ids,
        }
    }
}

/// Everything the actors share: the processes, the record, every tweet ever posted.
struct World {
    nodes: Vec<Node>,
    record: Record,
    users: Vec<i64>,
    /// Tweets that exist (not deleted), with their authors.
    tweets: Mutex<HashMap<i64, i64>>,
    deadline: Instant,
    /// Per process: odd while it "dies" between its commits and their cache steps (the fault
    /// sets `AfterCommit::Crash`), bumped at each change. A write that overlaps such a window
    /// is indeterminate, as a request to a process that died: no read-your-writes check.
    crash: Vec<std::sync::atomic::AtomicU64>,
    /// The last process's way to Redis.
    proxy: Proxy,
    /// The first process's monitor's way to Postgres (its hand-off listener's).
    pg_proxy: Proxy,
    /// Follows and unfollows asked for: a stream may deliver a tweet again after its reader
    /// unfollowed and followed its author again ([`World::refollowed`]).
    follow_changes: Mutex<Vec<FollowChange>>,
    /// When the post of each tweet was asked for.
    posted: Mutex<HashMap<i64, Instant>>,
    /// Circles every actor is a member of (a post goes into one now and then).
    circles: Vec<i64>,
    /// The texts of each tweet, in version order (its author edits one at a time), each with
    /// when the write that set it answered (`None`: not yet, failed or indeterminate).
    texts: Mutex<HashMap<i64, Vec<Text>>>,
    /// Retweets whose post answered, by the tweet they retweet, each with when it answered.
    retweets_of: Mutex<HashMap<i64, Vec<(i64, Instant)>>>,
    /// Tweets whose delete was asked for (it may take a retweet of it along at any time).
    deletes_asked: Mutex<HashSet<i64>>,
}

impl World {
    fn app(&self, node: usize) -> &TestApp {
        &self.nodes[node].app
    }

    /// Whether `reader`'s newsfeed may have gained `tweet` (by `author`) twice by `now`: it
    /// unfollowed `author` after the tweet could have entered it (an unfollow that answered
    /// before the post was asked for took nothing of it out), then followed again (asked for
    /// by `now`). The first delivery's time does not bound it: the unfollow's unmerge runs
    /// after its answer, and a stream may send a row read before the unmerge after it.
    fn refollowed(&self, reader: i64, author: i64, tweet: i64, now: Instant) -> bool {
        let posted = self.posted.lock().ok().and_then(|p| p.get(&tweet).copied());
        let Ok(changes) = self.follow_changes.lock() else {
            return true;
        };
        let pair = || (changes.iter()).filter(|c| c.reader == reader && c.author == author);
        pair()
            .filter(|u| !u.follow)
            .filter(|u| posted.is_none_or(|p| u.answered.is_none_or(|a| a >= p)))
            .any(|u| pair().any(|f| f.follow && f.asked >= u.asked && f.asked <= now))
    }

    /// A write through process `node` ([`World::call`]); the second value is whether it is
    /// determinate (no crash window of that process overlapped it).
    async fn write(&self, actor: usize, node: usize, req: Req<'_>) -> (Res, bool) {
        use std::sync::atomic::Ordering;
        let uri = req.uri.to_owned();
        let before = self.crash[node].load(Ordering::SeqCst);
        let res = self.call(actor, node, req).await;
        let after = self.crash[node].load(Ordering::SeqCst);
        let determinate = before.is_multiple_of(2) && before == after;
        if !determinate {
            self.record.log(
                actor,
                node,
                format!("  (indeterminate: {uri} overlapped a crash)"),
                vec![],
            );
        }
        (res, determinate)
    }

    /// No old text: each tweet of a page or detail read through `node` that `started` at that
    /// instant shows the text of the newest edit answered before it, or a later one.
    fn check_texts(&self, node: usize, uri: &str, body: &Value, started: Instant) {
        let pages = [
            "/api/tweets/",
            "/api/newsfeeds/",
            "/api/circles/",
            "/api/hashtags/",
        ];
        if !pages.iter().any(|p| uri.starts_with(p)) {
            return;
        }
        let mut tweets: Vec<&Value> = match body.get("results").and_then(Value::as_array) {
            Some(results) => results
                .iter()
                .map(|r| r.get("tweet").unwrap_or(r))
                .collect(),
            None => vec![body],
        };
        // A retweet's retweeted tweet is shown too: its text and mentions are checked alike.
        let originals: Vec<&Value> = (tweets.iter())
            .filter_map(|t| t.get("retweeted_tweet").filter(|o| o.is_object()))
            .collect();
        tweets.extend(originals);
        let Ok(texts) = self.texts.lock() else {
            return;
        };
        for tweet in tweets {
            let (Some(id), Some(shown)) = (tweet["id"].as_i64(), tweet["content"].as_str()) else {
                continue;
            };
            // Mentions are resolved with the text they come from (usernames never change here),
            // so a tweet object shows exactly the actors its shown text names.
            let mentioned: Vec<i64> = (tweet["mentions"].as_array().into_iter().flatten())
                .filter_map(|u| u["id"].as_i64())
                .collect();
            let named = self.mentioned_in(shown);
            if mentioned != named {
                self.record.violate(
                    format!(
                        "mentions: tweet {id} shows {shown:?} with mentions {mentioned:?} on \
                         node {node} ({uri}), but its text names {named:?}"
                    ),
                    vec![id],
                );
            }
            let Some(versions) = texts.get(&id) else {
                continue;
            };
            let floor = (versions.iter())
                .rposition(|(_, answered)| answered.is_some_and(|at| at < started));
            let Some(floor) = floor else {
                continue;
            };
            if !versions[floor..].iter().any(|(text, _)| text == shown) {
                let (want, _) = &versions[floor];
                self.record.violate(
                    format!(
                        "no old text: tweet {id} shows {shown:?} on node {node} ({uri}), but the \
                         edit to {want:?} answered before this read began"
                    ),
                    vec![id],
                );
            }
        }
    }

    /// The actors a text of this run names (`@actor{index}` words), in order, once each.
    fn mentioned_in(&self, text: &str) -> Vec<i64> {
        let mut ids = Vec::new();
        for word in text.split_whitespace() {
            let Some(index) = (word.strip_prefix("@actor")).and_then(|i| i.parse::<usize>().ok())
            else {
                continue;
            };
            if let Some(&id) = self.users.get(index)
                && !ids.contains(&id)
            {
                ids.push(id);
            }
        }
        ids
    }

    /// A request through process `node`, recorded; a 5xx is a violation.
    async fn call(&self, actor: usize, node: usize, req: Req<'_>) -> Res {
        let Req {
            method,
            uri,
            token,
            body,
            ids,
        } = req;
        let started = Instant::now();
        let res = self
            .app(node)
            .request(method.clone(), uri, token, body)
            .await;
        if method == Method::GET && res.status == StatusCode::OK {
            self.check_texts(node, uri, &res.body, started);
        }
        let summary = summarize(&res.body);
        self.record.log(
            actor,
            node,
            format!("{method} {uri} -> {} {summary}", res.status.as_u16()),
            ids.iter().copied().chain(ids_in(&res.body)).collect(),
        );
        if res.status.is_server_error() {
            self.record
                .violate(format!("{method} {uri} failed: {}", res.body), ids);
        }
        res
    }
}

/// A short text of an answer for the history: the ids and times of a page, else the body.
fn summarize(body: &Value) -> String {
    match body.get("results").and_then(Value::as_array) {
        Some(results) => {
            let items: Vec<String> = results
                .iter()
                .map(|r| {
                    let tweet = r.get("tweet").unwrap_or(r);
                    format!(
                        "{}/{}@{}",
                        r["id"],
                        tweet["id"],
                        r["created_at"].as_str().unwrap_or("?")
                    )
                })
                .collect();
            format!("[{}]", items.join(", "))
        }
        None => {
            let text = body.to_string();
            text.chars().take(160).collect()
        }
    }
}

/// Ids an answer names (tweets, entries, users), for cutting the history to a violation.
fn ids_in(body: &Value) -> Vec<i64> {
    let mut ids = Vec::new();
    if let Some(results) = body.get("results").and_then(Value::as_array) {
        for r in results {
            ids.extend(r["id"].as_i64());
            ids.extend(r.get("tweet").and_then(|t| t["id"].as_i64()));
        }
    } else {
        ids.extend(body.get("id").and_then(Value::as_i64));
    }
    ids
}

/// Runs one history: `seconds` of random steps from `seed`; returns the report of a violation.
async fn run_history(db: PgPool, seed: u64, seconds: u64) -> Option<String> {
    // Errors behind a 500 show in the output (RUST_LOG, default `error`).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_test_writer()
        .try_init();
    // Hybrid timelines on odd seeds (`CHIRP_MODEL_HYBRID=1` / `0` forces them on / off).
    let hybrid = match std::env::var("CHIRP_MODEL_HYBRID").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => seed % 2 == 1,
    };
    eprintln!("history checker: seed {seed}, hybrid timelines {hybrid}");
    let redis = RedisServer::start().await;
    let prefix = unique_prefix();
    // The last process talks to Redis through a proxy that can break its subscription alone.
    let proxy = Proxy::to(&redis.url()).await;
    // The first process's monitor reaches Postgres through a proxy that can leave its hand-off
    // listener half-open.
    let (pg_proxy, through) = Proxy::to_postgres(&db).await;
    let mut nodes = Vec::new();
    for n in 0..NODES {
        let url = if n == NODES - 1 {
            proxy.url()
        } else {
            redis.url()
        };
        let monitor_db = (n == 0).then(|| through.clone());
        nodes.push(Node::start(db.clone(), monitor_db, url, prefix.clone(), hybrid).await);
    }
    let mut actors = Vec::new();
    for index in 0..ACTORS {
        let name = format!("actor{index}");
        let (id, token) = nodes[0].app.signup(&name).await;
        actors.push(Actor {
            index,
            id,
            name,
            token,
            nickname_seq: 0,
            tweets: Vec::new(),
            retweets: HashMap::new(),
            follows: HashSet::new(),
            likes: HashSet::new(),
            feed: View::default(),
            tweets_view: None,
            circle_view: None,
        });
    }
    let users = actors.iter().map(|a| a.id).collect();
    // Circles that every actor joins: their timelines are read and written concurrently.
    let mut circles = Vec::new();
    for c in 0..CIRCLES {
        // Unique across runs on one database (names are), at most 50 characters.
        let body = json!({"name": format!("c{c}-{}", &prefix[prefix.len().saturating_sub(40)..])});
        let res = nodes[0]
            .app
            .post("/api/circles/", Some(&actors[0].token), body)
            .await;
        let id = res.body["id"].as_i64().expect("a circle");
        for a in &actors[1..] {
            let uri = format!("/api/circles/{id}/join/");
            nodes[0].app.post(&uri, Some(&a.token), json!({})).await;
        }
        circles.push(id);
    }
    let world = Arc::new(World {
        nodes,
        record: Record {
            started: Instant::now(),
            events: Mutex::new(Vec::new()),
            violation: Mutex::new(None),
        },
        users,
        tweets: Mutex::new(HashMap::new()),
        deadline: Instant::now() + Duration::from_secs(seconds),
        crash: (0..NODES)
            .map(|_| std::sync::atomic::AtomicU64::new(0))
            .collect(),
        proxy,
        pg_proxy,
        follow_changes: Mutex::new(Vec::new()),
        posted: Mutex::new(HashMap::new()),
        circles,
        texts: Mutex::new(HashMap::new()),
        retweets_of: Mutex::new(HashMap::new()),
        deletes_asked: Mutex::new(HashSet::new()),
    });
    let redis = Arc::new(tokio::sync::Mutex::new(redis));
    let faults = tokio::spawn(fault_loop(
        world.clone(),
        redis.clone(),
        StdRng::seed_from_u64(seed ^ 0xfa17),
    ));
    // Stream clients: one per actor ([`Watcher`]).
    let mut watchers = Vec::new();
    for (i, actor) in actors.iter().enumerate() {
        let watcher = Watcher::new(&world, actor).await;
        let rng = StdRng::seed_from_u64(seed.wrapping_mul(57).wrapping_add(i as u64));
        watchers.push(tokio::spawn(watch_loop(world.clone(), watcher, rng)));
    }
    let mut handles = Vec::new();
    for (i, actor) in actors.into_iter().enumerate() {
        let world = world.clone();
        let rng = StdRng::seed_from_u64(seed.wrapping_mul(31).wrapping_add(i as u64));
        handles.push(tokio::spawn(actor_loop(world, actor, rng)));
    }
    let mut actors = Vec::new();
    for h in handles {
        match h.await {
            Ok(a) => actors.push(a),
            Err(e) => world
                .record
                .violate(format!("an actor panicked: {e}"), vec![]),
        }
    }
    let _ = faults.await;
    let mut finished = Vec::new();
    for w in watchers {
        match w.await {
            Ok(w) => finished.push(w),
            Err(e) => world
                .record
                .violate(format!("a stream client panicked: {e}"), vec![]),
        }
    }
    if !world.record.failed() {
        quiet_checks(&world, &mut actors).await;
    }
    for w in &mut finished {
        if world.record.failed() {
            break;
        }
        w.last_check(&world).await;
    }
    if !finished.is_empty() {
        let delivered: usize = finished.iter().map(|w| w.events).sum();
        let sessions: usize = finished.iter().map(|w| w.sessions).sum();
        eprintln!(
            "history checker: seed {seed}: stream clients received {delivered} tweets over \
             {sessions} connections"
        );
    }
    let circle_tweets: (i64, i64) = sqlx::query_as(
        "select count(*), count(distinct user_id) from tweets where circle_id = any($1)",
    )
    .bind(&world.circles)
    .fetch_one(&db)
    .await
    .unwrap_or_default();
    let tagged: i64 = sqlx::query_scalar("select count(distinct tweet_id) from tweet_hashtags")
        .fetch_one(&db)
        .await
        .unwrap_or_default();
    eprintln!(
        "history checker: seed {seed}: {} tweets standing in {} circles, by {} authors; \
         {tagged} with a tag",
        circle_tweets.0,
        world.circles.len(),
        circle_tweets.1
    );
    // What the history left of the shapes the invariants must hold for.
    let shapes: (i64, i64, i64) = sqlx::query_as(
        "select count(*) filter (where retweeted_tweet_id is not null),
                count(*) filter (where in_reply_to_tweet_id is not null),
                count(*) filter (where cardinality(mentioned_user_ids) > 0)
         from tweets",
    )
    .fetch_one(&db)
    .await
    .unwrap_or_default();
    eprintln!(
        "history checker: seed {seed}: standing at the end: {} retweets, {} replies, {} tweets \
         with mentions",
        shapes.0, shapes.1, shapes.2
    );
    if hybrid {
        let pulled: (i64, i64) =
            sqlx::query_as("select count(*) filter (where pulled), count(*) from tweets")
                .fetch_one(&db)
                .await
                .unwrap_or_default();
        let stat = |name| {
            (0..world.nodes.len())
                .map(|n| world.app(n).stat(name))
                .sum::<u64>()
        };
        eprintln!(
            "history checker: seed {seed}: {} of {} tweets standing were pulled; newsfeed pages \
             merged from cached lists {}, read from Postgres as a list lagged {} (processes \
             running at the end)",
            pulled.0,
            pulled.1,
            stat("merged"),
            stat("merge_fallbacks")
        );
    }
    if let Ok(events) = world.record.events.lock() {
        let count = |f: &dyn Fn(&str) -> bool| events.iter().filter(|e| f(&e.what)).count();
        eprintln!(
            "history checker: seed {seed}: {} steps, {} writes, {} first pages, {} refreshes, {} pages down, {} indeterminate, faults: {}",
            events.len(),
            count(&|w| !w.starts_with("GET") && !w.starts_with("FAULT") && !w.starts_with("  (")),
            count(&|w| w.starts_with("GET")
                && w.contains("page_size")
                && !w.contains("created_at__")),
            count(&|w| w.starts_with("GET") && w.contains("created_at__gt")),
            count(&|w| w.starts_with("GET") && w.contains("created_at__lt")),
            count(&|w| w.starts_with("  (indeterminate")),
            events
                .iter()
                .filter_map(|e| e.what.strip_prefix("FAULT "))
                .map(|w| w.split(' ').next().unwrap_or(w))
                .fold(
                    std::collections::BTreeMap::<&str, usize>::new(),
                    |mut m, w| {
                        *m.entry(w).or_default() += 1;
                        m
                    }
                )
                .iter()
                .map(|(k, v)| format!("{k} ×{v}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let report = world.record.report(seed);
    if let Ok(world) = Arc::try_unwrap(world) {
        for node in world.nodes {
            node.stop().await;
        }
    }
    report
}

/// An actor's `streaming/user` client, as a browser's `EventSource`: it connects through a
/// random process, reads for a random while or until the stream ends (a fault ends it), and
/// reconnects with the last `id:` it got (`Last-Event-ID`). Checked as events come: **no
/// tweet twice**, unless its reader unfollowed its author after the post and followed again
/// before the second ([`World::refollowed`]: the tweet entered the newsfeed twice); and at
/// the end ([`Watcher::last_check`]), after one more resume, **none missed**: every tweet of
/// the reader's newsfeed (its rows and, in hybrid runs, the pulled tweets it shows) that was
/// not there when the client first connected has come.
struct Watcher {
    actor: usize,
    user: i64,
    /// Its own session (the actor logs out and in again with its own).
    token: String,
    last_id: Option<String>,
    /// Tweets received, with when.
    delivered: HashMap<i64, Instant>,
    /// The `id:` each tweet first came with (to tell a violation's two deliveries apart).
    first_ids: HashMap<i64, Option<String>>,
    /// Tweets of the reader's newsfeed when the client first connected.
    before: Option<HashSet<i64>>,
    events: usize,
    sessions: usize,
}

impl Watcher {
    async fn new(world: &World, actor: &Actor) -> Self {
        let body = json!({"username": actor.name, "password": "correct horse"});
        let res = world.app(0).post("/api/accounts/login/", None, body).await;
        Watcher {
            actor: actor.index,
            user: actor.id,
            token: res.body["token"].as_str().unwrap_or_default().to_owned(),
            last_id: None,
            delivered: HashMap::new(),
            first_ids: HashMap::new(),
            before: None,
            events: 0,
            sessions: 0,
        }
    }

    /// The reader's newsfeed's tweets in Postgres: its rows and the pulled tweets it shows
    /// (the newsfeed's meaning, [`chirp::newsfeeds::page`]).
    async fn rows(&self, world: &World) -> HashSet<i64> {
        let db = world.app(0).db();
        chirp::newsfeeds::page(db, self.user, None, None, 1_000_000)
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|r| r.tweet_id)
            .collect()
    }

    /// One connection through `node`, read for `read_for` (or until it ends, or until no
    /// event came for `idle`).
    async fn session(&mut self, world: &World, node: usize, read_for: Duration, idle: Duration) {
        let app = world.app(node);
        let uri = "/api/streaming/user/";
        let opened = Stream::try_open(app, uri, &self.token, self.last_id.as_deref()).await;
        let mut stream = match opened {
            Ok(s) => s,
            Err((status, body)) => {
                world.record.log(
                    self.actor,
                    node,
                    format!("STREAM open refused: {status} {body}"),
                    vec![self.user],
                );
                // A 503 (Redis down: streams need the subscription) is an answer; a 500 is not,
                // nor a 400 to a token the server gave.
                if status == StatusCode::INTERNAL_SERVER_ERROR || status == StatusCode::BAD_REQUEST
                {
                    world.record.violate(
                        format!("a stream open answered {status}: {body}"),
                        vec![self.user],
                    );
                }
                return;
            }
        };
        self.sessions += 1;
        world.record.log(
            self.actor,
            node,
            format!("STREAM open after {:?}", self.last_id),
            vec![self.user],
        );
        if self.before.is_none() {
            // After the open: a row committed meanwhile is left out of the last check.
            self.before = Some(self.rows(world).await);
        }
        if let Some(id) = &stream.last_id {
            self.last_id = Some(id.clone());
        }
        let until = Instant::now() + read_for;
        while Instant::now() < until {
            let left = until.saturating_duration_since(Instant::now());
            let ev = stream.next(idle.min(left)).await;
            // As an EventSource: the last `id:` received, also one without an event (the
            // stream's place, sent first).
            if let Some(id) = &stream.last_id {
                self.last_id = Some(id.clone());
            }
            let Some(ev) = ev else {
                break;
            };
            if ev.kind != "tweet" {
                continue;
            }
            let tweet = ev.data["tweet"]["id"].as_i64().unwrap_or_default();
            let author = ev.data["tweet"]["user"]["id"].as_i64().unwrap_or_default();
            self.events += 1;
            world.record.log(
                self.actor,
                node,
                format!("STREAM tweet {tweet} by {author} (id {:?})", ev.id),
                vec![self.user, tweet, author],
            );
            let now = Instant::now();
            let first_id = self
                .first_ids
                .entry(tweet)
                .or_insert_with(|| ev.id.clone())
                .clone();
            if let Some(first) = self.delivered.insert(tweet, now)
                && !world.refollowed(self.user, author, tweet, now)
            {
                world.record.violate(
                    format!(
                        "stream exactly once: tweet {tweet} reached user {}'s stream twice \
                         (first with id {first_id:?}, {} ms before; again with id {:?})",
                        self.user,
                        now.duration_since(first).as_millis(),
                        ev.id
                    ),
                    // Not the author: its own stream's events would crowd out the reader's.
                    vec![self.user, tweet],
                );
                return;
            }
        }
    }

    /// One more resume, read until quiet, then none missed.
    async fn last_check(&mut self, world: &World) {
        let Some(before) = self.before.clone() else {
            return;
        };
        // As a client would, it opens again until a stream opens: a fault just before the end
        // (a killed subscription) has the processes answer 503 until they subscribe again
        // (seed 15545086552391325399 reported 40 tweets missed by a stream never reopened).
        let opened = self.sessions;
        for _ in 0..40 {
            self.session(
                world,
                0,
                Duration::from_secs(20),
                Duration::from_millis(1500),
            )
            .await;
            if self.sessions > opened {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let missed: Vec<i64> = (self.rows(world).await.into_iter())
            .filter(|t| !before.contains(t) && !self.delivered.contains_key(t))
            .collect();
        if let Some(&tweet) = missed.first() {
            world.record.violate(
                format!(
                    "stream none missed: user {}'s stream never received tweet {tweet} of its \
                     newsfeed ({} missed)",
                    self.user,
                    missed.len()
                ),
                vec![self.user, tweet],
            );
        }
    }
}

/// A [`Watcher`]'s connections until the deadline.
async fn watch_loop(world: Arc<World>, mut w: Watcher, mut rng: StdRng) -> Watcher {
    while Instant::now() < world.deadline && !world.record.failed() {
        let node = rng.random_range(0..NODES);
        let read_for = Duration::from_millis(rng.random_range(100..3000));
        w.session(&world, node, read_for, read_for).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
    }
    w
}

/// Faults on a schedule, until the deadline; Redis is whole again when it returns.
async fn fault_loop(
    world: Arc<World>,
    redis: Arc<tokio::sync::Mutex<RedisServer>>,
    mut rng: StdRng,
) {
    let url = redis.lock().await.url();
    // Under `scripts/test --cluster` the processes talk to the cluster (CHIRP_REDIS_CLUSTER),
    // not to the run's own server: the faults go to the cluster's nodes.
    let cluster = chirp::config::Config::defaults().redis_cluster;
    let mut snapshot_taken = false;
    // `CHIRP_MODEL_FAULTS=6,7`: only these kinds of fault (to hunt one finding down).
    let only: Option<Vec<usize>> = std::env::var("CHIRP_MODEL_FAULTS").ok().map(|v| {
        v.split(',')
            .map(|k| {
                k.trim()
                    .parse()
                    .expect("CHIRP_MODEL_FAULTS: fault numbers 0-9")
            })
            .collect()
    });
    while Instant::now() < world.deadline && !world.record.failed() {
        tokio::time::sleep(Duration::from_millis(rng.random_range(800..2500))).await;
        let fault = match &only {
            Some(kinds) => kinds[rng.random_range(0..kinds.len())],
            None => rng.random_range(0..10),
        };
        if !cluster.is_empty() {
            let what = match fault {
                5 => crash_fault(&world, &mut rng).await,
                9 => Some(listener_fault(&world, false, &mut rng).await),
                _ => cluster_fault(fault, &cluster, &mut rng).await,
            };
            if let Some(what) = what {
                let line = format!("FAULT {what}");
                world.record.log(usize::MAX, usize::MAX, line, vec![]);
            }
            continue;
        }
        let Some(mut r) = node_conn(&url).await else {
            continue;
        };
        let what = match fault {
            0 => {
                let _: Result<(), _> = redis::cmd("FLUSHALL").query_async(&mut r).await;
                "FLUSHALL".to_owned()
            }
            1 => {
                let _: Result<i64, _> = redis::cmd("CLIENT")
                    .arg(&["KILL", "TYPE", "pubsub"])
                    .query_async(&mut r)
                    .await;
                "CLIENT KILL TYPE pubsub".to_owned()
            }
            2 => {
                let ms = rng.random_range(300..500);
                let _: Result<(), _> = redis::cmd("CLIENT")
                    .arg("PAUSE")
                    .arg(ms)
                    .arg("ALL")
                    .query_async(&mut r)
                    .await;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                format!("CLIENT PAUSE {ms} ALL (a stall past CHIRP_REDIS_TIMEOUT_MS)")
            }
            3 => {
                // Redis evicts keys itself, with the policy docs/cache.md recommends.
                let limit = used_memory(&mut r).await * 9 / 10;
                let _: Result<(), _> = redis::cmd("CONFIG")
                    .arg(&["SET", "maxmemory-policy", "volatile-lru"])
                    .query_async(&mut r)
                    .await;
                let _: Result<(), _> = redis::cmd("CONFIG")
                    .arg(&["SET", "maxmemory"])
                    .arg(limit)
                    .query_async(&mut r)
                    .await;
                tokio::time::sleep(Duration::from_millis(300)).await;
                let _: Result<(), _> = redis::cmd("CONFIG")
                    .arg(&["SET", "maxmemory", "0"])
                    .query_async(&mut r)
                    .await;
                format!("maxmemory {limit} (volatile-lru) for 300 ms")
            }
            4 if !snapshot_taken => {
                redis.lock().await.snapshot().await;
                snapshot_taken = true;
                "SAVE (a snapshot to restart from later)".to_owned()
            }
            4 => {
                drop(r);
                redis.lock().await.restart_from_snapshot().await;
                snapshot_taken = false;
                "restart from the last snapshot".to_owned()
            }
            5 => match crash_fault(&world, &mut rng).await {
                Some(what) => what,
                None => continue,
            },
            6 | 7 => {
                // The last process's subscription dies silently (Redis drops it, the process
                // is told nothing) or stalls (Redis keeps counting it); its data connections
                // work on (review of 2026-11-26, finding 1).
                let (mode, name) = if fault == 6 {
                    (PubSub::HalfOpen, "half-open")
                } else {
                    (PubSub::Stall, "stalled")
                };
                let ms = rng.random_range(300..1500);
                world.proxy.set_pubsub(mode);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                world.proxy.set_pubsub(PubSub::Pass);
                format!("node {} subscription {name} for {ms} ms", NODES - 1)
            }
            8 => {
                // The last process loses Redis: its writes hand their rows off through Postgres
                // (review of 2026-11-26, finding 2).
                let ms = rng.random_range(300..1500);
                world.proxy.set_up(false);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                world.proxy.set_up(true);
                format!("node {} cut off from Redis for {ms} ms", NODES - 1)
            }
            9 => listener_fault(&world, true, &mut rng).await,
            _ => continue,
        };
        world
            .record
            .log(usize::MAX, usize::MAX, format!("FAULT {what}"), vec![]);
    }
}

/// The first process's hand-off listener goes half-open (Postgres drops it, the process is
/// told nothing) for a while; with `cut_off`, the last process loses Redis meanwhile, so its
/// writes hand off rows the first process does not hear.
async fn listener_fault(world: &World, cut_off: bool, rng: &mut StdRng) -> String {
    let ms = rng.random_range(300..1500);
    world.pg_proxy.set_pubsub(PubSub::HalfOpen);
    if cut_off {
        world.proxy.set_up(false);
    }
    tokio::time::sleep(Duration::from_millis(ms)).await;
    world.proxy.set_up(true);
    world.pg_proxy.set_pubsub(PubSub::Pass);
    if cut_off {
        format!(
            "node 0's hand-off listener half-open and node {} cut off from Redis for {ms} ms",
            NODES - 1
        )
    } else {
        format!("node 0's hand-off listener half-open for {ms} ms")
    }
}

/// A process stops between its commits and their cache steps for a while (the outbox relay of
/// the others repairs after RELAY_AFTER). Off in the suite (`CHIRP_MODEL_CRASH=1` turns it on;
/// scripts/model does): a view can miss an entry after such a crash (seed 16, round 15), open.
async fn crash_fault(world: &World, rng: &mut StdRng) -> Option<String> {
    use std::sync::atomic::Ordering;
    if std::env::var("CHIRP_MODEL_CRASH").is_ok_and(|v| v == "1") {
        let node = rng.random_range(0..NODES);
        let ms = rng.random_range(200..600);
        let cache = &world.app(node).state.cache;
        world.crash[node].fetch_add(1, Ordering::SeqCst);
        cache.set_after_commit(chirp::cache::AfterCommit::Crash);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        cache.set_after_commit(chirp::cache::AfterCommit::Apply);
        world.crash[node].fetch_add(1, Ordering::SeqCst);
        return Some(format!("node {node} stopped after its commits for {ms} ms"));
    }
    None
}

/// The cluster's live nodes as `CLUSTER NODES` on one of `seeds` shows them: `(url, master)`.
async fn cluster_nodes(seeds: &[String]) -> Vec<(String, bool)> {
    for seed in seeds {
        let Some(mut c) = node_conn(seed).await else {
            continue;
        };
        let Ok(text) = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async::<String>(&mut c)
            .await
        else {
            continue;
        };
        return text
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let addr = fields.nth(1)?.split('@').next()?;
                let flags = fields.next()?;
                (!flags.contains("fail") && !flags.contains("handshake"))
                    .then(|| (format!("redis://{addr}"), flags.contains("master")))
            })
            .collect();
    }
    Vec::new()
}

/// The bytes a Redis server holds (`INFO memory`'s `used_memory`; 0 if it does not say).
async fn used_memory(c: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(c)
        .await
        .unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// A connection to the Redis server at `url` (one node of a cluster); `None` if it does not
/// answer within 2 s.
async fn node_conn(url: &str) -> Option<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url).ok()?;
    let connect = client.get_multiplexed_async_connection();
    tokio::time::timeout(Duration::from_secs(2), connect)
        .await
        .ok()?
        .ok()
}

/// One fault on the Redis Cluster of `seeds` (`scripts/test --cluster`): a flush of every
/// master, every node's pub/sub connections killed, a master stalled, keys evicted by every
/// master itself, a replica's process stopped for a while, or a **failover that keeps the old
/// master up** (a replica takes over with `CLUSTER FAILOVER`, graceful or `FORCE`; its master
/// stays up as its replica: review of 2026-11-26, finding 4).
/// `None` if there was nothing to do.
async fn cluster_fault(fault: usize, seeds: &[String], rng: &mut StdRng) -> Option<String> {
    let nodes = cluster_nodes(seeds).await;
    let masters: Vec<&String> = nodes.iter().filter(|n| n.1).map(|n| &n.0).collect();
    let replicas: Vec<&String> = nodes.iter().filter(|n| !n.1).map(|n| &n.0).collect();
    let on_all = async |urls: &[&String], cmd: &redis::Cmd| {
        for url in urls {
            if let Some(mut c) = node_conn(url).await {
                let _: Result<redis::Value, _> = cmd.query_async(&mut c).await;
            }
        }
    };
    match fault {
        0 => {
            on_all(&masters, &redis::cmd("FLUSHALL")).await;
            Some(format!("FLUSHALL on {} masters", masters.len()))
        }
        1 => {
            let mut kill = redis::cmd("CLIENT");
            kill.arg(&["KILL", "TYPE", "pubsub"]);
            let all: Vec<&String> = nodes.iter().map(|n| &n.0).collect();
            on_all(&all, &kill).await;
            Some(format!("CLIENT KILL TYPE pubsub on {} nodes", all.len()))
        }
        2 => {
            let master = *masters.get(rng.random_range(0..masters.len().max(1)))?;
            let ms = rng.random_range(300..500);
            let mut pause = redis::cmd("CLIENT");
            pause.arg("PAUSE").arg(ms).arg("ALL");
            on_all(&[master], &pause).await;
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Some(format!("CLIENT PAUSE {ms} ALL on {master}"))
        }
        3 => {
            let mut policy = redis::cmd("CONFIG");
            policy.arg(&["SET", "maxmemory-policy", "volatile-lru"]);
            on_all(&masters, &policy).await;
            // Each master evicts down to 90 % of what it holds.
            for master in &masters {
                let Some(mut c) = node_conn(master).await else {
                    continue;
                };
                let limit = used_memory(&mut c).await * 9 / 10;
                let _: Result<(), _> = redis::cmd("CONFIG")
                    .arg(&["SET", "maxmemory"])
                    .arg(limit)
                    .query_async(&mut c)
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            let mut unlimited = redis::cmd("CONFIG");
            unlimited.arg(&["SET", "maxmemory", "0"]);
            on_all(&masters, &unlimited).await;
            Some(format!(
                "maxmemory at 90 % on {} masters for 300 ms",
                masters.len()
            ))
        }
        4 | 6 | 7 => {
            let replica = *replicas.get(rng.random_range(0..replicas.len().max(1)))?;
            let mut c = node_conn(replica).await?;
            // FORCE: the replica does not wait to have all its master's writes (those it
            // lacks are lost, as when a master fails for real).
            let force = rng.random_bool(0.5);
            let mut failover = redis::cmd("CLUSTER");
            failover.arg("FAILOVER");
            if force {
                failover.arg("FORCE");
            }
            let _: Result<(), _> = failover.query_async(&mut c).await;
            // Until it serves as a master (a graceful failover takes milliseconds).
            let asked = Instant::now();
            while asked.elapsed() < Duration::from_secs(5) {
                let role: Result<Vec<redis::Value>, _> =
                    redis::cmd("ROLE").query_async(&mut c).await;
                if let Ok(role) = role
                    && role
                        .first()
                        .is_some_and(|r| matches!(r, redis::Value::BulkString(b) if b == b"master"))
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Some(format!(
                "CLUSTER FAILOVER{} to {replica} (its master stays up, as its replica) in {} ms",
                if force { " FORCE" } else { "" },
                asked.elapsed().as_millis()
            ))
        }
        8 => {
            // A replica down for a while (its process stopped): `WAIT`s fall short on its
            // master, whose writes then distrust it (docs/cluster.md).
            let replica = *replicas.get(rng.random_range(0..replicas.len().max(1)))?;
            let mut c = node_conn(replica).await?;
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query_async(&mut c)
                .await
                .ok()?;
            let pid = info
                .lines()
                .find_map(|l| l.strip_prefix("process_id:"))?
                .trim()
                .to_owned();
            let ms = rng.random_range(300..1800);
            let signal = |sig: &str| {
                std::process::Command::new("kill")
                    .args([sig, pid.as_str()])
                    .status()
                    .is_ok_and(|s| s.success())
            };
            if !signal("-STOP") {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(ms)).await;
            signal("-CONT");
            Some(format!("replica {replica} stopped for {ms} ms"))
        }
        _ => None,
    }
}

/// One actor's random steps until the deadline (or the first violation); returns the actor.
async fn actor_loop(world: Arc<World>, mut me: Actor, mut rng: StdRng) -> Actor {
    while Instant::now() < world.deadline && !world.record.failed() {
        let node = rng.random_range(0..NODES);
        match rng.random_range(0..100) {
            0..18 => post(&world, &mut me, node, &mut rng).await,
            18..24 => delete(&world, &mut me, node, &mut rng).await,
            24..35 => follow_or_unfollow(&world, &mut me, node, &mut rng).await,
            35..44 => like_or_unlike(&world, &mut me, node, &mut rng).await,
            44..50 => retweet_or_unretweet(&world, &mut me, node, &mut rng).await,
            50..55 => rename(&world, &mut me, node).await,
            55..57 => relogin(&world, &mut me, node).await,
            57..63 => edit(&world, &mut me, node, &mut rng).await,
            63..80 => read_feed(&world, &mut me, node, &mut rng).await,
            80..92 => read_tweets(&world, &mut me, node, &mut rng).await,
            _ => read_circle(&world, &mut me, node, &mut rng).await,
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..15))).await;
    }
    me
}

/// Another process than `node` (or `node` itself with one process).
fn other(node: usize) -> usize {
    (node + 1) % NODES
}

async fn post(world: &World, me: &mut Actor, node: usize, rng: &mut StdRng) {
    let tag = rng
        .random_bool(0.3)
        .then(|| rng.random_range(0..TAGS.len()));
    let content = format!(
        "{} says {}{}{}",
        me.name,
        rng.random_range(0..1_000_000),
        mentions(world, rng),
        tag.map(|k| format!(" #{}", TAGS[k])).unwrap_or_default()
    );
    // A third of the posts go into a circle; a quarter of the others reply to a tweet.
    let circle = rng
        .random_bool(1.0 / 3.0)
        .then(|| world.circles[rng.random_range(0..world.circles.len())]);
    let reply_to = match circle {
        None if rng.random_bool(0.25) => any_tweet(world, rng),
        _ => None,
    };
    let asked = Instant::now();
    let (res, determinate) = world
        .write(
            me.index,
            node,
            Req {
                method: Method::POST,
                uri: "/api/tweets/",
                token: Some(&me.token),
                body: Some(json!({
                    "content": content,
                    "circle_id": circle,
                    "in_reply_to_tweet_id": reply_to,
                })),
                ids: vec![me.id].into_iter().chain(reply_to).collect(),
            },
        )
        .await;
    if res.status != StatusCode::CREATED {
        return;
    }
    let Some(id) = res.body["id"].as_i64() else {
        return;
    };
    me.tweets.push(id);
    if let Ok(mut t) = world.tweets.lock() {
        t.insert(id, me.id);
    }
    if let Ok(mut posted) = world.posted.lock() {
        posted.insert(id, asked);
    }
    if let Ok(mut texts) = world.texts.lock() {
        let answered = determinate.then(Instant::now);
        texts.insert(id, vec![(content.clone(), answered)]);
    }
    if !determinate {
        return;
    }
    // Everything since just before the tweet: its entries lie at or after its time (others
    // may have posted many tweets since, so a first page need not reach it).
    let Some(before) = just_before(&res.body) else {
        world.record.violate(
            format!("tweet {id} has no created_at: {}", res.body),
            vec![id],
        );
        return;
    };
    // Read your writes, on every process (the others first): the tweet, the author's tweets,
    // the author's newsfeed, the circle's tweets.
    for there in (1..=NODES).map(|k| (node + k) % NODES) {
        let uri = format!("/api/tweets/{id}/");
        let res = world
            .call(me.index, there, Req::get(&uri, None, vec![id]))
            .await;
        if res.status != StatusCode::OK {
            world.record.violate(
                format!(
                    "read-your-writes: tweet {id} posted on node {node} is {} on node {there}",
                    res.status
                ),
                vec![id],
            );
            return;
        }
        let views = [
            Some((Shown::UserTweets(me.id), None)),
            Some((Shown::Newsfeed, Some(me.token.as_str()))),
            circle.map(|c| (Shown::Circle(c), None)),
            tag.map(|k| (Shown::Tag(k), None)),
        ];
        for (shown, token) in views.into_iter().flatten() {
            if !listed_since(world, me.index, there, shown, token, &before, id).await {
                world.record.violate(
                    format!(
                        "read-your-writes: tweet {id} posted on node {node} is not in {shown:?} \
                         of its author {} on node {there}",
                        me.id
                    ),
                    vec![id, me.id],
                );
                return;
            }
        }
    }
}

/// 1 µs before an answered tweet's `created_at`, as a cursor: every entry of it lies after.
fn just_before(tweet: &Value) -> Option<String> {
    let at = chrono::DateTime::parse_from_rfc3339(tweet["created_at"].as_str()?).ok()?;
    Some(
        (at - chrono::Duration::microseconds(1))
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
    )
}

/// Now and then ` @actor{k}` words naming one or two actors ([`World::mentioned_in`]).
fn mentions(world: &World, rng: &mut StdRng) -> String {
    let mut out = String::new();
    if rng.random_bool(0.3) {
        for _ in 0..rng.random_range(1..=2) {
            let _ = write!(out, " @actor{}", rng.random_range(0..world.users.len()));
        }
    }
    out
}

/// A random tweet that exists (not a retweet), if any.
fn any_tweet(world: &World, rng: &mut StdRng) -> Option<i64> {
    let mut tweets: Vec<i64> = world.tweets.lock().ok()?.keys().copied().collect();
    tweets.sort_unstable();
    (!tweets.is_empty()).then(|| tweets[rng.random_range(0..tweets.len())])
}

/// Whether `shown` lists tweet `id` among its entries after `after`: a refresh returns at
/// most 1,000 (a follow's backfill may have brought more since), so the rest is read in gap
/// pages (`created_at__gt` and `created_at__lt`) until the tweet or the end.
async fn listed_since(
    world: &World,
    actor: usize,
    node: usize,
    shown: Shown,
    token: Option<&str>,
    after: &str,
    id: i64,
) -> bool {
    let mut uri = format!("{}created_at__gt={}", shown.uri(), urlencode(after));
    for _ in 0..20 {
        let res = world
            .call(actor, node, Req::get(&uri, token, vec![id]))
            .await;
        let entries = shown.entries(&res.body);
        if entries.iter().any(|e| e.2 == id) {
            return true;
        }
        let Some(oldest) = entries.last().map(|e| e.1.clone()) else {
            return false;
        };
        if res.body["has_next_page"].as_bool() != Some(true) {
            return false;
        }
        uri = format!(
            "{}created_at__gt={}&created_at__lt={}&page_size=100",
            shown.uri(),
            urlencode(after),
            urlencode(&oldest)
        );
    }
    false
}

/// Edits one of the actor's tweets, then reads it on every process: the new text (and no read
/// begun after this answered shows an older one, [`World::check_texts`]).
async fn edit(world: &World, me: &mut Actor, node: usize, rng: &mut StdRng) {
    if me.tweets.is_empty() {
        return;
    }
    let id = me.tweets[rng.random_range(0..me.tweets.len())];
    me.nickname_seq += 1;
    let mut content = format!(
        "{} edits {id} ({}){}",
        me.name,
        me.nickname_seq,
        mentions(world, rng)
    );
    let version = match world.texts.lock() {
        Ok(mut texts) => {
            let versions = texts.entry(id).or_default();
            if let Some((first, _)) = versions.first() {
                content.push_str(&tags_in(first));
            }
            versions.push((content.clone(), None));
            versions.len() - 1
        }
        Err(_) => return,
    };
    let uri = format!("/api/tweets/{id}/");
    let (res, determinate) = world
        .write(
            me.index,
            node,
            Req {
                method: Method::PATCH,
                uri: &uri,
                token: Some(&me.token),
                body: Some(json!({ "content": content })),
                ids: vec![id],
            },
        )
        .await;
    if res.status != StatusCode::OK || !determinate {
        return;
    }
    if let Ok(mut texts) = world.texts.lock()
        && let Some(v) = texts.get_mut(&id).and_then(|v| v.get_mut(version))
    {
        v.1 = Some(Instant::now());
    }
    for n in 0..NODES {
        world
            .call(me.index, n, Req::get(&uri, None, vec![id]))
            .await;
    }
}

async fn delete(world: &World, me: &mut Actor, node: usize, rng: &mut StdRng) {
    if me.tweets.is_empty() {
        return;
    }
    let id = me.tweets.swap_remove(rng.random_range(0..me.tweets.len()));
    let uri = format!("/api/tweets/{id}/");
    let asked = Instant::now();
    if let Ok(mut d) = world.deletes_asked.lock() {
        d.insert(id);
    }
    let (res, determinate) = world
        .write(
            me.index,
            node,
            Req {
                method: Method::DELETE,
                uri: &uri,
                token: Some(&me.token),
                body: None,
                ids: vec![id],
            },
        )
        .await;
    if res.status != StatusCode::OK {
        return;
    }
    if let Ok(mut t) = world.tweets.lock() {
        t.remove(&id);
    }
    if !determinate {
        return;
    }
    let what = format!("tweet {id} deleted on node {node}");
    if !gone_everywhere(world, me.index, id, &[], &what).await {
        return;
    }
    // Its retweets went first, everywhere: those that answered before the delete was asked.
    let retweets: Vec<i64> = (world.retweets_of.lock().ok())
        .and_then(|r| r.get(&id).cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, answered)| *answered < asked)
        .map(|(rt, _)| rt)
        .collect();
    for rt in retweets {
        let what = format!("retweet {rt} of tweet {id} deleted on node {node}");
        if !gone_everywhere(world, me.index, rt, &[id], &what).await {
            return;
        }
    }
}

/// Read your writes of a delete: tweet `id` is 404 on every process (else a violation naming
/// `what` and `also`); whether it was.
async fn gone_everywhere(world: &World, actor: usize, id: i64, also: &[i64], what: &str) -> bool {
    let uri = format!("/api/tweets/{id}/");
    let ids: Vec<i64> = std::iter::once(id).chain(also.iter().copied()).collect();
    for n in 0..NODES {
        let res = world
            .call(actor, n, Req::get(&uri, None, ids.clone()))
            .await;
        if res.status != StatusCode::NOT_FOUND {
            world.record.violate(
                format!("read-your-writes: {what} is {} on node {n}", res.status),
                ids,
            );
            return false;
        }
    }
    true
}

/// Retweets a tweet that exists (mostly), or undoes one of its retweets; then read your
/// writes on every process: a retweet is readable, on its author's tweets and counted as the
/// actor's (`has_retweeted`); an undone one is 404 and no longer the actor's. A retweet whose
/// tweet's delete was asked for meanwhile may be gone with it.
async fn retweet_or_unretweet(world: &World, me: &mut Actor, node: usize, rng: &mut StdRng) {
    let undo = !me.retweets.is_empty() && rng.random_bool(0.4);
    let tweet = if undo {
        let mut held: Vec<i64> = me.retweets.keys().copied().collect();
        held.sort_unstable();
        held[rng.random_range(0..held.len())]
    } else {
        match any_tweet(world, rng) {
            Some(t) => t,
            None => return,
        }
    };
    let verb = if undo { "unretweet" } else { "retweet" };
    let uri = format!("/api/tweets/{tweet}/{verb}/");
    let (res, determinate) = world
        .write(
            me.index,
            node,
            Req {
                method: Method::POST,
                uri: &uri,
                token: Some(&me.token),
                body: Some(json!({})),
                ids: vec![tweet],
            },
        )
        .await;
    if !res.status.is_success() {
        if res.status == StatusCode::NOT_FOUND {
            me.retweets.remove(&tweet); // the tweet is gone, and its retweets with it
        }
        return;
    }
    let gone = |world: &World| (world.deletes_asked.lock()).map_or(true, |d| d.contains(&tweet));
    let detail = format!("/api/tweets/{tweet}/");
    if undo {
        let Some(rt) = me.retweets.remove(&tweet) else {
            return;
        };
        // `deleted: 0`: the tweet's delete took the retweet (its cache step may still be on
        // its way: that delete has not answered yet).
        if !determinate || res.body["deleted"] != json!(1) {
            return;
        }
        let retweet = format!("/api/tweets/{rt}/");
        for n in (1..=NODES).map(|k| (node + k) % NODES) {
            let res = world
                .call(me.index, n, Req::get(&retweet, None, vec![rt, tweet]))
                .await;
            if res.status != StatusCode::NOT_FOUND {
                world.record.violate(
                    format!(
                        "read-your-writes: retweet {rt} of tweet {tweet} undone on node {node} is \
                         {} on node {n}",
                        res.status
                    ),
                    vec![rt, tweet],
                );
                return;
            }
            let res = world
                .call(me.index, n, Req::get(&detail, Some(&me.token), vec![tweet]))
                .await;
            if res.status == StatusCode::OK && res.body["has_retweeted"] != json!(false) {
                world.record.violate(
                    format!(
                        "read-your-writes: tweet {tweet} shows has_retweeted {} to actor {} on \
                         node {n} after the undo answered on node {node}",
                        res.body["has_retweeted"], me.index
                    ),
                    vec![rt, tweet],
                );
                return;
            }
        }
        return;
    }
    let (Some(rt), Some(of)) = (
        res.body["id"].as_i64(),
        res.body["retweeted_tweet"]["id"].as_i64(),
    ) else {
        world.record.violate(
            format!(
                "retweet of tweet {tweet} answered without its tweet: {}",
                res.body
            ),
            vec![tweet],
        );
        return;
    };
    if of != tweet {
        world.record.violate(
            format!("retweet {rt} of tweet {tweet} names tweet {of}"),
            vec![rt, tweet],
        );
        return;
    }
    me.retweets.insert(tweet, rt);
    if let Ok(mut r) = world.retweets_of.lock() {
        r.entry(tweet).or_default().push((rt, Instant::now()));
    }
    if !determinate {
        return;
    }
    let Some(before) = just_before(&res.body) else {
        return;
    };
    for n in (1..=NODES).map(|k| (node + k) % NODES) {
        let res = world
            .call(
                me.index,
                n,
                Req::get(&detail, Some(&me.token), vec![tweet, rt]),
            )
            .await;
        let shown = res.status == StatusCode::OK
            && res.body["has_retweeted"] == json!(true)
            && res.body["retweets_count"].as_i64().is_some_and(|c| c >= 1);
        let listed = shown
            && listed_since(
                world,
                me.index,
                n,
                Shown::UserTweets(me.id),
                None,
                &before,
                rt,
            )
            .await;
        if !listed && !gone(world) {
            world.record.violate(
                format!(
                    "read-your-writes: retweet {rt} of tweet {tweet} by actor {} on node {node} \
                     is not shown on node {n} ({} {})",
                    me.index, res.status, res.body
                ),
                vec![rt, tweet],
            );
            return;
        }
    }
}

async fn follow_or_unfollow(world: &World, me: &mut Actor, node: usize, rng: &mut StdRng) {
    let target = world.users[rng.random_range(0..world.users.len())];
    if target == me.id {
        return;
    }
    let follows = me.follows.contains(&target);
    let verb = if follows { "unfollow" } else { "follow" };
    let uri = format!("/api/friendships/{target}/{verb}/");
    let change = FollowChange {
        reader: me.id,
        author: target,
        follow: !follows,
        asked: Instant::now(),
        answered: None,
    };
    let index = world.follow_changes.lock().ok().map(|mut changes| {
        changes.push(change);
        changes.len() - 1
    });
    let res = world
        .call(
            me.index,
            node,
            Req {
                method: Method::POST,
                uri: &uri,
                token: Some(&me.token),
                body: Some(json!({})),
                ids: vec![me.id, target],
            },
        )
        .await;
    if res.status.is_success()
        && let (Some(index), Ok(mut changes)) = (index, world.follow_changes.lock())
    {
        changes[index].answered = Some(Instant::now());
    }
    if res.status.is_success() {
        if follows {
            me.follows.remove(&target);
        } else {
            me.follows.insert(target);
        }
    }
}

async fn like_or_unlike(world: &World, me: &mut Actor, node: usize, rng: &mut StdRng) {
    let pick = {
        let tweets = world
            .tweets
            .lock()
            .map(|t| t.keys().copied().collect::<Vec<_>>());
        match tweets {
            Ok(t) if !t.is_empty() => t[rng.random_range(0..t.len())],
            _ => return,
        }
    };
    let liked = me.likes.contains(&pick);
    let uri = if liked {
        "/api/likes/cancel/"
    } else {
        "/api/likes/"
    };
    let body = json!({"content_type": "tweet", "object_id": pick});
    let (res, determinate) = world
        .write(
            me.index,
            node,
            Req {
                method: Method::POST,
                uri,
                token: Some(&me.token),
                body: Some(body),
                ids: vec![pick],
            },
        )
        .await;
    if !res.status.is_success() {
        return; // deleted meanwhile (400)
    }
    if liked {
        me.likes.remove(&pick);
    } else {
        me.likes.insert(pick);
    }
    if !determinate {
        return;
    }
    let there = other(node);
    let uri = format!("/api/tweets/{pick}/");
    let res = world
        .call(me.index, there, Req::get(&uri, Some(&me.token), vec![pick]))
        .await;
    if res.status == StatusCode::OK && res.body["has_liked"].as_bool() != Some(!liked) {
        // Its author may have deleted it meanwhile (a delete takes its likes along): a read
        // that overlapped the delete may show the tweet without the like.
        let exists: bool = sqlx::query_scalar("select exists (select 1 from tweets where id = $1)")
            .bind(pick)
            .fetch_one(world.app(0).db())
            .await
            .unwrap_or(true);
        if !exists {
            return;
        }
        world.record.violate(
            format!(
                "read-your-writes: {} of tweet {pick} on node {node}, has_liked {} on node {there}",
                if liked { "cancel" } else { "like" },
                res.body["has_liked"]
            ),
            vec![pick],
        );
    }
}

async fn rename(world: &World, me: &mut Actor, node: usize) {
    me.nickname_seq += 1;
    let nickname = format!("{}-{}", me.name, me.nickname_seq);
    let uri = format!("/api/users/{}/", me.id);
    let (res, determinate) = world
        .write(
            me.index,
            node,
            Req {
                method: Method::PATCH,
                uri: &uri,
                token: Some(&me.token),
                body: Some(json!({ "nickname": nickname })),
                ids: vec![me.id],
            },
        )
        .await;
    if res.status != StatusCode::OK || !determinate {
        return;
    }
    for n in 0..NODES {
        let res = world
            .call(me.index, n, Req::get(&uri, None, vec![me.id]))
            .await;
        if res.body["nickname"].as_str() != Some(nickname.as_str()) {
            world.record.violate(
                format!(
                    "read-your-writes: nickname {nickname:?} set on node {node}, node {n} shows {}",
                    res.body["nickname"]
                ),
                vec![me.id],
            );
            return;
        }
    }
}

/// Where process `n` finds `token` now, for a violation's report: Postgres, its memory (if it
/// trusts it), Redis's value, and the state of its lease, subscription and cache.
async fn token_diagnosis(world: &World, n: usize, token: &str) -> String {
    let app = &world.nodes[n].app;
    let hash = chirp::accounts::hash_token(token);
    let memory = app.state.tokens.get(&hash);
    let key = app.state.cache.keys().map(|k| k.token(&hash));
    let redis: Option<String> = match key {
        Some(key) => {
            let mut r = app.redis().await;
            redis::cmd("GET")
                .arg(key)
                .query_async(&mut r)
                .await
                .ok()
                .flatten()
        }
        None => None,
    };
    let in_postgres: Option<bool> =
        sqlx::query_scalar("select exists (select 1 from auth_tokens where token_hash = $1)")
            .bind(&hash)
            .fetch_one(app.db())
            .await
            .ok();
    let lease = app.state.subscriber.lease();
    format!(
        "then: postgres {in_postgres:?}, memory {memory:?}, redis {redis:?}, lease held {} \
         term {}, subscribed {}, cache available {}",
        lease.held(),
        lease.term(),
        app.state.subscriber.subscribed(),
        app.state.cache.available(),
    )
}

async fn relogin(world: &World, me: &mut Actor, node: usize) {
    let (res, determinate) = world
        .write(
            me.index,
            node,
            Req {
                method: Method::POST,
                uri: "/api/accounts/logout/",
                token: Some(&me.token),
                body: Some(json!({})),
                ids: vec![me.id],
            },
        )
        .await;
    if res.status != StatusCode::OK {
        return;
    }
    for n in (0..NODES).filter(|_| determinate) {
        let res = world
            .call(
                me.index,
                n,
                Req::get("/api/accounts/login_status/", Some(&me.token), vec![me.id]),
            )
            .await;
        if res.status != StatusCode::UNAUTHORIZED {
            let seen = token_diagnosis(world, n, &me.token).await;
            world.record.violate(
                format!(
                    "read-your-writes: a token revoked on node {node} is {} on node {n} ({seen})",
                    res.status
                ),
                vec![me.id],
            );
            return;
        }
    }
    let body = json!({"username": me.name, "password": "correct horse"});
    let res = world
        .call(
            me.index,
            node,
            Req {
                method: Method::POST,
                uri: "/api/accounts/login/",
                token: None,
                body: Some(body),
                ids: vec![me.id],
            },
        )
        .await;
    if let Some(token) = res.body["token"].as_str() {
        me.token = token.to_owned();
    }
}

async fn read_feed(world: &World, me: &mut Actor, node: usize, rng: &mut StdRng) {
    let token = me.token.clone();
    let mut view = std::mem::take(&mut me.feed);
    step_view(
        world,
        me.index,
        node,
        Shown::Newsfeed,
        &mut view,
        Some(&token),
        rng,
    )
    .await;
    me.feed = view;
}

async fn read_tweets(world: &World, me: &mut Actor, node: usize, rng: &mut StdRng) {
    let kept = me.tweets_view.take();
    let pick =
        |rng: &mut StdRng| Shown::UserTweets(world.users[rng.random_range(0..world.users.len())]);
    me.tweets_view = Some(step_kept(world, me.index, node, kept, pick, None, rng).await);
}

async fn read_circle(world: &World, me: &mut Actor, node: usize, rng: &mut StdRng) {
    let kept = me.circle_view.take();
    // A circle's tweets, or a tag's (both are tweets of many authors in one order).
    let pick = |rng: &mut StdRng| match rng.random_range(0..world.circles.len() + TAGS.len()) {
        k if k < world.circles.len() => Shown::Circle(world.circles[k]),
        k => Shown::Tag(k - world.circles.len()),
    };
    let token = me.token.clone();
    me.circle_view = Some(step_kept(world, me.index, node, kept, pick, Some(&token), rng).await);
}

/// One step of a view an actor keeps of one of several timelines: mostly the kept one; now
/// and then it is dropped (checked for holes first, [`check_complete`]) for a new one of
/// `pick`.
async fn step_kept(
    world: &World,
    actor: usize,
    node: usize,
    kept: Option<(Shown, View)>,
    pick: impl FnOnce(&mut StdRng) -> Shown,
    token: Option<&str>,
    rng: &mut StdRng,
) -> (Shown, View) {
    let (shown, mut view) = match kept {
        Some(v) if rng.random_range(0..20) > 0 => v,
        dropped => {
            if let Some((shown, view)) = dropped {
                check_complete(world, actor, shown, &view).await;
            }
            (pick(rng), View::default())
        }
    };
    step_view(world, actor, node, shown, &mut view, token, rng).await;
    (shown, view)
}

/// One step of a front end's view: a first page (an empty view, or now and then a reload),
/// else a refresh from the newest held or a page below the oldest held. A result the view
/// holds already is a violation.
async fn step_view(
    world: &World,
    actor: usize,
    node: usize,
    shown: Shown,
    view: &mut View,
    token: Option<&str>,
    rng: &mut StdRng,
) {
    let size = rng.random_range(3..12);
    let (uri, newer) = match (view.held.first(), view.held.last()) {
        (Some(newest), Some(oldest)) if rng.random_range(0..30) > 0 => {
            if rng.random_bool(0.6) {
                (
                    format!("{}created_at__gt={}", shown.uri(), urlencode(&newest.1)),
                    true,
                )
            } else {
                (
                    format!(
                        "{}page_size={size}&created_at__lt={}",
                        shown.uri(),
                        urlencode(&oldest.1)
                    ),
                    false,
                )
            }
        }
        _ => {
            check_complete(world, actor, shown, view).await;
            view.held.clear();
            (format!("{}page_size={size}", shown.uri()), false)
        }
    };
    let res = world.call(actor, node, Req::get(&uri, token, vec![])).await;
    if res.status != StatusCode::OK {
        return;
    }
    let got = shown.entries(&res.body);
    // A status (a tweet, by itself or by a retweet) is at most once in a newsfeed: in any one
    // answer, at least (a client may hold an entry that an undone retweet left behind).
    // (A user's tweets may list a tweet and the author's own retweet of it.)
    if let Some((status, by)) =
        repeated_status(&res.body).filter(|_| matches!(shown, Shown::Newsfeed))
    {
        world.record.violate(
            format!(
                "at most once: {shown:?} of actor {actor} lists tweet {status} twice (as tweets {by:?}), on {uri}"
            ),
            std::iter::once(status).chain(by).collect(),
        );
        return;
    }
    let held: HashSet<i64> = view.held.iter().map(|e| e.0).collect();
    for e in &got {
        if held.contains(&e.0) {
            world.record.violate(
                format!("exactly once: {shown:?} of actor {actor} delivered entry {} (tweet {}, {}) again, on {uri}", e.0, e.2, e.1),
                vec![e.0, e.2],
            );
            return;
        }
    }
    if newer {
        if res.body["has_next_page"].as_bool() == Some(true) {
            view.held.clear(); // the server says: reload from the top
        }
        let mut all = got;
        all.append(&mut view.held);
        view.held = all;
    } else {
        view.held.extend(got);
    }
}

/// A tweet a page's results show twice, each by itself or by a retweet of it, if any, with the
/// ids of the two tweets (itself or retweets of it) that show it.
fn repeated_status(body: &Value) -> Option<(i64, Vec<i64>)> {
    let mut seen: HashMap<i64, i64> = HashMap::new();
    for r in body["results"].as_array().into_iter().flatten() {
        let tweet = r.get("tweet").unwrap_or(r);
        let id = tweet["id"].as_i64()?;
        let status = tweet["retweeted_tweet"]["id"].as_i64().unwrap_or(id);
        if let Some(first) = seen.insert(status, id) {
            return Some((status, vec![first, id]));
        }
    }
    None
}

/// The tweets of `shown` (a user's or a circle's, whose entries are tweets) from `oldest` up to
/// `newest` (if given), in Postgres: `(entry id, tweet id)`; `None` for the newsfeed or a time
/// that does not parse.
async fn tweets_between(
    db: &PgPool,
    shown: Shown,
    oldest: &str,
    newest: Option<&str>,
) -> Option<Vec<(i64, i64)>> {
    let parse = |t: &str| {
        chrono::DateTime::parse_from_rfc3339(t)
            .ok()
            .map(|t| t.with_timezone(&chrono::Utc))
    };
    let (oldest, newest) = (parse(oldest)?, newest.map(parse));
    let (query, owner) = match shown {
        Shown::Newsfeed => return None,
        Shown::UserTweets(author) => (
            "select id, id from tweets where user_id = $1 and created_at >= $2
               and ($3::timestamptz is null or created_at <= $3)",
            author,
        ),
        Shown::Circle(circle) => (
            "select id, id from tweets where circle_id = $1 and created_at >= $2
               and ($3::timestamptz is null or created_at <= $3)",
            circle,
        ),
        // `TAGS[k]` is `h{k}`.
        Shown::Tag(k) => (
            "select t.id, t.id from tweet_hashtags th join tweets t on t.id = th.tweet_id
             where th.hashtag_id = (select id from hashtags where name = 'h' || $1::bigint)
               and th.created_at >= $2 and ($3::timestamptz is null or th.created_at <= $3)",
            i64::try_from(k).ok()?,
        ),
    };
    Some(
        sqlx::query_as(query)
            .bind(owner)
            .bind(oldest)
            .bind(newest.flatten())
            .fetch_all(db)
            .await
            .unwrap_or_default(),
    )
}

/// **None missed, at any time**, for a view whose entries are tweets (a user's, a circle's or a
/// tag's):
/// they become visible in the order of their times, so every tweet from the oldest to the
/// newest the view holds that Postgres has now had committed by the view's last read, and the
/// view holds it (one deleted since is simply gone). Checked whenever a view is dropped (a
/// reload, or another timeline), besides the final check of a quiet history.
async fn check_complete(world: &World, actor: usize, shown: Shown, view: &View) {
    let (Some(newest), Some(oldest)) = (view.held.first(), view.held.last()) else {
        return;
    };
    let db = world.app(0).db();
    let Some(rows) = tweets_between(db, shown, &oldest.1, Some(&newest.1)).await else {
        return;
    };
    let held: HashSet<i64> = view.held.iter().map(|e| e.0).collect();
    if let Some((entry, _)) = rows.iter().find(|(entry, _)| !held.contains(entry)) {
        world.record.violate(
            format!(
                "exactly once: {shown:?} of actor {actor} missed tweet {entry}, between the \
                 oldest ({}) and the newest ({}) it holds",
                oldest.1, newest.1
            ),
            vec![*entry],
        );
    }
}

/// The checks of a quiet history: every view complete after a final refresh, counts exact,
/// `chirp check-cache` clean.
async fn quiet_checks(world: &World, actors: &mut [Actor]) {
    // Let the jobs and the relays finish.
    for _ in 0..100 {
        let pending: i64 = sqlx::query_scalar("select (select count(*) from jobs where failed_at is null) + (select count(*) from cache_outbox)")
            .fetch_one(world.app(0).db())
            .await
            .unwrap_or(1);
        if pending == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let db = world.app(0).db().clone();
    for me in actors.iter_mut() {
        let token = me.token.clone();
        let mut views = vec![(Shown::Newsfeed, std::mem::take(&mut me.feed), Some(token))];
        if let Some((shown, view)) = me.tweets_view.take() {
            views.push((shown, view, None));
        }
        if let Some((shown, view)) = me.circle_view.take() {
            views.push((shown, view, Some(me.token.clone())));
        }
        for (shown, mut view, token) in views {
            let Some(oldest) = view.held.last().map(|e| e.1.clone()) else {
                continue;
            };
            // A final refresh (the random step may choose a page: force the refresh).
            let newest = view.held.first().map(|e| e.1.clone()).unwrap_or_default();
            let uri = format!("{}created_at__gt={}", shown.uri(), urlencode(&newest));
            let res = world
                .call(me.index, 0, Req::get(&uri, token.as_deref(), vec![]))
                .await;
            if res.body["has_next_page"].as_bool() == Some(true) {
                continue; // more than a refresh returns: a client reloads from the top
            }
            let got = shown.entries(&res.body);
            let held: HashSet<i64> = view.held.iter().map(|e| e.0).collect();
            if let Some(e) = got.iter().find(|e| held.contains(&e.0)) {
                world.record.violate(
                    format!("exactly once: the final refresh of {shown:?} of actor {} delivered entry {} again", me.index, e.0),
                    vec![e.0, e.2],
                );
                return;
            }
            view.held.splice(0..0, got);
            let held: HashSet<i64> = view.held.iter().map(|e| e.0).collect();
            let oldest_text = oldest;
            let oldest = chrono::DateTime::parse_from_rfc3339(&oldest_text)
                .map(|t| t.with_timezone(&chrono::Utc));
            let Ok(oldest) = oldest else { continue };
            let expected: Vec<(i64, i64)> = match shown {
                // The newsfeed's meaning: its rows and the pulled tweets it shows.
                Shown::Newsfeed => {
                    let after = oldest - chrono::Duration::microseconds(1);
                    chirp::newsfeeds::page(&db, me.id, None, Some(after), 100_000)
                        .await
                        .unwrap_or_default()
                        .iter()
                        .map(|r| (r.entry_id, r.tweet_id))
                        .collect()
                }
                shown => tweets_between(&db, shown, &oldest_text, None)
                    .await
                    .unwrap_or_default(),
            };
            if let Some((entry, tweet)) = expected.iter().find(|(e, _)| !held.contains(e)) {
                world.record.violate(
                    format!("exactly once: {shown:?} of actor {} never received entry {entry} (tweet {tweet}), which is above its oldest held", me.index),
                    vec![*entry, *tweet],
                );
                return;
            }
        }
    }
    // At most once: each newsfeed (its rows and the pulled tweets it shows) shows a tweet by
    // one entry, by itself or by one retweet of it.
    for me in actors.iter() {
        let rows = chirp::newsfeeds::page(&db, me.id, None, None, 100_000)
            .await
            .unwrap_or_default();
        let mut seen = HashMap::new();
        for r in &rows {
            let status = r.retweeted_tweet_id.unwrap_or(r.tweet_id);
            if let Some(first) = seen.insert(status, r.entry_id) {
                world.record.violate(
                    format!(
                        "at most once: the newsfeed of actor {} shows tweet {status} by entries \
                         {first} and {}",
                        me.index, r.entry_id
                    ),
                    vec![status, first, r.entry_id],
                );
                return;
            }
        }
    }
    // Counts: every process shows each tweet's exact like, retweet and reply counts.
    let counts: Vec<(i64, i64, i64, i64)> = sqlx::query_as(
        "select t.id, (select count(*) from tweet_likes l where l.tweet_id = t.id),
                (select count(*) from tweets r where r.retweeted_tweet_id = t.id),
                (select count(*) from tweets r where r.in_reply_to_tweet_id = t.id)
         from tweets t",
    )
    .fetch_all(&db)
    .await
    .unwrap_or_default();
    for (id, likes, retweets, replies) in counts {
        for n in 0..NODES {
            let res = world
                .call(
                    usize::MAX,
                    n,
                    Req::get(&format!("/api/tweets/{id}/"), None, vec![id]),
                )
                .await;
            let shown = (
                res.body["likes_count"].as_i64(),
                res.body["retweets_count"].as_i64(),
                res.body["replies_count"].as_i64(),
            );
            if shown != (Some(likes), Some(retweets), Some(replies)) {
                world.record.violate(
                    format!(
                        "counts: tweet {id} has {likes} likes, {retweets} retweets and {replies} \
                         replies; node {n} shows {shown:?}"
                    ),
                    vec![id],
                );
                return;
            }
        }
    }
    // Redis in use again (a last fault may have left it marked down until the monitor's next
    // recovery, every 500 ms), then `chirp check-cache`.
    let cache = &world.app(0).state.cache;
    let mut checked = Err(anyhow::anyhow!("redis not back in use within 10 s"));
    for _ in 0..100 {
        if cache.available() {
            checked = chirp::check::run(&db, cache).await;
            if checked.is_ok() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !cache.available() {
        checked = Err(anyhow::anyhow!(
            "redis not back in use within 10 s (marked up: {}, hand-off lease held: {:?}, \
             the last recovery's failure: {:?})",
            cache.marked_up(),
            cache.hand_offs().map(|h| h.lease().held()),
            cache.recovery_failure()
        ));
    }
    match checked {
        Ok(report) if report.differences.is_empty() => {}
        Ok(report) => world
            .record
            .violate(format!("chirp check-cache: {report}"), vec![]),
        Err(e) => world
            .record
            .violate(format!("chirp check-cache failed: {e}"), vec![]),
    }
}

/// The seed of this run: `CHIRP_MODEL_SEED`, else a fresh one.
fn seed() -> u64 {
    std::env::var("CHIRP_MODEL_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| rand::rng().random())
}

/// One random history of `CHIRP_MODEL_SECONDS` (default `seconds`) from [`seed`]; panics with
/// the report of a violation.
async fn random_history(db: PgPool, seconds: u64) {
    let seconds = std::env::var("CHIRP_MODEL_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(seconds);
    let seed = seed();
    eprintln!("history checker: seed {seed}, {seconds} s");
    if let Some(report) = run_history(db, seed, seconds).await {
        panic!("{report}");
    }
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn random_histories_with_faults_keep_every_client_view_exact(db: PgPool) {
    random_history(db, 20).await;
}

/// `scripts/model`'s runs: the same, under a name of its own. sqlx names a test's database after
/// the test, so a long run and a `scripts/test` on the same Postgres would otherwise drop each
/// other's database (the one that starts second fails to set up).
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
#[ignore = "long: scripts/model runs it"]
async fn long_random_histories(db: PgPool) {
    random_history(db, 600).await;
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn the_regression_seeds_find_nothing(db: PgPool) {
    for seed in REGRESSION_SEEDS
        .lines()
        .filter_map(|l| l.split('#').next())
        .filter_map(|l| l.trim().parse::<u64>().ok())
    {
        // A fresh database per seed would be cleaner; the actors' names differ per run.
        sqlx::query("truncate users, tweets, newsfeeds, friendships, jobs, cache_outbox cascade")
            .execute(&db)
            .await
            .expect("truncate");
        if let Some(report) = run_history(db.clone(), seed, REGRESSION_SECONDS).await {
            panic!("{report}");
        }
    }
}
