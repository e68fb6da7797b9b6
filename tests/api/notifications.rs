//! Notifications: one per like, comment and follow, never for your own actions, once per like
//! or follow however often it is repeated; unread counts exact under concurrency.

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{TestApp, urlencode};

async fn unread(app: &TestApp, token: &str) -> i64 {
    let res = app
        .get("/api/notifications/unread-count/", Some(token))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    res.body["unread_count"].as_i64().expect("count")
}

/// Every notification of the caller, paging with `created_at__lt`.
async fn all(app: &TestApp, token: &str, query: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut uri = format!("/api/notifications/?page_size=2{query}");
    loop {
        let res = app.get(&uri, Some(token)).await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.body);
        let results = res.body["results"].as_array().expect("results").clone();
        out.extend(results.iter().cloned());
        if !res.body["has_next_page"].as_bool().expect("has_next_page") {
            return out;
        }
        let last = results.last().expect("last")["created_at"]
            .as_str()
            .unwrap()
            .to_owned();
        uri = format!(
            "/api/notifications/?page_size=2{query}&created_at__lt={}",
            urlencode(&last)
        );
    }
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn each_verb_notifies_once_and_never_for_your_own_actions(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.quick_user("alice").await;
    let (bob, tb) = app.quick_user("bob").await;
    let tweet = app.tweet(&ta, "hello").await["id"].as_i64().unwrap();
    let like = json!({"content_type": "tweet", "object_id": tweet});

    // Follow, unfollow, follow again; like, cancel, like again: once each.
    app.follow(&tb, alice).await;
    app.post(
        &format!("/api/friendships/{alice}/unfollow/"),
        Some(&tb),
        json!({}),
    )
    .await;
    app.follow(&tb, alice).await;
    app.post("/api/likes/", Some(&tb), like.clone()).await;
    app.post("/api/likes/cancel/", Some(&tb), like.clone())
        .await;
    app.post("/api/likes/", Some(&tb), like.clone()).await;
    // Two comments notify twice; liking alice's own comment notifies her.
    for text in ["first", "second"] {
        let res = app
            .post(
                "/api/comments/",
                Some(&tb),
                json!({"tweet_id": tweet, "content": text}),
            )
            .await;
        assert_eq!(res.status, StatusCode::CREATED);
    }
    let own = app.comment(&ta, tweet, "mine").await;
    app.like(&tb, "comment", own).await;
    // Her own like and comment notify nobody.
    app.post("/api/likes/", Some(&ta), like.clone()).await;

    let got = all(&app, &ta, "").await;
    let verbs: Vec<(&str, &str, i64)> = got
        .iter()
        .map(|n| {
            assert_eq!(n["actor"]["id"], json!(bob));
            (
                n["verb"].as_str().unwrap(),
                n["target_type"].as_str().unwrap(),
                n["target_id"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        verbs,
        vec![
            ("liked your comment", "comment", own),
            ("commented on your tweet", "tweet", tweet),
            ("commented on your tweet", "tweet", tweet),
            ("liked your tweet", "tweet", tweet),
            ("followed you", "user", alice),
        ],
        "newest first"
    );
    assert_eq!(unread(&app, &ta).await, 5);
    assert_eq!(unread(&app, &tb).await, 0, "nothing for bob's own actions");

    // Mark one read, then the rest; someone else's is a 404, a missing field a 400.
    let id = got[4]["id"].as_i64().unwrap();
    let uri = format!("/api/notifications/{id}/");
    let res = app
        .request(Method::PUT, &uri, Some(&ta), Some(json!({"unread": false})))
        .await;
    assert_eq!(
        (res.status, res.body["unread"].clone()),
        (StatusCode::OK, json!(false))
    );
    assert_eq!(unread(&app, &ta).await, 4);
    assert_eq!(all(&app, &ta, "&unread=true").await.len(), 4);
    let res = app
        .request(Method::PUT, &uri, Some(&tb), Some(json!({"unread": true})))
        .await;
    assert_eq!(res.status, StatusCode::NOT_FOUND);
    let res = app
        .request(Method::PUT, &uri, Some(&ta), Some(json!({})))
        .await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    assert!(res.body["errors"]["unread"].is_array(), "{}", res.body);
    let res = app
        .post("/api/notifications/mark-all-as-read/", Some(&ta), json!({}))
        .await;
    assert_eq!(res.body, json!({"marked_count": 4}));
    assert_eq!(unread(&app, &ta).await, 0);
    assert_eq!(all(&app, &ta, "&unread=true").await, Vec::<Value>::new());
    assert_eq!(
        app.get("/api/notifications/", None).await.status,
        StatusCode::UNAUTHORIZED
    );

    // Deleting the tweet takes its notifications (and its comments') with it.
    app.delete(&format!("/api/tweets/{tweet}/"), Some(&ta))
        .await;
    let left: Vec<String> = all(&app, &ta, "")
        .await
        .iter()
        .map(|n| n["verb"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(left, vec!["followed you"]);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn unread_counts_are_exact_under_concurrent_likes(db: PgPool) {
    let app = Arc::new(TestApp::new(db).await);
    let (_, ta) = app.quick_user("alice").await;
    let tweet = app.tweet(&ta, "popular").await["id"].as_i64().unwrap();
    let mut tasks = Vec::new();
    for i in 0..30 {
        let (_, token) = app.quick_user(&format!("fan{i}")).await;
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let like = json!({"content_type": "tweet", "object_id": tweet});
            // Each fan likes twice at once: still one notification each.
            let (a, b) = tokio::join!(
                app.post("/api/likes/", Some(&token), like.clone()),
                app.post("/api/likes/", Some(&token), like.clone())
            );
            assert_eq!(
                (a.status, b.status),
                (StatusCode::CREATED, StatusCode::CREATED)
            );
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(unread(&app, &ta).await, 30);
}
