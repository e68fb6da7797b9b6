use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::json;
use sqlx::PgPool;
use tower::ServiceExt;

use std::sync::atomic::Ordering;

use crate::helpers::{Proxy, TestApp, eventually, token_held_in_memory, two_processes};

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn signup_returns_the_user_and_a_working_token(db: PgPool) {
    let app = TestApp::new(db).await;
    let res = app
        .post(
            "/api/accounts/signup/",
            None,
            json!({"username": "Alice_1", "email": "A@Example.com", "password": "12345678"}),
        )
        .await;
    assert_eq!(res.status, StatusCode::CREATED);
    assert_eq!(res.body["success"], true);
    assert_eq!(res.body["user"]["username"], "alice_1");
    assert_eq!(res.body["user"]["nickname"], json!(null));
    assert_eq!(res.body["user"]["avatar_url"], json!(null));
    let token = res.body["token"].as_str().unwrap();
    let status = app.get("/api/accounts/login_status/", Some(token)).await;
    assert_eq!(status.body["has_logged_in"], true);
    assert_eq!(status.body["user"]["username"], "alice_1");
    // Only a hash of the token is stored.
    let stored: i64 =
        sqlx::query_scalar("select count(*) from auth_tokens where token_hash = $1::bytea")
            .bind(token.as_bytes())
            .fetch_one(app.db())
            .await
            .unwrap();
    assert_eq!(stored, 0);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn signup_rejects_bad_input_with_field_errors_and_creates_nothing(db: PgPool) {
    let app = TestApp::new(db).await;
    let cases = [
        (
            json!({"username": "ab", "email": "a@b.io", "password": "12345678"}),
            "username",
        ),
        (
            json!({"username": "bad name", "email": "a@b.io", "password": "12345678"}),
            "username",
        ),
        (
            json!({"username": "x".repeat(31), "email": "a@b.io", "password": "12345678"}),
            "username",
        ),
        (
            json!({"username": "alice", "email": "not-an-email", "password": "12345678"}),
            "email",
        ),
        (
            json!({"username": "alice", "email": "a@b.io", "password": "short"}),
            "password",
        ),
        (
            json!({"username": "alice", "email": "a@b.io", "password": "p".repeat(129)}),
            "password",
        ),
        (json!({"username": "alice", "email": "a@b.io"}), "password"),
        (
            json!({"username": 12345, "email": "a@b.io", "password": "12345678"}),
            "username",
        ),
    ];
    for (body, field) in cases {
        let res = app.post("/api/accounts/signup/", None, body.clone()).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(res.body["success"], false);
        assert_eq!(res.body["message"], "Please check input");
        assert!(
            res.body["errors"][field].is_array(),
            "{body} -> {}",
            res.body
        );
    }
    let res = app
        .request(
            axum::http::Method::POST,
            "/api/accounts/signup/",
            None,
            Some(json!([1, 2])),
        )
        .await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    let users: i64 = sqlx::query_scalar("select count(*) from users")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(users, 0);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn usernames_and_emails_are_unique_ignoring_case(db: PgPool) {
    let app = TestApp::new(db).await;
    app.signup("alice").await;
    let res = app
        .post(
            "/api/accounts/signup/",
            None,
            json!({"username": "ALICE", "email": "other@example.com", "password": "12345678"}),
        )
        .await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    assert!(res.body["errors"]["username"].is_array());
    let res = app
        .post(
            "/api/accounts/signup/",
            None,
            json!({"username": "bob", "email": "ALICE@example.COM", "password": "12345678"}),
        )
        .await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    assert!(res.body["errors"]["email"].is_array());
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn form_bodies_work_like_json(db: PgPool) {
    let app = TestApp::new(db).await;
    let req = Request::post("/api/accounts/signup")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from(
            "username=carol&email=carol%40example.com&password=12345678",
        ))
        .unwrap();
    let res = app.send(req).await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    let req = Request::post("/api/accounts/login/")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from("username=Carol&password=12345678"))
        .unwrap();
    let res = app.send(req).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(res.body["user"]["username"], "carol");
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn login_with_a_wrong_pair_is_a_400_and_logout_revokes_the_token(db: PgPool) {
    let app = TestApp::new(db).await;
    app.signup("dave").await;
    for body in [
        json!({"username": "dave", "password": "wrong password"}),
        json!({"username": "nobody", "password": "12345678"}),
    ] {
        let res = app.post("/api/accounts/login/", None, body).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            res.body,
            json!({"success": false, "message": "username and password does not match"})
        );
    }
    let res = app
        .post("/api/accounts/login/", None, json!({"username": "dave"}))
        .await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    assert!(res.body["errors"]["password"].is_array());

    let res = app
        .post(
            "/api/accounts/login/",
            None,
            json!({"username": "dave", "password": "correct horse"}),
        )
        .await;
    assert_eq!(res.status, StatusCode::OK);
    let token = res.body["token"].as_str().unwrap().to_owned();
    let res = app
        .post("/api/accounts/logout/", Some(&token), json!({}))
        .await;
    assert_eq!(res.body, json!({"success": true}));
    let res = app.get("/api/newsfeeds/", Some(&token)).await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED);
    assert_eq!(res.body, json!({"detail": "Invalid token."}));
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn missing_and_bad_tokens_are_401s(db: PgPool) {
    let app = TestApp::new(db).await;
    let res = app.get("/api/newsfeeds/", None).await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        res.body,
        json!({"detail": "Authentication credentials were not provided."})
    );
    for token in ["garbage", &"a".repeat(43), "x y"] {
        let res = app.get("/api/newsfeeds/", Some(token)).await;
        assert_eq!(res.status, StatusCode::UNAUTHORIZED, "{token}");
        assert_eq!(res.body, json!({"detail": "Invalid token."}));
    }
    let res = app.post("/api/accounts/logout/", None, json!({})).await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED);
    let res = app.get("/api/accounts/login_status/", None).await;
    assert_eq!(res.body, json!({"has_logged_in": false}));
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_bad_token_is_a_401_on_every_route_and_no_token_is_anonymous(db: PgPool) {
    let app = TestApp::new(db).await;
    let (id, token) = app.signup("erin").await;
    let public = [
        format!("/api/users/{id}/"),
        format!("/api/tweets/?user_id={id}"),
        format!("/api/friendships/{id}/followers/"),
        format!("/api/lists/?user_id={id}"),
        "/api/circles/".to_owned(),
    ];
    for uri in &public {
        let anonymous = app.get(uri, None).await;
        assert_eq!(anonymous.status, StatusCode::OK, "{uri}");
        assert_eq!(
            app.get(uri, Some(&token)).await.status,
            StatusCode::OK,
            "{uri}"
        );
        let bad = app.get(uri, Some(&"b".repeat(43))).await;
        assert_eq!(bad.status, StatusCode::UNAUTHORIZED, "{uri}");
        assert_eq!(bad.body, json!({"detail": "Invalid token."}));
    }
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn cors_answers_only_the_configured_origins(db: PgPool) {
    let preflight = |origin: &str| {
        axum::http::Request::builder()
            .method(axum::http::Method::OPTIONS)
            .uri("/api/tweets/")
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type",
            )
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let app = TestApp::with(db.clone(), |c| {
        c.cors_origins = vec!["https://app.example.com".into()];
    })
    .await;
    let res = app
        .app
        .clone()
        .oneshot(preflight("https://app.example.com"))
        .await
        .unwrap();
    assert_eq!(
        res.headers()
            .get("access-control-allow-origin")
            .map(|v| v.to_str().unwrap()),
        Some("https://app.example.com")
    );
    let res = app
        .app
        .clone()
        .oneshot(preflight("https://evil.example"))
        .await
        .unwrap();
    assert_eq!(res.headers().get("access-control-allow-origin"), None);
    // The default: no CORS headers at all.
    let plain = TestApp::new(db).await;
    let res = plain
        .app
        .clone()
        .oneshot(preflight("https://app.example.com"))
        .await
        .unwrap();
    assert_eq!(res.headers().get("access-control-allow-origin"), None);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_logout_in_one_process_is_refused_at_once_by_another_that_holds_the_token(db: PgPool) {
    let (a, b) = two_processes(db).await;
    for i in 0..10 {
        let (_, token) = a.quick_user(&format!("user{i}")).await;
        token_held_in_memory(&a, &token).await;
        token_held_in_memory(&b, &token).await;
        // No pause: the logout answered only after both processes forgot the token.
        b.logout_refused_on(&a, &token, &format!("round {i}")).await;
    }
    assert_eq!(b.state.tokens.stats.unconfirmed.load(Ordering::Relaxed), 0);
    assert!(a.state.tokens.stats.evictions.load(Ordering::Relaxed) >= 10);
    assert!(a.state.tokens.is_empty(), "{} held", a.state.tokens.len());
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_process_cut_off_from_redis_forgets_its_tokens_and_asks_postgres(db: PgPool) {
    let proxy = Proxy::start().await;
    let a = TestApp::with(db.clone(), |c| c.redis_url = proxy.url()).await;
    let prefix = a.prefix.clone();
    let b = TestApp::with(db, |c| c.redis_prefix = prefix).await;
    let (_, token) = a.quick_user("alice").await;
    token_held_in_memory(&a, &token).await;
    // A loses Redis (and its subscription): a revocation now can not reach it.
    proxy.set_up(false);
    eventually("a notices the broken subscription", async || {
        a.state.tokens.is_empty()
    })
    .await;
    let res = b
        .post("/api/accounts/logout/", Some(&token), json!({}))
        .await;
    assert_eq!(res.status, StatusCode::OK);
    let res = a.get("/api/accounts/login_status/", Some(&token)).await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED, "{}", res.body);
    // A valid token still works there, from Postgres.
    let (_, other) = a.quick_user("bob").await;
    let res = a.get("/api/accounts/login_status/", Some(&other)).await;
    assert_eq!(res.body["has_logged_in"], true);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn with_the_token_cache_off_nothing_is_held_in_memory(db: PgPool) {
    let app = TestApp::with(db, |c| c.token_cache_secs = 0).await;
    let (_, token) = app.quick_user("alice").await;
    for _ in 0..3 {
        let res = app.get("/api/accounts/login_status/", Some(&token)).await;
        assert_eq!(res.body["has_logged_in"], true);
    }
    assert!(app.state.tokens.is_empty());
    assert_eq!(app.state.tokens.stats.hits.load(Ordering::Relaxed), 0);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_login_flood_hashes_on_the_cores_and_the_rest_get_503_with_retry_after(db: PgPool) {
    let app = TestApp::new(db).await;
    app.signup("erin").await;
    // The app's own pool: tests that sign up beside this one have pools of their own (one
    // process-wide pool let this flood refuse their signups with 503).
    let pool = &app.state.hashing;
    let logins = (0..300).map(|i| {
        let app = &app;
        async move {
            let req = Request::post("/api/accounts/login/")
                .header("content-type", "application/json")
                .body(Body::from(
                    json!({"username": "erin", "password": format!("wrong-{i}")}).to_string(),
                ))
                .unwrap();
            let res = app.app.clone().oneshot(req).await.unwrap();
            let retry = res.headers().get("retry-after").cloned();
            (res.status(), retry)
        }
    });
    let answers = futures_util::future::join_all(logins).await;
    let mut refused = 0;
    for (status, retry) in &answers {
        match *status {
            StatusCode::BAD_REQUEST => {}
            StatusCode::SERVICE_UNAVAILABLE => {
                refused += 1;
                assert_eq!(retry.as_ref().map(|v| v.to_str().unwrap()), Some("1"));
            }
            other => panic!("a login answered {other}"),
        }
    }
    assert!(refused > 0, "300 logins at once exceed the queue");
    assert!(
        answers.len() - refused >= pool.running * chirp::accounts::HashPool::QUEUE_PER_CORE,
        "the queue's worth were answered"
    );
    let peak = pool.peak.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        peak <= pool.running,
        "{peak} hashes ran at once on {} cores",
        pool.running
    );
    // The right password still logs in once the flood is over.
    let res = app
        .post(
            "/api/accounts/login/",
            None,
            json!({"username": "erin", "password": "correct horse"}),
        )
        .await;
    assert_eq!(res.status, StatusCode::OK);
}

/// A returning user's token, read from Postgres because neither cache held it, is cached in
/// Redis by the request that brought it back, whatever that request reads: with the request's
/// first read (decision 0037) or, if it made none, before it answered. The fill is a `SET NX`:
/// a logout that brings its own token back leaves it revoked in Redis and on every process.
/// Each request runs in a process of its own with nothing in memory, the token's key deleted.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_token_brought_back_from_postgres_is_cached_by_its_request_and_a_logout_wins(db: PgPool) {
    use chirp::cache::objects::CachedToken;
    let a = TestApp::new(db.clone()).await;
    let prefix = a.prefix.clone();
    let (alice, token) = a.quick_user("alice").await;
    let hash = chirp::accounts::hash_token(&token);
    let fresh = async || {
        let app = TestApp::with(db.clone(), |c| c.redis_prefix = prefix.clone()).await;
        app.drop_token_from_redis(&token).await;
        app
    };
    let requests = [
        (axum::http::Method::GET, "/api/accounts/login_status/", None),
        (axum::http::Method::GET, "/api/newsfeeds/", None),
        (axum::http::Method::GET, "/api/mutes/", None),
        (
            axum::http::Method::POST,
            "/api/tweets/",
            Some(json!({"content": "back"})),
        ),
    ];
    for (method, uri, body) in requests {
        let app = fresh().await;
        assert_eq!(
            app.state.cache.get_token(&hash).await.ok(),
            Some(CachedToken::Miss),
            "{uri}"
        );
        let res = app.request(method, uri, Some(&token), body).await;
        assert!(res.status.is_success(), "{uri}: {}", res.body);
        // No pause: the fill went with the request.
        assert_eq!(
            app.state.cache.get_token(&hash).await.ok(),
            Some(CachedToken::User(alice)),
            "{uri}: cached by the request"
        );
    }
    let app = fresh().await;
    let res = app
        .post("/api/accounts/logout/", Some(&token), json!({}))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(
        app.state.cache.get_token(&hash).await.ok(),
        Some(CachedToken::Revoked),
        "the logout's tombstone stands"
    );
    for process in [&app, &a] {
        let res = process
            .get("/api/accounts/login_status/", Some(&token))
            .await;
        assert_eq!(res.status, StatusCode::UNAUTHORIZED, "{}", res.body);
    }
}

/// A logout that brings its own token back from Postgres does not cache it, even where no
/// tombstone stands when its handler is done: its fill was read before the delete. Here the
/// logout's process stops between its commit and its cache step (`AfterCommit::Crash`, the
/// outbox relay's case), so Redis holds no tombstone until the relay runs; before, the fill's
/// `SET NX` then cached the revoked token and another process accepted it from Redis.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_logout_that_brings_its_token_back_never_caches_it(db: PgPool) {
    use chirp::cache::AfterCommit;
    use chirp::cache::objects::CachedToken;
    let (a, b) = two_processes(db.clone()).await;
    let (_, token) = a.quick_user("alice").await;
    let hash = chirp::accounts::hash_token(&token);
    // A third process with nothing in memory: `a` holds the token there since the signup, and
    // a process that stops before its cache step evicts nobody's memory (the relay does, later).
    let c = TestApp::with(db, |c| c.redis_prefix = a.prefix.clone()).await;
    b.drop_token_from_redis(&token).await;
    b.state.cache.set_after_commit(AfterCommit::Crash);
    let res = b
        .post("/api/accounts/logout/", Some(&token), json!({}))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(
        b.state.cache.get_token(&hash).await.ok(),
        Some(CachedToken::Miss),
        "the logout's own fill was not sent"
    );
    let res = c.get("/api/accounts/login_status/", Some(&token)).await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED, "{}", res.body);
}
