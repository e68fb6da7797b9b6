//! Test harness: a chirp app over the per-test database that `#[sqlx::test]` creates, with its own
//! Redis key prefix, driven in-process with `tower::ServiceExt::oneshot`.

use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use chirp::cache::outbox;
use chirp::config::{CacheMode, Config};
use chirp::state::AppState;
use chirp::timeline::Timeline;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sqlx::PgPool;
use tower::ServiceExt;
use tower_http::normalize_path::NormalizePath;

pub use proxy::{Proxy, PubSub};

/// Whose counts (for looking into Redis).
#[derive(Debug, Clone, Copy)]
pub enum CountsOf {
    Tweet(i64),
    User(i64),
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// The Redis every test uses (`REDIS_URL`, default the local one).
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

/// A Redis key prefix no other test (or earlier run) uses.
pub fn unique_prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "chirptest_{}_{nanos}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Test configuration: defaults, a unique prefix, a short TTL so leftovers expire.
pub fn test_config() -> Config {
    let mut config = Config::defaults();
    config.redis_url = redis_url();
    config.redis_prefix = unique_prefix();
    config.cache_ttl_secs = 600;
    config.rate_limits = chirp::http::limits::RateLimits::off();
    // Dozens of tests share two cores (and, under `--cluster`, six Redis servers): a 300 ms
    // lease lapses now and then, which clears a process's memory while a test asserts what it
    // holds. Tests of a lease's expiry set their own.
    config.near_lease_ms = 1000;
    config.media_store = std::env::temp_dir()
        .join(format!("{}-media", config.redis_prefix))
        .to_string_lossy()
        .into_owned();
    config
}

pub struct TestApp {
    pub state: AppState,
    pub app: NormalizePath<Router>,
    pub prefix: String,
}

/// A response: status and JSON body (`Value::Null` if the body is not JSON).
pub struct Res {
    pub status: StatusCode,
    pub body: Value,
}

impl TestApp {
    /// An app with the cache on and Redis in use.
    pub async fn new(db: PgPool) -> Self {
        Self::with(db, |_| {}).await
    }

    /// An app with a modified test configuration.
    pub async fn with(db: PgPool, tweak: impl FnOnce(&mut Config)) -> Self {
        let mut config = test_config();
        tweak(&mut config);
        if config.redis_url != redis_url() {
            // The test points chirp at a Redis of its own (a proxy, a private server): one node.
            config.redis_cluster.clear();
        }
        let prefix = config.redis_prefix.clone();
        let wants_cache = config.cache == CacheMode::On;
        // What `chirp serve` does at start with the cache off.
        chirp::startup::forget_epoch_if_off(&db, &config)
            .await
            .expect("epoch");
        let state = AppState::new(db, config).expect("state");
        if wants_cache {
            // What the monitor does at start; false when Redis is unreachable on purpose.
            outbox::recover(&state.cache, &state.db).await;
        }
        let app = chirp::http::app(state.clone());
        TestApp { state, app, prefix }
    }

    pub fn db(&self) -> &PgPool {
        &self.state.db
    }

