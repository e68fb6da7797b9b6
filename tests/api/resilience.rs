//! Redis is an optimisation: with it unreachable every request still answers correctly, and once
//! it is back no cached list lacks a write made meanwhile.

use axum::http::StatusCode;
use chirp::timeline::Timeline;
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{Proxy, TestApp, member_tweet, tweet_ids};

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn with_redis_down_everything_answers_and_after_it_returns_no_write_is_missing(db: PgPool) {
    let proxy = Proxy::start().await;
    let app = TestApp::with(db, |c| {
        c.redis_url = proxy.url();
        c.redis_timeout_ms = 100;
    })
    .await;
    assert!(app.state.cache.available());
    let (alice, ta) = app.signup("alice").await;
    let (bob, tb) = app.signup("bob").await;
    let (carol, tc) = app.signup("carol").await;
    app.follow(&tb, alice).await;
    let old = app.tweet(&ta, "old").await["id"].as_i64().unwrap();
    let carols = app.tweet(&tc, "carol's").await["id"].as_i64().unwrap();
    app.drain().await;
    // Warm bob's feed and alice's tweets.
    assert_eq!(
        tweet_ids(&app.get("/api/newsfeeds/", Some(&tb)).await.body),
        vec![old]
    );
    app.get(&format!("/api/tweets/?user_id={alice}"), None)
        .await;

    proxy.set_up(false);
    // Writes succeed: a tweet fanned out to bob, a follow backfilled, a delete.
    let new = app.tweet(&ta, "written while redis was down").await["id"]
        .as_i64()
        .unwrap();
    app.follow(&tb, carol).await;
    app.drain().await;
    let res = app.delete(&format!("/api/tweets/{old}/"), Some(&ta)).await;
    assert_eq!(res.status, StatusCode::OK);
    assert!(!app.state.cache.available());
    let pending: i64 = sqlx::query_scalar("select count(*) from cache_outbox")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert!(pending > 0, "the missed cache updates were recorded");

    // Reads answer correctly from Postgres.
    // Carol's tweet arrived (the follow's backfill) after alice's new one: it is the newest
    // entry (docs/API.md, "Refresh and resume are exact").
    let feed = tweet_ids(&app.get("/api/newsfeeds/", Some(&tb)).await.body);
    assert_eq!(feed, [carols, new]);
    assert_eq!(
        tweet_ids(
            &app.get(&format!("/api/tweets/?user_id={alice}"), None)
                .await
                .body
        ),
        vec![new]
    );
    let health = app.get("/healthz", None).await;
    assert_eq!(
        (health.status, health.body["redis"].clone()),
        (StatusCode::OK, json!("down"))
    );

    // Redis is back, still holding the stale lists; the monitor's recovery replays the outbox.
    proxy.set_up(true);
    let stale = app
        .cached_members(Timeline::Newsfeed(bob))
        .await
        .expect("stale list still in redis");
    assert!(!stale.iter().any(|m| member_tweet(m) == new));
    assert!(app.recover().await, "redis is used again once it answers");
    assert!(app.state.cache.available());
    let pending: i64 = sqlx::query_scalar("select count(*) from cache_outbox")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(pending, 0);

    let hits = app.stat("hits") + app.stat("misses");
    assert_eq!(
        tweet_ids(&app.get("/api/newsfeeds/", Some(&tb)).await.body),
        feed
    );
    assert_eq!(
        tweet_ids(
            &app.get(&format!("/api/tweets/?user_id={alice}"), None)
                .await
                .body
        ),
        vec![new]
    );
    assert_eq!(
        app.stat("hits") + app.stat("misses"),
        hits + 2,
        "served through the cache again"
    );
    assert_eq!(
        app.get(&format!("/api/tweets/{old}/"), None).await.status,
        StatusCode::NOT_FOUND
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn chirp_starts_and_serves_when_redis_never_answered(db: PgPool) {
    let app = TestApp::with(db, |c| {
        c.redis_url = "redis://127.0.0.1:1/0".into();
        c.redis_timeout_ms = 50;
    })
    .await;
    let (alice, ta) = app.signup("alice").await;
    let id = app.tweet(&ta, "no redis").await["id"].as_i64().unwrap();
    assert_eq!(
        tweet_ids(
            &app.get(&format!("/api/tweets/?user_id={alice}"), None)
                .await
                .body
        ),
        vec![id]
    );
    assert_eq!(
        tweet_ids(&app.get("/api/newsfeeds/", Some(&ta)).await.body),
        vec![id]
    );
    assert_eq!(
        app.get(&format!("/api/tweets/{id}/"), None).await.status,
        StatusCode::OK
    );
    assert_eq!(app.get("/healthz", None).await.body["redis"], "down");
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_token_revoked_while_redis_is_down_stays_revoked_after_it_returns(db: PgPool) {
    let proxy = Proxy::start().await;
    let app = TestApp::with(db, |c| {
        c.redis_url = proxy.url();
        c.redis_timeout_ms = 100;
    })
    .await;
    let (_, token) = app.signup("alice").await;
    assert_eq!(
        app.get("/api/newsfeeds/", Some(&token)).await.status,
        StatusCode::OK
    ); // token cached
    proxy.set_up(false);
    let res = app
        .post("/api/accounts/logout/", Some(&token), json!({}))
        .await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(
        app.get("/api/newsfeeds/", Some(&token)).await.status,
        StatusCode::UNAUTHORIZED
    );
    proxy.set_up(true);
    assert!(app.recover().await);
    assert_eq!(
        app.get("/api/newsfeeds/", Some(&token)).await.status,
        StatusCode::UNAUTHORIZED
    );
}
