use axum::http::StatusCode;
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{TestApp, page_all, tweet_ids};

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn follow_and_unfollow_answer_as_the_contract_says(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    let (bob, _) = app.signup("bob").await;
    let follow = format!("/api/friendships/{bob}/follow/");
    let res = app.post(&follow, Some(&ta), json!({})).await;
    assert_eq!(res.status, StatusCode::CREATED);
    assert_eq!(res.body["user"]["id"], bob);
    assert_eq!(res.body["has_followed"], true);
    assert!(res.body["created_at"].is_string());
    let res = app.post(&follow, Some(&ta), json!({})).await;
    assert_eq!(
        (res.status, res.body),
        (
            StatusCode::CREATED,
            json!({"success": true, "duplicate": true})
        )
    );

    assert_eq!(
        app.post(&follow, None, json!({})).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        app.post(
            &format!("/api/friendships/{alice}/follow/"),
            Some(&ta),
            json!({})
        )
        .await
        .status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        app.post("/api/friendships/999999/follow/", Some(&ta), json!({}))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        app.post("/api/friendships/999999/unfollow/", Some(&ta), json!({}))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        app.post(
            &format!("/api/friendships/{alice}/unfollow/"),
            Some(&ta),
            json!({})
        )
        .await
        .status,
        StatusCode::BAD_REQUEST
    );

    let unfollow = format!("/api/friendships/{bob}/unfollow/");
    assert_eq!(
        app.post(&unfollow, Some(&ta), json!({})).await.body,
        json!({"success": true, "deleted": 1})
    );
    assert_eq!(
        app.post(&unfollow, Some(&ta), json!({})).await.body,
        json!({"success": true, "deleted": 0})
    );
    let profile = app.get(&format!("/api/users/{bob}/"), None).await;
    assert_eq!(profile.body["followers_count"], 0);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn followers_and_followings_page_newest_first_with_has_followed(db: PgPool) {
    let app = TestApp::new(db).await;
    let (star, ts) = app.signup("star").await;
    let mut fans = Vec::new();
    for i in 0..12 {
        let (id, token) = app.signup(&format!("fan{i}")).await;
        app.follow(&token, star).await;
        fans.push(id);
    }
    // The star follows back two fans.
    app.follow(&ts, fans[3]).await;
    app.follow(&ts, fans[7]).await;

    let followers: Vec<i64> = {
        let mut all = Vec::new();
        let mut uri = format!("/api/friendships/{star}/followers/?page_size=5");
        loop {
            let res = app.get(&uri, Some(&ts)).await;
            assert_eq!(res.status, StatusCode::OK);
            let results = res.body["results"].as_array().unwrap();
            for r in results {
                let id = r["user"]["id"].as_i64().unwrap();
                assert_eq!(r["has_followed"], id == fans[3] || id == fans[7], "{r}");
                all.push(id);
            }
            if res.body["has_next_page"] == false {
                break all;
            }
            let last = results.last().unwrap()["created_at"]
                .as_str()
                .unwrap()
                .replace(':', "%3A");
            uri = format!("/api/friendships/{star}/followers/?page_size=5&created_at__lt={last}");
        }
    };
    let mut newest_first = fans.clone();
    newest_first.reverse();
    assert_eq!(followers, newest_first);

    let res = app
        .get(&format!("/api/friendships/{star}/followings/"), None)
        .await;
    let ids: Vec<i64> = res.body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["user"]["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, vec![fans[7], fans[3]]);
    assert!(
        res.body["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["has_followed"] == false),
        "anonymous"
    );
    assert_eq!(
        app.get("/api/friendships/999999/followers/", None)
            .await
            .status,
        StatusCode::NOT_FOUND
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn follow_backfills_and_unfollow_unmerges_the_newsfeed(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, ta) = app.signup("alice").await;
    let (bob, tb) = app.signup("bob").await;
    let mine = app.tweet(&ta, "alice's own").await["id"].as_i64().unwrap();
    let bobs = app.tweets(&tb, "bob ", 5).await;
    app.drain().await;
    // Cache alice's feed before she follows.
    assert_eq!(
        tweet_ids(&app.get("/api/newsfeeds/", Some(&ta)).await.body),
        vec![mine]
    );
    let loads = app.stat("loads");

    app.follow(&ta, bob).await;
    app.drain().await;
    let feed = page_all(&app, "/api/newsfeeds/", Some(&ta), 2).await;
    let mut expected = bobs.clone();
    expected.reverse();
    expected.push(mine);
    assert_eq!(feed, expected);
    assert_eq!(
        app.stat("loads"),
        loads,
        "the cached list was merged into, not reloaded"
    );

    app.post(
        &format!("/api/friendships/{bob}/unfollow/"),
        Some(&ta),
        json!({}),
    )
    .await;
    app.drain().await;
    assert_eq!(
        tweet_ids(&app.get("/api/newsfeeds/", Some(&ta)).await.body),
        vec![mine]
    );
    let rows: i64 = sqlx::query_scalar("select count(*) from newsfeeds n join users u on u.id = n.user_id where u.username = 'alice'")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(rows, 1);
}
