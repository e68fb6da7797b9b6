//! Rate limits: shared through Redis by every process, per process while Redis is down.

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use chirp::http::limits::RateLimits;
use serde_json::json;
use sqlx::PgPool;
use tower::ServiceExt;

use crate::helpers::{Proxy, TestApp};

/// Posts a tweet and returns the status and headers.
async fn post_tweet(app: &TestApp, token: &str, n: usize) -> (StatusCode, HeaderMap) {
    let req = Request::post("/api/tweets/")
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"content": format!("tweet {n}")}).to_string(),
        ))
        .unwrap();
    let res = app.app.clone().oneshot(req).await.unwrap();
    (res.status(), res.headers().clone())
}

fn header(headers: &HeaderMap, name: &str) -> Option<i64> {
    headers.get(name)?.to_str().ok()?.parse().ok()
}

async fn tweets(app: &TestApp) -> i64 {
    sqlx::query_scalar("select count(*) from tweets")
        .fetch_one(app.db())
        .await
        .unwrap()
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn two_processes_share_one_limit_and_the_request_over_it_is_a_429(db: PgPool) {
    let limits = RateLimits::parse("tweet=3/m").unwrap();
    let first = TestApp::with(db.clone(), |c| c.rate_limits = limits.clone()).await;
    let prefix = first.prefix.clone();
    let second = TestApp::with(db, |c| {
        c.rate_limits = limits.clone();
        c.redis_prefix = prefix;
    })
    .await;
    let (_, token) = first.quick_user("poster").await;

    for (i, app) in [&first, &second, &first].into_iter().enumerate() {
        let (status, headers) = post_tweet(app, &token, i).await;
        assert_eq!(status, StatusCode::CREATED, "post {i}");
        assert_eq!(header(&headers, "x-ratelimit-limit"), Some(3));
        assert_eq!(
            header(&headers, "x-ratelimit-remaining"),
            Some(2 - i as i64)
        );
        assert!(header(&headers, "x-ratelimit-reset").is_some_and(|r| r > 0));
    }
    let (status, headers) = post_tweet(&second, &token, 3).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let retry = header(&headers, "retry-after").expect("Retry-After");
    assert!(
        (1..=20).contains(&retry),
        "one emission interval (20 s): {retry}"
    );
    assert_eq!(header(&headers, "x-ratelimit-remaining"), Some(0));
    assert_eq!(tweets(&first).await, 3, "the limited post stored nothing");
    // Reads have their own (default) limit, untouched by the posts.
    let res = first.get("/api/newsfeeds/", Some(&token)).await;
    assert_eq!(res.status, StatusCode::OK);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn with_redis_down_each_process_still_limits_and_nothing_fails(db: PgPool) {
    let proxy = Proxy::start().await;
    let app = TestApp::with(db, |c| {
        c.redis_url = proxy.url();
        c.redis_timeout_ms = 100;
        c.rate_limits = RateLimits::parse("tweet=2/m").unwrap();
    })
    .await;
    let (_, token) = app.quick_user("poster").await;
    proxy.set_up(false);
    for i in 0..2 {
        let (status, _) = post_tweet(&app, &token, i).await;
        assert_eq!(status, StatusCode::CREATED, "post {i}");
    }
    let (status, headers) = post_tweet(&app, &token, 2).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(header(&headers, "retry-after").is_some_and(|r| r >= 1));
    assert_eq!(tweets(&app).await, 2);
}

/// A request from `peer` (as the TCP peer address), with optional bearer token and headers.
fn from_peer(
    path: &str,
    peer: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
) -> Request<Body> {
    let mut req = Request::get(path);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let mut req = req.body(Body::empty()).unwrap();
    let addr: std::net::SocketAddr = format!("{peer}:40000").parse().unwrap();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(addr));
    req
}

async fn status_of(app: &TestApp, req: Request<Body>) -> (StatusCode, HeaderMap) {
    let res = app.app.clone().oneshot(req).await.unwrap();
    (res.status(), res.headers().clone())
}

/// A well-formed token no one was issued (43 base64url characters).
fn random_token(rng: &mut impl rand::Rng) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    (0..43)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Makes `token` valid in Postgres only (behind the caches' back): a lookup that reaches
/// Postgres finds it, one answered from a cache does not.
async fn issue_behind_the_cache(app: &TestApp, token: &str, user: i64) {
    sqlx::query("insert into auth_tokens (token_hash, user_id) values ($1, $2)")
        .bind(chirp::accounts::hash_token(token))
        .bind(user)
        .execute(app.db())
        .await
        .unwrap();
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn bad_tokens_are_limited_per_client_and_refused_before_any_lookup(db: PgPool) {
    let (seed, mut rng) = crate::helpers::seeded_rng("CHIRP_TEST_SEED", "bad tokens");
    let limits = RateLimits::parse("failed=5/m; read=off").unwrap();
    let app = TestApp::with(db, |c| c.rate_limits = limits.clone()).await;
    let (user, good) = app.quick_user("reader").await;
    // The good token is held in memory before the guessing starts.
    let (status, _) = status_of(
        &app,
        from_peer("/api/newsfeeds/", "10.9.9.9", Some(&good), &[]),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    crate::helpers::token_held_in_memory(&app, &good).await;

    let mut statuses = Vec::new();
    for _ in 0..40 {
        let token = random_token(&mut rng);
        let (status, headers) = status_of(
            &app,
            from_peer("/api/newsfeeds/", "10.9.9.9", Some(&token), &[]),
        )
        .await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert!(header(&headers, "retry-after").is_some_and(|r| r >= 1));
        }
        statuses.push(status.as_u16());
    }
    // Malformed tokens count too.
    let (status, _) = status_of(
        &app,
        from_peer("/api/newsfeeds/", "10.9.9.9", Some("short"), &[]),
    )
    .await;
    statuses.push(status.as_u16());
    let unauthorized = statuses.iter().filter(|s| **s == 401).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!(
        (unauthorized, limited),
        (5, 36),
        "seed {seed}: five failures, then 429: {statuses:?}"
    );
    // Over the limit, an unknown token is not looked up at all: one valid in Postgres only
    // is still refused...
    let fresh = random_token(&mut rng);
    issue_behind_the_cache(&app, &fresh, user).await;
    let (status, _) = status_of(
        &app,
        from_peer("/api/newsfeeds/", "10.9.9.9", Some(&fresh), &[]),
    )
    .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "seed {seed}");
    // ...while the token this process holds keeps working from the same address, and another
    // client is not limited by this one's failures.
    let (status, _) = status_of(
        &app,
        from_peer("/api/newsfeeds/", "10.9.9.9", Some(&good), &[]),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = status_of(
        &app,
        from_peer("/api/newsfeeds/", "10.7.7.7", Some(&fresh), &[]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "another client looks the token up");
    // A user who just signed up (the token is in Redis, not yet in this process's memory)
    // gets in from the guesser's address too.
    let (_, newcomer) = app.signup("newcomer").await;
    let (status, _) = status_of(
        &app,
        from_peer("/api/newsfeeds/", "10.9.9.9", Some(&newcomer), &[]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "a token Redis knows");
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_token_found_unknown_is_not_looked_up_in_postgres_again_by_any_process(db: PgPool) {
    let (seed, mut rng) = crate::helpers::seeded_rng("CHIRP_TEST_SEED", "unknown tokens");
    let first = TestApp::new(db.clone()).await;
    let prefix = first.prefix.clone();
    let second = TestApp::with(db, |c| c.redis_prefix = prefix).await;
    let (user, _) = first.quick_user("someone").await;
    let token = random_token(&mut rng);
    let res = first.get("/api/newsfeeds/", Some(&token)).await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED);
    // Were it looked up in Postgres again, it would now be found.
    issue_behind_the_cache(&first, &token, user).await;
    for (name, app) in [("the same process", &first), ("another process", &second)] {
        let res = app.get("/api/newsfeeds/", Some(&token)).await;
        assert_eq!(
            res.status,
            StatusCode::UNAUTHORIZED,
            "seed {seed}: {name} answered from the negative cache"
        );
    }
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn behind_a_trusted_proxy_each_client_has_its_own_limit(db: PgPool) {
    let app = TestApp::with(db, |c| {
        c.rate_limits = RateLimits::parse("read=3/m").unwrap();
        c.trusted_proxies = chirp::http::client_ip::TrustedProxies::parse("10.0.0.0/8").unwrap();
    })
    .await;
    let (author, _) = app.quick_user("author").await;
    let path = format!("/api/tweets/?user_id={author}");
    let read =
        |peer: &str, client: &str| from_peer(&path, peer, None, &[("x-forwarded-for", client)]);
    // Two clients behind the proxy: the first one's reads do not use up the second's.
    for i in 0..3 {
        let (status, _) = status_of(&app, read("10.0.0.2", "1.1.1.1")).await;
        assert_eq!(status, StatusCode::OK, "read {i}");
    }
    let (status, _) = status_of(&app, read("10.0.0.2", "1.1.1.1")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let (status, _) = status_of(&app, read("10.0.0.2", "2.2.2.2")).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "another client behind the same proxy"
    );
    // A client that is not a trusted proxy can not choose its address.
    for i in 0..3 {
        let (status, _) = status_of(&app, read("3.3.3.3", &format!("4.4.4.{i}"))).await;
        assert_eq!(status, StatusCode::OK, "read {i}");
    }
    let (status, _) = status_of(&app, read("3.3.3.3", "5.5.5.5")).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "its own address counted"
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_flood_of_health_checks_probes_postgres_and_redis_a_few_times(db: PgPool) {
    let app = TestApp::new(db).await;
    let checks = (0..200).map(|_| {
        let app = &app;
        async move { app.get("/healthz", None).await.status }
    });
    let statuses = futures_util::future::join_all(checks).await;
    assert!(statuses.iter().all(|s| *s == StatusCode::OK));
    let runs = app
        .state
        .health
        .runs
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        (1..=3).contains(&runs),
        "200 checks at once share a probe: {runs} probes"
    );
}

fn login_from(peer: &str, username: &str, password: &str) -> Request<Body> {
    let body = json!({"username": username, "password": password}).to_string();
    let mut req = Request::post("/api/accounts/login/")
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let addr: std::net::SocketAddr = format!("{peer}:40000").parse().unwrap();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(addr));
    req
}

/// Issue 37: a password guesser spread over many addresses meets a limit per username: its
/// failures count against the username, and over it the username's logins are a 429 before
/// any password is hashed (the right one too, until the limit allows one again). Another
/// username is not touched. Before, only the per-address `auth` limit applied.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn failed_logins_are_limited_per_username_from_any_address(db: PgPool) {
    let app = TestApp::with(db, |c| {
        c.rate_limits = RateLimits::parse("login=3/m; auth=off").unwrap();
    })
    .await;
    app.signup("alice").await;
    app.signup("bob").await;
    for (i, peer) in ["1.1.1.1", "2.2.2.2", "3.3.3.3"].into_iter().enumerate() {
        let (status, _) = status_of(&app, login_from(peer, "alice", "guess")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "guess {i}");
    }
    let (status, _) = status_of(&app, login_from("4.4.4.4", "Alice", "guess")).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "one over, whatever the case"
    );
    let (status, headers) = status_of(&app, login_from("5.5.5.5", "alice", "correct horse")).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "refused before hashing"
    );
    assert!(headers.contains_key("retry-after"));
    let (status, _) = status_of(&app, login_from("1.1.1.1", "bob", "correct horse")).await;
    assert_eq!(status, StatusCode::OK, "another username");
}