    pub async fn request(
        &self,
        method: Method,
        uri: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Res {
        let mut req = Request::builder().method(method).uri(uri);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = match body {
            Some(b) => req
                .header("content-type", "application/json")
                .body(Body::from(b.to_string())),
            None => req.body(Body::empty()),
        }
        .expect("request");
        self.send(req).await
    }

    pub async fn send(&self, req: Request<Body>) -> Res {
        let res = self.app.clone().oneshot(req).await.expect("infallible");
        let status = res.status();
        let bytes = res.into_body().collect().await.expect("body").to_bytes();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Res { status, body }
    }

    /// A `GET` whose body is not JSON: the status, the content type and the body's text.
    pub async fn get_text(&self, uri: &str) -> (StatusCode, String, String) {
        let req = Request::builder()
            .uri(uri)
            .body(Body::empty())
            .expect("request");
        let res = self.app.clone().oneshot(req).await.expect("infallible");
        let status = res.status();
        let kind = (res.headers().get("content-type"))
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let bytes = res.into_body().collect().await.expect("body").to_bytes();
        (
            status,
            kind,
            String::from_utf8(bytes.to_vec()).expect("utf-8"),
        )
    }

    pub async fn get(&self, uri: &str, token: Option<&str>) -> Res {
        self.request(Method::GET, uri, token, None).await
    }

    pub async fn delete(&self, uri: &str, token: Option<&str>) -> Res {
        self.request(Method::DELETE, uri, token, None).await
    }

    pub async fn post(&self, uri: &str, token: Option<&str>, body: Value) -> Res {
        self.request(Method::POST, uri, token, Some(body)).await
    }

    /// [`TestApp::post`] that must answer `status`; returns the answer's body.
    pub async fn post_expecting(
        &self,
        status: StatusCode,
        uri: &str,
        token: Option<&str>,
        body: Value,
    ) -> Value {
        let res = self.post(uri, token, body).await;
        assert_eq!(res.status, status, "{}", res.body);
        res.body
    }

    /// Signs up `name` and returns `(id, token)`.
    pub async fn signup(&self, name: &str) -> (i64, String) {
        let body = json!({"username": name, "email": format!("{name}@example.com"), "password": "correct horse"});
        let body = self
            .post_expecting(StatusCode::CREATED, "/api/accounts/signup/", None, body)
            .await;
        (
            body["user"]["id"].as_i64().expect("id"),
            body["token"].as_str().expect("token").to_owned(),
        )
    }

    /// Posts a tweet and returns its JSON.
    pub async fn tweet(&self, token: &str, content: &str) -> Value {
        let body = json!({"content": content});
        self.post_expecting(StatusCode::CREATED, "/api/tweets/", Some(token), body)
            .await
    }

    /// Posts `n` tweets `"{prefix}0"`, `"{prefix}1"`, … and returns their ids, oldest first.
    pub async fn tweets(&self, token: &str, prefix: &str, n: usize) -> Vec<i64> {
        let mut ids = Vec::with_capacity(n);
        for i in 0..n {
            let tweet = self.tweet(token, &format!("{prefix}{i}")).await;
            ids.push(tweet["id"].as_i64().expect("id"));
        }
        ids
    }

    /// Comments on a tweet and returns the comment's id.
    pub async fn comment(&self, token: &str, tweet: i64, content: &str) -> i64 {
        let body = json!({"tweet_id": tweet, "content": content});
        let body = self
            .post_expecting(StatusCode::CREATED, "/api/comments/", Some(token), body)
            .await;
        body["id"].as_i64().expect("id")
    }

    /// Likes a `tweet` or a `comment`.
    pub async fn like(&self, token: &str, kind: &str, id: i64) {
        let body = json!({"content_type": kind, "object_id": id});
        self.post_expecting(StatusCode::CREATED, "/api/likes/", Some(token), body)
            .await;
    }

    /// Cancels a like of a `tweet` or a `comment`; returns how many likes it deleted (0 or 1).
    pub async fn unlike(&self, token: &str, kind: &str, id: i64) -> i64 {
        let body = json!({"content_type": kind, "object_id": id});
        let body = self
            .post_expecting(StatusCode::OK, "/api/likes/cancel/", Some(token), body)
            .await;
        body["deleted"].as_i64().expect("deleted")
    }

    pub async fn follow(&self, token: &str, target: i64) {
        let uri = format!("/api/friendships/{target}/follow/");
        self.post_expecting(StatusCode::CREATED, &uri, Some(token), json!({}))
            .await;
    }

    /// Runs every ready job (fan-out, backfill, unmerge) to completion.
    pub async fn drain(&self) -> usize {
        self.state.worker.run_until_idle().await.expect("jobs")
    }

    /// A direct connection to the Redis (or Redis Cluster) this app uses, to look at what the
    /// cache holds; on a cluster each command goes to its key's node.
    pub async fn redis(&self) -> chirp::cache::Session {
        let config = &self.state.config;
        let conn = if config.redis_cluster.is_empty() {
            let client = redis::Client::open(config.redis_url.as_str()).expect("url");
            chirp::cache::Conn::Single(
                redis::aio::ConnectionManager::new(client)
                    .await
                    .expect("redis"),
            )
        } else {
            let client =
                redis::cluster::ClusterClient::new(config.redis_cluster.clone()).expect("urls");
            chirp::cache::Conn::Cluster(client.get_async_connection().await.expect("cluster"))
        };
        chirp::cache::Session::new(conn, None)
    }

    /// A subscription to one of this app's pub/sub topics (`{p}:{bus}:{topic}`), on the Redis
    /// (or any node of the Redis Cluster) it uses.
    pub async fn subscribe(&self, topic: &str) -> redis::aio::PubSub {
        let config = &self.state.config;
        let url = config
            .redis_cluster
            .first()
            .cloned()
            .unwrap_or_else(|| config.redis_url.clone());
        let mut pubsub = redis::Client::open(url)
            .expect("url")
            .get_async_pubsub()
            .await
            .expect("pubsub");
        pubsub
            .subscribe(self.state.cache.topic(topic).expect("cache on"))
            .await
            .expect("subscribe");
        pubsub
    }

    pub fn list_key(&self, timeline: Timeline) -> String {
        self.state
            .cache
            .keys()
            .expect("cache on")
            .list(timeline.key())
    }

    /// The Redis key of any cached list, rank or set.
    pub fn list_key_of(&self, list: chirp::cache::ListKey) -> String {
        self.state.cache.keys().expect("cache on").list(list)
    }

    /// Members of a cached list, newest first (`None`: not cached), decoded to text: newsfeeds
    /// `"{id}:{tweet_id}"`, every other timeline `"{tweet_id}"`, the marker `"#"`.
    pub async fn cached_members(&self, list: Timeline) -> Option<Vec<String>> {
        let mut r = self.redis().await;
        let key = self.list_key(list);
        let exists: bool = redis::cmd("EXISTS")
            .arg(&key)
            .query_async(&mut r)
            .await
            .expect("exists");
        if !exists {
            return None;
        }
        let raw: Vec<Vec<u8>> = redis::cmd("ZREVRANGE")
            .arg(&key)
            .arg(0)
            .arg(-1)
            .query_async(&mut r)
            .await
            .expect("zrange");
        Some(
            raw.iter()
                .map(|m| match list.parse(m) {
                    _ if m == b"#" => "#".to_owned(),
                    Some(e) => match list {
                        Timeline::Newsfeed(_) => format!("{}:{}", e.id, e.tweet_id),
                        _ => e.tweet_id.to_string(),
                    },
                    None => format!("undecodable {m:?}"),
                })
                .collect(),
        )
    }

    /// Deletes every key of this app's prefix (as `FLUSHALL` would, without touching other tests).
    pub async fn flush_cache(&self) {
        let mut r = self.redis().await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", self.prefix))
            .query_async(&mut r)
            .await
            .expect("keys");
        if !keys.is_empty() {
            let _: () = redis::cmd("DEL")
                .arg(&keys)
                .query_async(&mut r)
                .await
                .expect("del");
        }
    }

    /// Creates a list of `token`'s user named `name`; returns its id.
    pub async fn new_list(&self, token: &str, name: &str) -> i64 {
        let body = json!({"name": name, "description": "people"});
        let body = self
            .post_expecting(StatusCode::CREATED, "/api/lists/", Some(token), body)
            .await;
        body["id"].as_i64().expect("id")
    }

    /// Adds `user` to `list` as its owner (`token`); returns the membership's body.
    pub async fn add_to_list(&self, token: &str, list: i64, user: i64) -> Value {
        let uri = format!("/api/lists/{list}/members/");
        let body = json!({"user_id": user});
        self.post_expecting(StatusCode::CREATED, &uri, Some(token), body)
            .await
    }

    /// Creates a user directly (no password hashing) with a token: for tests that need many.
    pub async fn quick_user(&self, name: &str) -> (i64, String) {
        let id: i64 = sqlx::query_scalar(
            "insert into users (username, email, password_hash) values ($1, $1 || '@example.com', '!') returning id",
        )
        .bind(name)
        .fetch_one(self.db())
        .await
        .expect("user");
        (
            id,
            chirp::accounts::issue_token(self.db(), id)
                .await
                .expect("token"),
        )
    }

    /// What the cache monitor does every 500 ms until Redis answers: replay the outbox, then use
    /// Redis again. The connection reconnects lazily, so this may take a few tries.
    pub async fn recover(&self) -> bool {
        for _ in 0..50 {
            if outbox::recover(&self.state.cache, &self.state.db).await {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        false
    }

    /// The Redis key of an object's counts.
    pub fn counts_key(&self, of: CountsOf) -> String {
        let keys = self.state.cache.keys().expect("cache on");
        match of {
            CountsOf::Tweet(id) => keys.tweet_counts(id),
            CountsOf::User(id) => keys.user_counts(id),
        }
    }

    /// The counter values Redis holds for an object, without the version (`None`: not cached).
    pub async fn cached_counts(&self, of: CountsOf) -> Option<Vec<i64>> {
        let mut r = self.redis().await;
        let raw: Option<String> = redis::cmd("GET")
            .arg(self.counts_key(of))
            .query_async(&mut r)
            .await
            .expect("get");
        raw.map(|v| {
            v.split('|')
                .skip(1)
                .map(|n| n.parse().expect("count"))
                .collect()
        })
    }

    /// Rows left in the cache outbox, once this process's deleter took the applied ones
    /// (`Cache::forgotten`).
    pub async fn outbox_rows(&self) -> i64 {
        self.state.cache.forgotten().await;
        sqlx::query_scalar("select count(*) from cache_outbox")
            .fetch_one(self.db())
            .await
            .expect("outbox")
    }

    /// What the relay does for rows whose writer died: applies every row, whatever its age.
    pub async fn relay(&self) -> usize {
        outbox::relay(&self.state.cache, self.db(), std::time::Duration::ZERO)
            .await
            .expect("relay")
    }

    /// Deletes `token`'s key from Redis (as an eviction would): the next request with it that
    /// this process's memory does not answer reads it back from Postgres.
    pub async fn drop_token_from_redis(&self, token: &str) {
        let mut r = self.redis().await;
        let key = self.keys().token(&chirp::accounts::hash_token(token));
        let _: () = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut r)
            .await
            .expect("del");
    }

    /// Logs `token` out on this process and asserts that `other` refuses it at once (401),
    /// with `what` in the failure's message.
    pub async fn logout_refused_on(&self, other: &TestApp, token: &str, what: &str) {
        let res = self
            .post("/api/accounts/logout/", Some(token), json!({}))
            .await;
        assert_eq!(res.status, StatusCode::OK, "{what}: {}", res.body);
        let res = other.get("/api/accounts/login_status/", Some(token)).await;
        assert_eq!(res.status, StatusCode::UNAUTHORIZED, "{what}: {}", res.body);
    }

    /// The raw value of a Redis key.
    pub async fn raw_get(&self, key: &str) -> Option<String> {
        let mut r = self.redis().await;
        redis::cmd("GET")
            .arg(key)
            .query_async(&mut r)
            .await
            .expect("get")
    }

    pub fn keys(&self) -> chirp::cache::Keys {
        self.state.cache.keys().expect("cache on").clone()
    }

    /// How many Redis round trips (pipelines) this process's cache has made so far
    /// (`chirp_redis_round_trip_seconds_count`). A test app runs no background task of its own,
    /// so between two reads of this, only the requests in between count.
    pub fn redis_round_trips(&self) -> u64 {
        let stats = self.state.cache.stats().expect("cache on");
        let round_trips = stats.round_trips.get().expect("metrics registered");
        round_trips.redis.get_sample_count()
    }

    pub fn stat(&self, name: &str) -> u64 {
        let s = self.state.cache.stats().expect("cache on");
        let counter = match name {
            "hits" => &s.hits,
            "misses" => &s.misses,
            "loads" => &s.loads,
            "extensions" => &s.extensions,
            "fallbacks" => &s.fallbacks,
            "fences" => &s.fences,
            "prefetched" => &s.prefetched,
            "merged" => &s.merged,
            "merge_fallbacks" => &s.merge_fallbacks,
            "outbox_forgotten" => &s.outbox_forgotten,
            "outbox_deletes" => &s.outbox_deletes,
            "fill_objects_held" => &s.fill_objects_held,
            // Tokens asked of Redis (this process's memory did not answer).
            "token_lookups" => {
                return s.token_hits.load(Ordering::Relaxed)
                    + s.token_misses.load(Ordering::Relaxed);
            }
            _ => &s.errors,
        };
        counter.load(Ordering::Relaxed)
    }
}

/// Polls `check` every 50 ms until it holds; panics after 10 s.
/// A random generator for a randomized test and its seed: from the environment variable `var`
/// if set (to re-run a failure), else random; prints the seed so a failure can be re-run.
pub fn seeded_rng(var: &str, what: &str) -> (u64, rand::rngs::StdRng) {
    use rand::SeedableRng;
    let seed: u64 = std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{what} seed {seed} (re-run: {var}={seed})");
    (seed, rand::rngs::StdRng::seed_from_u64(seed))
}

pub async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..200 {
        if check().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("timed out waiting until {what}");
}

/// Makes requests with `token` on `app` until one is answered from the process's token memory.
pub async fn token_held_in_memory(app: &TestApp, token: &str) {
    let hits = || app.state.tokens.stats.hits.load(Ordering::Relaxed);
    let before = hits();
    eventually("the token is answered from memory", async || {
        let res = app.get("/api/accounts/login_status/", Some(token)).await;
        assert_eq!(res.body["has_logged_in"], true);
        hits() > before
    })
    .await;
}

/// Waits until `n` backends of this test's database wait for a lock. Asks on a connection of
/// its own: the waiting backends may hold every connection of the app's pool.
pub async fn lock_waiters(app: &TestApp, n: i64) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect_with(&app.db().connect_options())
        .await
        .unwrap();
    eventually("backends wait for a lock", async || {
        let waiting: i64 = sqlx::query_scalar(
            "select count(*) from pg_stat_activity
             where datname = current_database() and wait_event_type = 'Lock'",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        waiting >= n
    })
    .await;
}

/// The tweet ids of `reader`'s cached newsfeed, newest first, without the completeness marker
/// (`None`: not cached).
pub async fn cached_feed_tweets(app: &TestApp, reader: i64) -> Option<Vec<i64>> {
    let members = app.cached_members(Timeline::Newsfeed(reader)).await?;
    Some(
        members
            .iter()
            .map(|m| member_tweet(m))
            .filter(|id| *id > 0)
            .collect(),
    )
}

/// The tweet id of a newsfeed list member (`"{newsfeed_id}:{tweet_id}:{author_id}"`).
pub fn member_tweet(member: &str) -> i64 {
    member
        .split(':')
        .nth(1)
        .and_then(|t| t.parse().ok())
        .unwrap_or(-1)
}

/// Rows an `EXPLAIN (ANALYZE, FORMAT JSON)` plan node and its children read from tables and
/// indexes (each scan's actual rows times its loops, functions' scans included).
pub fn rows_scanned(node: &Value) -> i64 {
    let own = if node["Node Type"]
        .as_str()
        .is_some_and(|t| t.contains("Scan"))
    {
        node["Actual Rows"].as_i64().unwrap_or(0) * node["Actual Loops"].as_i64().unwrap_or(1)
    } else {
        0
    };
    own + node["Plans"]
        .as_array()
        .map_or(0, |children| children.iter().map(rows_scanned).sum())
}

/// Ids of the tweets in a page of tweets or newsfeeds.
pub fn tweet_ids(page: &Value) -> Vec<i64> {
    page["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r.get("tweet").unwrap_or(r)["id"].as_i64().expect("id"))
        .collect()
}

/// A transaction holding user `id`'s row (`for update`): a write that locks it waits inside
/// its own transaction until this one ends.
pub async fn hold_user_row(app: &TestApp, id: i64) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut holder = app.db().begin().await.expect("begin");
    sqlx::query("select 1 from users where id = $1 for update")
        .bind(id)
        .execute(&mut *holder)
        .await
        .expect("lock the user's row");
    holder
}

/// Two processes on one Postgres and one Redis prefix (the first runs the jobs).
pub async fn two_processes(db: PgPool) -> (TestApp, TestApp) {
    let a = TestApp::new(db.clone()).await;
    let prefix = a.prefix.clone();
    let b = TestApp::with(db, |c| c.redis_prefix = prefix).await;
    (a, b)
}

/// Pages through a listing with `created_at__lt` until the end; returns tweet ids.
pub async fn page_all(
    app: &TestApp,
    base: &str,
    token: Option<&str>,
    page_size: usize,
) -> Vec<i64> {
    (page_tweets(app, base, token, page_size).await.iter())
        .map(|t| t["id"].as_i64().expect("id"))
        .collect()
}

/// [`page_all`], returning the Tweet objects (a newsfeed item's `tweet`).
pub async fn page_tweets(
    app: &TestApp,
    base: &str,
    token: Option<&str>,
    page_size: usize,
) -> Vec<Value> {
    let sep = if base.contains('?') { '&' } else { '?' };
    let mut uri = format!("{base}{sep}page_size={page_size}");
    let mut all = Vec::new();
    for _ in 0..10_000 {
        let res = app.get(&uri, token).await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.body);
        let results = res.body["results"].as_array().expect("results").clone();
        assert!(results.len() <= page_size);
        all.extend(results.iter().map(|r| r.get("tweet").unwrap_or(r).clone()));
        if !res.body["has_next_page"].as_bool().expect("has_next_page") {
            return all;
        }
        let last = results.last().expect("a full page has a last item")["created_at"]
            .as_str()
            .expect("ts")
            .to_owned();
        uri = format!(
            "{base}{sep}page_size={page_size}&created_at__lt={}",
            urlencode(&last)
        );
    }
    panic!("paging did not end");
}

pub fn urlencode(s: &str) -> String {
    s.replace('+', "%2B").replace(':', "%3A")
}

mod proxy {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::watch;

