//! The consistency checker (`chirp check-cache`): clean after real traffic, and it names every
//! kind of difference a lost or wrong cache write leaves.

use axum::http::{Method, StatusCode};
use chirp::cache::AfterCommit;
use chirp::timeline::Timeline;
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{CountsOf, TestApp};

/// Users, follows, tweets, likes, a comment, a deleted tweet and a logout, with every list and
/// object read once so the cache holds them.
async fn busy_app(db: PgPool) -> (TestApp, i64, i64, String, String) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    let (bob, tb) = app.signup("bob").await;
    let (carol, tc) = app.signup("carol").await;
    app.follow(&tb, alice).await;
    let mute = format!("/api/users/{carol}/mute/");
    assert_eq!(
        app.post(&mute, Some(&tb), json!({})).await.status,
        StatusCode::OK
    );
    let first = app.tweet(&ta, "first").await["id"].as_i64().unwrap();
    let gone = app.tweet(&ta, "deleted soon").await["id"].as_i64().unwrap();
    app.tweet(&ta, "third").await;
    app.drain().await;
    for uri in [
        "/api/newsfeeds/".to_owned(),
        format!("/api/tweets/?user_id={alice}"),
        format!("/api/users/{alice}/"),
    ] {
        assert_eq!(app.get(&uri, Some(&tb)).await.status, StatusCode::OK);
    }
    let like = json!({"content_type": "tweet", "object_id": first});
    assert_eq!(
        app.post("/api/likes/", Some(&tb), like).await.status,
        StatusCode::CREATED
    );
    let comment = json!({"tweet_id": first, "content": "nice"});
    assert_eq!(
        app.post("/api/comments/", Some(&tb), comment).await.status,
        StatusCode::CREATED
    );
    let res = app.delete(&format!("/api/tweets/{gone}/"), Some(&ta)).await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(
        app.post("/api/accounts/logout/", Some(&tc), json!({}))
            .await
            .status,
        StatusCode::OK
    );
    app.drain().await;
    app.get("/api/newsfeeds/", Some(&tb)).await;
    app.get(&format!("/api/tweets/{first}/"), Some(&tb)).await;
    (app, alice, bob, ta, tb)
}

#[sqlx::test]
async fn the_checker_finds_no_difference_after_real_traffic(db: PgPool) {
    let (app, ..) = busy_app(db).await;
    let report = chirp::check::run(app.db(), &app.state.cache)
        .await
        .expect("check");
    assert!(report.differences.is_empty(), "{report}");
    for kind in [
        "newsfeeds",
        "user tweets",
        "tweet objects",
        "tweet counts",
        "user objects",
        "tokens",
        "liked sets",
        "hidden sets",
    ] {
        assert!(
            report.checked.get(kind).copied().unwrap_or(0) > 0,
            "nothing of {kind} compared: {report}"
        );
    }
}

#[sqlx::test]
async fn the_checker_names_a_lost_list_write_a_stale_counter_and_a_wrong_tombstone(db: PgPool) {
    let (app, alice, bob, ta, _) = busy_app(db).await;
    let edited = app.tweet(&ta, "before the edit").await["id"]
        .as_i64()
        .unwrap();
    // A write whose cache update was lost (its process died after the commit).
    app.state.cache.set_after_commit(AfterCommit::Crash);
    let lost = app.tweet(&ta, "lost").await["id"].as_i64().unwrap();
    app.drain().await;
    app.state.cache.set_after_commit(AfterCommit::Apply);
    // A counter older than its row, and a live tweet tombstoned.
    let counts_key = app.counts_key(CountsOf::User(alice));
    let mut redis = app.redis().await;
    let _: () = redis::cmd("SET")
        .arg(&counts_key)
        .arg("0|0|0|0")
        .query_async(&mut redis)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(app.keys().tweet(lost))
        .arg("-")
        .query_async(&mut redis)
        .await
        .unwrap();
    // An edited tweet's object holding its text from before the edit.
    let edited_key = app.keys().tweet(edited);
    let before = app.raw_get(&edited_key).await.expect("cached when posted");
    let res = app
        .request(
            Method::PATCH,
            &format!("/api/tweets/{edited}/"),
            Some(&ta),
            Some(json!({"content": "after the edit"})),
        )
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let _: () = redis::cmd("SET")
        .arg(&edited_key)
        .arg(&before)
        .query_async(&mut redis)
        .await
        .unwrap();
    // A hidden set older than bob's mute (as if a slow reader had put it back).
    let hidden = app.keys().hidden(bob);
    let _: () = redis::cmd("SET")
        .arg(&hidden)
        .arg("0|h;")
        .query_async(&mut redis)
        .await
        .unwrap();

    let report = chirp::check::run(app.db(), &app.state.cache)
        .await
        .expect("check");
    let differing: Vec<&str> = report.differences.iter().map(|d| d.key.as_str()).collect();
    let feed = app.list_key(Timeline::Newsfeed(bob));
    let own = app.list_key(Timeline::UserTweets(alice));
    let tweet = app.keys().tweet(lost);
    for key in [&feed, &own, &counts_key, &tweet, &hidden, &edited_key] {
        assert!(
            differing.contains(&key.as_str()),
            "{key} not reported: {report}"
        );
    }
    assert_eq!(report.differences.len(), 6, "{report}");

    // The relay repairs the lost write; the two planted values need the invalidation a write
    // would have staged.
    app.relay().await;
    let _: () = redis::cmd("DEL")
        .arg(&counts_key)
        .query_async(&mut redis)
        .await
        .unwrap();
    for key in [&tweet, &hidden, &edited_key] {
        let _: () = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut redis)
            .await
            .unwrap();
    }
    let report = chirp::check::run(app.db(), &app.state.cache)
        .await
        .expect("check");
    assert!(report.differences.is_empty(), "{report}");
}
