use crate::helpers::CountsOf;
use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{TestApp, page_all};

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn comments_are_created_edited_and_deleted_only_by_their_owner(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, ta) = app.signup("alice").await;
    let (_, tb) = app.signup("bob").await;
    let tweet = app.tweet(&ta, "discuss").await["id"].as_i64().unwrap();
    let res = app
        .post(
            "/api/comments/",
            Some(&tb),
            json!({"tweet_id": tweet, "content": " first! "}),
        )
        .await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    assert_eq!(res.body["content"], "first!");
    assert_eq!(res.body["tweet_id"], tweet);
    assert_eq!(res.body["user"]["username"], "bob");
    assert_eq!(
        (
            res.body["likes_count"].clone(),
            res.body["has_liked"].clone()
        ),
        (json!(0), json!(false))
    );
    let id = res.body["id"].as_i64().unwrap();
    assert_eq!(
        app.get(&format!("/api/tweets/{tweet}/"), None).await.body["comments_count"],
        1
    );

    let uri = format!("/api/comments/{id}/");
    let edit = json!({"content": "edited"});
    assert_eq!(
        app.request(Method::PUT, &uri, None, Some(edit.clone()))
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        app.request(Method::PUT, &uri, Some(&ta), Some(edit.clone()))
            .await
            .status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        app.request(Method::PUT, &uri, Some(&tb), Some(json!({"content": ""})))
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    let res = app.request(Method::PUT, &uri, Some(&tb), Some(edit)).await;
    assert_eq!(
        (res.status, res.body["content"].clone()),
        (StatusCode::OK, json!("edited"))
    );
    assert_eq!(
        app.request(
            Method::PUT,
            "/api/comments/999999/",
            Some(&tb),
            Some(json!({"content": "x"}))
        )
        .await
        .status,
        StatusCode::NOT_FOUND
    );

    assert_eq!(
        app.delete(&uri, Some(&ta)).await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        app.get(&format!("/api/tweets/{tweet}/"), None).await.body["comments_count"],
        1
    );
    let res = app.delete(&uri, Some(&tb)).await;
    assert_eq!(res.body, json!({"success": true}));
    assert_eq!(
        app.delete(&uri, Some(&tb)).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        app.get(&format!("/api/tweets/{tweet}/"), None).await.body["comments_count"],
        0
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn bad_comments_are_rejected_and_change_nothing(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, ta) = app.signup("alice").await;
    let tweet = app.tweet(&ta, "t").await["id"].as_i64().unwrap();
    for (body, field) in [
        (json!({"tweet_id": 999999, "content": "x"}), "tweet_id"),
        (json!({"content": "x"}), "tweet_id"),
        (json!({"tweet_id": tweet}), "content"),
        (
            json!({"tweet_id": tweet, "content": "x".repeat(281)}),
            "content",
        ),
    ] {
        let res = app.post("/api/comments/", Some(&ta), body.clone()).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{body}");
        assert!(res.body["errors"][field].is_array(), "{body}: {}", res.body);
    }
    assert_eq!(
        app.get("/api/comments/", None).await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        app.get("/api/comments/?tweet_id=999999", None).await.status,
        StatusCode::NOT_FOUND
    );
    let rows: i64 = sqlx::query_scalar("select count(*) from comments")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(rows, 0);
    assert_eq!(
        app.get(&format!("/api/tweets/{tweet}/"), None).await.body["comments_count"],
        0
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn comments_page_like_every_listing_and_the_detail_has_the_newest_20(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, ta) = app.quick_user("alice").await;
    let tweet = app.tweet(&ta, "busy").await["id"].as_i64().unwrap();
    let mut ids = Vec::new();
    for i in 0..45 {
        let res = app
            .post(
                "/api/comments/",
                Some(&ta),
                json!({"tweet_id": tweet, "content": format!("c{i}")}),
            )
            .await;
        ids.push(res.body["id"].as_i64().unwrap());
    }
    ids.reverse();
    for size in [1, 7, 45, 100] {
        assert_eq!(
            page_all(
                &app,
                &format!("/api/comments/?tweet_id={tweet}"),
                None,
                size
            )
            .await,
            ids,
            "page_size {size}"
        );
    }
    let mut likers = Vec::new();
    for i in 0..25 {
        let (_, token) = app.quick_user(&format!("liker{i}")).await;
        app.post(
            "/api/likes/",
            Some(&token),
            json!({"content_type": "tweet", "object_id": tweet}),
        )
        .await;
        likers.push(format!("liker{i}"));
    }
    let detail = app.get(&format!("/api/tweets/{tweet}/"), None).await.body;
    assert_eq!(detail["comments_count"], 45);
    assert_eq!(detail["likes_count"], 25);
    let shown: Vec<i64> = detail["comments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_i64().unwrap())
        .collect();
    assert_eq!(shown, ids[..20].to_vec());
    let likes: Vec<&str> = detail["likes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["user"]["username"].as_str().unwrap())
        .collect();
    likers.reverse();
    assert_eq!(
        likes,
        likers[..20].iter().map(String::as_str).collect::<Vec<_>>()
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn deleting_a_tweet_deletes_its_comments_likes_and_counters(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, ta) = app.quick_user("alice").await;
    let (_, tb) = app.quick_user("bob").await;
    let tweet = app.tweet(&ta, "doomed").await["id"].as_i64().unwrap();
    let comment = app.comment(&tb, tweet, "c").await;
    app.like(&tb, "tweet", tweet).await;
    app.like(&ta, "comment", comment).await;
    assert!(app.cached_counts(CountsOf::Tweet(tweet)).await.is_some());

    app.delete(&format!("/api/tweets/{tweet}/"), Some(&ta))
        .await;
    let rows: (i64, i64, i64) = sqlx::query_as(
        "select (select count(*) from comments), (select count(*) from tweet_likes), (select count(*) from comment_likes)",
    )
    .fetch_one(app.db())
    .await
    .unwrap();
    assert_eq!(rows, (0, 0, 0));
    assert!(app.cached_counts(CountsOf::Tweet(tweet)).await.is_none());
    assert_eq!(
        app.get(&format!("/api/comments/?tweet_id={tweet}"), None)
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    let res = app
        .post(
            "/api/likes/",
            Some(&tb),
            json!({"content_type": "comment", "object_id": comment}),
        )
        .await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn the_detail_shows_each_comment_and_like_as_they_come_and_go(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, ta) = app.quick_user("alice").await;
    let (_, tb) = app.quick_user("bob").await;
    let tweet = app.tweet(&ta, "quiet").await["id"].as_i64().unwrap();
    let uri = format!("/api/tweets/{tweet}/");
    // (comments_count, comment contents, likes_count, likers, has_liked for bob)
    let seen = |body: Value| {
        let names = |list: &Value, pick: fn(&Value) -> String| -> Vec<String> {
            list.as_array().unwrap().iter().map(pick).collect()
        };
        (
            body["comments_count"].as_i64().unwrap(),
            names(&body["comments"], |c| {
                c["content"].as_str().unwrap().to_owned()
            }),
            body["likes_count"].as_i64().unwrap(),
            names(&body["likes"], |l| {
                l["user"]["username"].as_str().unwrap().to_owned()
            }),
            body["has_liked"].as_bool().unwrap(),
        )
    };
    let none = || (0, vec![], 0, vec![], false);
    // Twice: the second read is served from the cached tweet and counters.
    for _ in 0..2 {
        assert_eq!(seen(app.get(&uri, Some(&tb)).await.body), none());
    }
    let comment = app.comment(&tb, tweet, "hello").await;
    app.like(&tb, "tweet", tweet).await;
    assert_eq!(
        seen(app.get(&uri, Some(&tb)).await.body),
        (1, vec!["hello".into()], 1, vec!["bob".into()], true)
    );
    app.delete(&format!("/api/comments/{comment}/"), Some(&tb))
        .await;
    assert_eq!(app.unlike(&tb, "tweet", tweet).await, 1);
    assert_eq!(seen(app.get(&uri, Some(&tb)).await.body), none());
}

/// Found by the schema fuzzer (scripts/fuzz-api): a text field with U+0000 was a 500 (Postgres
/// text can not hold it) on every route that stores or looks up text; it is a 400 naming the
/// field (JSON and form bodies here; multipart text parts are read by the same `Fields`), and
/// nothing changes. A password may hold one, as it always could: it is only hashed.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_null_character_in_a_text_field_is_a_400(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, token) = app.signup("alice").await;
    let tweet = app.tweet(&token, "hello").await["id"].as_i64().expect("id");
    let cases = [
        (
            "/api/accounts/login/",
            json!({"username": "ali\u{0}ce", "password": "x"}),
            "username",
        ),
        ("/api/tweets/", json!({"content": "a\u{0}b"}), "content"),
        (
            "/api/comments/",
            json!({"tweet_id": tweet, "content": "a\u{0}b"}),
            "content",
        ),
        ("/api/lists/", json!({"name": "a\u{0}b"}), "name"),
    ];
    for (uri, body, field) in cases {
        let res = app.post(uri, Some(&token), body).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{uri}: {}", res.body);
        assert!(res.body["errors"][field].is_array(), "{uri}: {}", res.body);
    }
    let req = axum::http::Request::post("/api/comments/")
        .header("content-type", "application/x-www-form-urlencoded")
        .header("authorization", format!("Bearer {token}"))
        .body(axum::body::Body::from(format!(
            "tweet_id={tweet}&content=a%00b"
        )))
        .unwrap();
    let form = app.send(req).await;
    assert_eq!(form.status, StatusCode::BAD_REQUEST, "{}", form.body);
    assert!(form.body["errors"]["content"].is_array(), "{}", form.body);
    let res = app
        .get(&format!("/api/comments/?tweet_id={tweet}"), None)
        .await;
    assert_eq!(res.body["results"], json!([]));
    let body = json!({"username": "nul", "email": "nul@example.com", "password": "pass\u{0}word"});
    let signup = app.post("/api/accounts/signup/", None, body).await;
    assert_eq!(signup.status, StatusCode::CREATED, "{}", signup.body);
    let login = app
        .post(
            "/api/accounts/login/",
            None,
            json!({"username": "nul", "password": "pass\u{0}word"}),
        )
        .await;
    assert_eq!(login.status, StatusCode::OK, "{}", login.body);
}