    use super::redis_url;

    /// What a [`Proxy`] does to the connections that subscribed (`SUBSCRIBE` to Redis or
    /// `LISTEN "…"` to Postgres went through them); data connections always pass (the faults
    /// of the review of 2026-11-26, finding 1).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum PubSub {
        /// Forward both ways.
        Pass,
        /// Forward nothing either way (Redis keeps the subscriber and counts it; its messages
        /// queue up), until set back to `Pass`.
        Stall,
        /// Close the connection on Redis's side only: Redis drops the subscriber, the process
        /// is told nothing (a load balancer's idle timeout, a lost host).
        HalfOpen,
    }

    /// A TCP proxy to Redis that can be cut (existing connections dropped, new ones refused),
    /// or break only the pub/sub connections ([`PubSub`]).
    pub struct Proxy {
        port: u16,
        up: Arc<AtomicBool>,
        cut: watch::Sender<u64>,
        pubsub: watch::Sender<PubSub>,
        /// Connections this proxy left half-open.
        half_opened: Arc<AtomicUsize>,
    }

    /// Client sockets of half-open connections, kept open (no FIN) for the test's life.
    static HALF_OPEN: Mutex<Vec<std::net::TcpStream>> = Mutex::new(Vec::new());

    impl Proxy {
        pub async fn start() -> Self {
            Self::to(&redis_url()).await
        }

