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
