//! The near cache of tweet and user objects: pages take them from each process's memory, and a
//! delete or a profile edit answers only after every process forgot the old object.

use std::sync::atomic::Ordering;

use axum::http::{Method, StatusCode};
use chirp::cache::AfterCommit;
use chirp::cache::near::NearStats;
use chirp::cache::objects::NearId;
use chirp::config::Config;
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{Proxy, TestApp, eventually};

fn stats(app: &TestApp) -> &NearStats {
    &app.state.cache.near_objects().expect("cache on").stats
}

fn holds_tweet(app: &TestApp, id: i64) -> bool {
    let near = app.state.cache.near_objects().expect("cache on");
    near.get(&app.state.cache, &NearId::Tweet(id)).is_some()
}

/// Reads `uri` on `app` until a read was answered (at least in part) from its memory.
async fn held_in_memory(app: &TestApp, uri: &str) {
    let before = stats(app).hits.load(Ordering::Relaxed);
    eventually("objects are answered from memory", async || {
        let res = app.get(uri, None).await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.body);
        stats(app).hits.load(Ordering::Relaxed) > before
    })
    .await;
}

/// Two processes on one Redis prefix, and a tweet of alice's: `(a, b, alice, her token, tweet)`.
async fn two_processes(db: PgPool) -> (TestApp, TestApp, i64, String, i64) {
    two_processes_with(db, |_| {}).await
}

/// [`two_processes`] with `tweak` applied to the first one's settings.
async fn two_processes_with(
    db: PgPool,
    tweak: impl FnOnce(&mut Config),
) -> (TestApp, TestApp, i64, String, i64) {
    let a = TestApp::with(db.clone(), tweak).await;
    let prefix = a.prefix.clone();
    let b = TestApp::with(db, |c| c.redis_prefix = prefix).await;
    let (alice, token) = a.signup("alice").await;
    let id = a.tweet(&token, "soon gone").await["id"]
        .as_i64()
        .expect("tweet id");
    (a, b, alice, token, id)
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_tweet_deleted_on_one_server_is_gone_at_once_from_another_that_held_it(db: PgPool) {
    let (a, b, _, token, id) = two_processes(db).await;
    let uri = format!("/api/tweets/{id}/");
    held_in_memory(&a, &uri).await;
    held_in_memory(&b, &uri).await;
    assert!(holds_tweet(&b, id));
    let res = a.delete(&uri, Some(&token)).await;
    assert!(res.status.is_success(), "{}", res.body);
    // No pause: the delete answered only after both processes forgot the tweet. (Its deleted
    // counts would send a page to Postgres anyway; the memory must not keep it either.)
    assert!(!holds_tweet(&b, id), "b still holds the deleted tweet");
    assert!(!holds_tweet(&a, id), "a still holds the deleted tweet");
    let res = b.get(&uri, None).await;
    assert_eq!(res.status, StatusCode::NOT_FOUND, "{}", res.body);
    assert_eq!(stats(&a).unconfirmed.load(Ordering::Relaxed), 0);
    assert!(stats(&b).evictions.load(Ordering::Relaxed) >= 1);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_profile_edited_on_one_server_shows_at_once_on_another_that_held_it(db: PgPool) {
    let (a, b, alice, token, _) = two_processes(db).await;
    let listing = format!("/api/tweets/?user_id={alice}");
    held_in_memory(&b, &listing).await;
    assert_eq!(
        b.get(&listing, None).await.body["results"][0]["user"]["nickname"],
        json!(null)
    );
    let edit = json!({"nickname": "Al"});
    let uri = format!("/api/users/{alice}/");
    let res = a
        .request(Method::PATCH, &uri, Some(&token), Some(edit))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let page = b.get(&listing, None).await;
    assert_eq!(page.body["results"][0]["user"]["nickname"], "Al");
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_delete_whose_server_died_before_announcing_it_is_evicted_by_the_relay(db: PgPool) {
    let (a, b, _, token, id) = two_processes(db).await;
    let uri = format!("/api/tweets/{id}/");
    held_in_memory(&b, &uri).await;
    // The deleting process "dies" between its commit and its cache step.
    a.state.cache.set_after_commit(AfterCommit::Crash);
    let res = a.delete(&uri, Some(&token)).await;
    assert!(res.status.is_success(), "{}", res.body);
    a.state.cache.set_after_commit(AfterCommit::Apply);
    assert!(holds_tweet(&b, id), "nothing announced the delete yet");
    assert!(a.relay().await >= 1);
    assert!(!holds_tweet(&b, id), "the relay's eviction did not reach b");
    let res = b.get(&uri, None).await;
    assert_eq!(res.status, StatusCode::NOT_FOUND, "{}", res.body);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn with_the_object_cache_off_nothing_is_held_in_memory(db: PgPool) {
    let app = TestApp::with(db, |c| c.object_cache_secs = 0).await;
    let (_, token) = app.signup("alice").await;
    let id = app.tweet(&token, "hello").await["id"].as_i64().expect("id");
    for _ in 0..3 {
        let res = app.get(&format!("/api/tweets/{id}/"), None).await;
        assert_eq!(res.status, StatusCode::OK);
    }
    let near = app.state.cache.near_objects().expect("cache on");
    assert!(near.is_empty());
    assert_eq!(near.stats.hits.load(Ordering::Relaxed), 0);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_process_cut_off_from_redis_forgets_its_objects_and_misses_no_delete(db: PgPool) {
    let proxy = Proxy::start().await;
    let (a, b, _, token, id) = two_processes_with(db, |c| c.redis_url = proxy.url()).await;
    let uri = format!("/api/tweets/{id}/");
    held_in_memory(&a, &uri).await;
    // A loses Redis (and its subscription): an eviction now can not reach it.
    proxy.set_up(false);
    eventually("a notices the broken subscription", async || {
        a.state.cache.near_objects().expect("cache on").is_empty()
    })
    .await;
    let res = b.delete(&uri, Some(&token)).await;
    assert!(res.status.is_success(), "{}", res.body);
    // A answers from Postgres while Redis is away, and from Redis once it is back: never from
    // the memory that missed the eviction.
    assert_eq!(a.get(&uri, None).await.status, StatusCode::NOT_FOUND);
    proxy.set_up(true);
    assert!(a.recover().await);
    assert_eq!(a.get(&uri, None).await.status, StatusCode::NOT_FOUND);
}