        /// A proxy to the Redis at `url` (`redis://host:port/…`).
        pub async fn to(url: &str) -> Self {
            let target = url
                .trim_start_matches("redis://")
                .split('/')
                .next()
                .unwrap()
                .to_owned();
            Self::to_addr(target).await
        }

        /// A proxy to the Postgres `db` connects to, and a pool of `db`'s database through it.
        pub async fn to_postgres(db: &sqlx::PgPool) -> (Self, sqlx::PgPool) {
            let options = (*db.connect_options()).clone();
            let proxy =
                Self::to_addr(format!("{}:{}", options.get_host(), options.get_port())).await;
            let through = options.host("127.0.0.1").port(proxy.port);
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(4)
                .connect_lazy_with(through);
            (proxy, pool)
        }

        async fn to_addr(target: String) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let up = Arc::new(AtomicBool::new(true));
            let (cut, _) = watch::channel(0u64);
            let (pubsub, _) = watch::channel(PubSub::Pass);
            let (up_, cut_, pubsub_) = (up.clone(), cut.clone(), pubsub.clone());
            let half_opened = Arc::new(AtomicUsize::new(0));
            let half_opened_ = half_opened.clone();
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    if !up_.load(Ordering::SeqCst) {
                        continue; // dropped: the client sees the connection close
                    }
                    let Ok(server) = TcpStream::connect(&target).await else {
                        continue;
                    };
                    tokio::spawn(connection(
                        client,
                        server,
                        cut_.subscribe(),
                        pubsub_.subscribe(),
                        half_opened_.clone(),
                    ));
                }
            });
            Proxy {
                port,
                up,
                cut,
                pubsub,
                half_opened,
            }
        }

        /// How many connections this proxy has left half-open so far.
        pub fn half_opened(&self) -> usize {
            self.half_opened.load(Ordering::SeqCst)
        }

        pub fn url(&self) -> String {
            format!("redis://127.0.0.1:{}/0", self.port)
        }

        pub fn set_up(&self, up: bool) {
            self.up.store(up, Ordering::SeqCst);
            if !up {
                self.cut.send_modify(|n| *n += 1);
            }
        }

        /// What happens to pub/sub connections from now on (also to those opened later).
        pub fn set_pubsub(&self, mode: PubSub) {
            self.pubsub.send_replace(mode);
        }
    }

    async fn connection(
        client: TcpStream,
        server: TcpStream,
        mut cut: watch::Receiver<u64>,
        mut mode: watch::Receiver<PubSub>,
        half_opened: Arc<AtomicUsize>,
    ) {
        // A second handle on the client's socket: dropping the streams below then closes only
        // Redis's side, if the connection is to be left half-open.
        let Ok(client) = client.into_std() else {
            return;
        };
        let Ok(keep) = client.try_clone() else { return };
        let Ok(client) = TcpStream::from_std(client) else {
            return;
        };
        let subscriber = Arc::new(AtomicBool::new(false));
        // `tokio::io::split`, not `into_split`: dropping its write half sends no FIN.
        let (client_read, client_write) = tokio::io::split(client);
        let (server_read, server_write) = server.into_split();
        let up = pump(
            client_read,
            server_write,
            subscriber.clone(),
            true,
            mode.clone(),
        );
        let down = pump(
            server_read,
            client_write,
            subscriber.clone(),
            false,
            mode.clone(),
        );
        let half_open = async {
            loop {
                if subscriber.load(Ordering::SeqCst) && *mode.borrow() == PubSub::HalfOpen {
                    return;
                }
                tokio::select! {
                    changed = mode.changed() => if changed.is_err() { std::future::pending::<()>().await },
                    _ = tokio::time::sleep(std::time::Duration::from_millis(20)) => {}
                }
            }
        };
        tokio::select! {
            _ = up => {}
            _ = down => {}
            _ = cut.changed() => {}
            _ = half_open => {
                HALF_OPEN.lock().unwrap_or_else(|p| p.into_inner()).push(keep);
                half_opened.fetch_add(1, Ordering::SeqCst);
                return;
            }
        }
        let _ = keep.shutdown(std::net::Shutdown::Both);
    }

    /// Copies `from` to `to`; on a subscriber connection, only while the mode is `Pass`.
    async fn pump(
        mut from: impl tokio::io::AsyncRead + Unpin,
        mut to: impl tokio::io::AsyncWrite + Unpin,
        subscriber: Arc<AtomicBool>,
        sniff: bool,
        mut mode: watch::Receiver<PubSub>,
    ) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if sniff
                && (buf[..n]
                    .windows(9)
                    .any(|w| w.eq_ignore_ascii_case(b"SUBSCRIBE"))
                    || buf[..n].windows(8).any(|w| w == b"LISTEN \""))
            {
                subscriber.store(true, Ordering::SeqCst);
            }
            while subscriber.load(Ordering::SeqCst) && *mode.borrow() != PubSub::Pass {
                if mode.changed().await.is_err() {
                    return;
                }
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }
}

