use axum::http::{Method, StatusCode};
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::TestApp;

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_profile_has_exact_counts(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    let (bob, tb) = app.signup("bob").await;
    app.follow(&tb, alice).await;
    app.tweet(&ta, "one").await;
    app.tweet(&ta, "two").await;
    let res = app.get(&format!("/api/users/{alice}/"), None).await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(res.body["username"], "alice");
    assert_eq!(res.body["followers_count"], 1);
    assert_eq!(res.body["followings_count"], 0);
    assert_eq!(res.body["tweets_count"], 2);
    assert!(res.body["created_at"].as_str().unwrap().ends_with('Z'));
    let res = app.get(&format!("/api/users/{bob}"), None).await;
    assert_eq!(res.body["followings_count"], 1);
    assert_eq!(
        app.get("/api/users/999999/", None).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        app.get("/api/users/abc/", None).await.status,
        StatusCode::NOT_FOUND
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn only_the_owner_edits_a_profile_and_edits_show_everywhere(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    let (_, tb) = app.signup("bob").await;
    app.tweet(&ta, "hello").await;
    let listing = format!("/api/tweets/?user_id={alice}");
    // Warm the user object cache.
    assert_eq!(
        app.get(&listing, None).await.body["results"][0]["user"]["nickname"],
        json!(null)
    );

    let uri = format!("/api/users/{alice}/");
    let edit = json!({"nickname": "Al", "avatar_url": "https://img.example.com/a.png"});
    assert_eq!(
        app.request(Method::PATCH, &uri, None, Some(edit.clone()))
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        app.request(Method::PATCH, &uri, Some(&tb), Some(edit.clone()))
            .await
            .status,
        StatusCode::FORBIDDEN
    );
    for bad in [
        json!({"nickname": "n".repeat(51)}),
        json!({"avatar_url": "ftp://x"}),
        json!({"avatar_url": "https://"}),
    ] {
        let res = app
            .request(Method::PATCH, &uri, Some(&ta), Some(bad.clone()))
            .await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    assert_eq!(app.get(&uri, None).await.body["nickname"], json!(null));

    let res = app
        .request(Method::PATCH, &uri, Some(&ta), Some(edit))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(res.body["nickname"], "Al");
    assert_eq!(res.body["avatar_url"], "https://img.example.com/a.png");
    let listed = app.get(&listing, None).await;
    assert_eq!(listed.body["results"][0]["user"]["nickname"], "Al");

    let res = app
        .request(
            Method::PATCH,
            &uri,
            Some(&ta),
            Some(json!({"nickname": null})),
        )
        .await;
    assert_eq!(res.body["nickname"], json!(null));
    assert_eq!(res.body["avatar_url"], "https://img.example.com/a.png");
}