/// A private `redis-server` on a free port with its own data directory, which a test can
/// snapshot (`SAVE`) and restart from that snapshot.
pub struct RedisServer {
    pub port: u16,
    dir: std::path::PathBuf,
    child: Option<std::process::Child>,
}

impl RedisServer {
    pub async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let dir = std::env::temp_dir().join(format!("chirp-redis-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("redis dir");
        let mut server = RedisServer {
            port,
            dir,
            child: None,
        };
        server.spawn().await;
        server
    }

    async fn spawn(&mut self) {
        let child = std::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--dbfilename",
                "dump.rdb",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server must be installed (scripts/services installs it)");
        self.child = Some(child);
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("redis-server did not start");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    async fn cmd(&self, name: &str) {
        let mut conn = redis::Client::open(self.url())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("redis");
        let _: Result<redis::Value, _> = redis::cmd(name).query_async(&mut conn).await;
    }

    /// Writes a snapshot (`SAVE`) that a restart loads.
    pub async fn snapshot(&self) {
        self.cmd("SAVE").await;
    }

    /// Stops the server without saving and starts it again from the last snapshot.
    pub async fn restart_from_snapshot(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.spawn().await;
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One event as a client parses it.
#[derive(Debug, Clone)]
pub struct Ev {
    pub kind: String,
    pub id: Option<String>,
    pub data: Value,
}

/// A client of one stream, reading the response body frame by frame.
pub struct Stream {
    body: Body,
    pub buf: String,
    /// Comment lines seen (`:ok`, heartbeats).
    pub comments: usize,
    pub ended: bool,
    /// The last `id:` received, with or without an event (an EventSource's last event id:
    /// what a reconnect sends as `Last-Event-ID`).
    pub last_id: Option<String>,
}

impl Stream {
    /// Opens `uri` for `token` (with `Last-Event-ID` if given); panics unless it is a 200 whose
    /// first frame is the `:ok` comment.
    pub async fn open(
        app: &TestApp,
        uri: &str,
        token: &str,
        last_event_id: Option<&str>,
    ) -> Stream {
        match Self::try_open(app, uri, token, last_event_id).await {
            Ok(s) => s,
            Err((status, body)) => panic!("{uri}: {status} {body}"),
        }
    }

    pub async fn try_open(
        app: &TestApp,
        uri: &str,
        token: &str,
        last_event_id: Option<&str>,
    ) -> Result<Stream, (StatusCode, Value)> {
        let mut req = Request::get(uri).header("authorization", format!("Bearer {token}"));
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        let res = app
            .app
            .clone()
            .oneshot(req.body(Body::empty()).expect("request"))
            .await
            .expect("infallible");
        let status = res.status();
        if status != StatusCode::OK {
            let bytes = res.into_body().collect().await.expect("body").to_bytes();
            return Err((
                status,
                serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            ));
        }
        let mut s = Stream {
            body: res.into_body(),
            buf: String::new(),
            comments: 0,
            ended: false,
            last_id: None,
        };
        // The first frame is the `:ok` comment (with `streaming/user`'s place as its `id:`) or,
        // NDJSON, an empty line; it is consumed here.
        s.fill(std::time::Duration::from_secs(5)).await;
        if let Some(rest) = s.buf.strip_prefix(":ok\nretry: 2000\n") {
            let (id, rest) = match rest.strip_prefix("id: ") {
                Some(with_id) => with_id.split_once('\n').expect("a whole first frame"),
                None => ("", rest),
            };
            let rest = rest.strip_prefix('\n').expect("the first frame ends");
            s.last_id = (!id.is_empty()).then(|| id.to_owned());
            s.buf = rest.to_owned();
        } else if let Some(rest) = s.buf.strip_prefix('\n') {
            s.buf = rest.to_owned();
        } else {
            panic!("no :ok first: {:?}", s.buf);
        }
        Ok(s)
    }

    /// Reads one more chunk into the buffer; false on timeout or at the end.
    pub async fn fill(&mut self, within: std::time::Duration) -> bool {
        if self.ended {
            return false;
        }
        match tokio::time::timeout(within, self.body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    self.buf.push_str(&String::from_utf8_lossy(&data));
                }
                true
            }
            Ok(_) => {
                self.ended = true;
                false
            }
            Err(_) => false,
        }
    }

    /// The next event within `within`, skipping comments; `None` on timeout or at the end.
    pub async fn next(&mut self, within: std::time::Duration) -> Option<Ev> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            while let Some(end) = self.buf.find("\n\n") {
                let frame: String = self.buf.drain(..end + 2).collect();
                let mut ev = Ev {
                    kind: String::new(),
                    id: None,
                    data: Value::Null,
                };
                for line in frame.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        ev.kind = v.to_owned();
                    } else if let Some(v) = line.strip_prefix("id: ") {
                        ev.id = Some(v.to_owned());
                        self.last_id = Some(v.to_owned());
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        ev.data = serde_json::from_str(v).expect("data is JSON");
                    } else if line.starts_with(':') {
                        self.comments += 1;
                    }
                }
                if !ev.kind.is_empty() {
                    assert_eq!(ev.data["event"], ev.kind.as_str(), "{frame}");
                    return Some(ev);
                }
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() || !self.fill(left).await {
                return None;
            }
        }
    }

    /// Tweet events until `last` (a tweet id) arrives; panics if it does not within 5 s.
    pub async fn tweets_until(&mut self, last: i64) -> Vec<Ev> {
        let mut out = Vec::new();
        loop {
            let ev = self
                .next(std::time::Duration::from_secs(5))
                .await
                .unwrap_or_else(|| panic!("tweet {last} did not arrive; got {out:?}"));
            let done = ev.kind == "tweet" && ev.data["tweet"]["id"] == last;
            out.push(ev);
            if done {
                return out;
            }
        }
    }

    /// Whether the stream ends (the body finishes) within `within`, after any events.
    pub async fn ends_within(&mut self, within: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while !self.ended {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            self.fill(left).await;
        }
        true
    }
}
