use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::json;
use sqlx::PgPool;
use tower::ServiceExt;

use crate::helpers::{TestApp, rows_scanned, tweet_ids};

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn posting_a_tweet_returns_it_and_lists_it_at_once(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    let tweet = app.tweet(&ta, "  hello world  ").await;
    assert_eq!(tweet["content"], "hello world");
    assert_eq!(tweet["user"]["id"], alice);
    assert_eq!(tweet["likes_count"], 0);
    assert_eq!(tweet["comments_count"], 0);
    assert_eq!(tweet["has_liked"], false);
    let created = tweet["created_at"].as_str().unwrap();
    assert_eq!(
        created.len(),
        "2026-11-21T09:16:11.005227Z".len(),
        "{created}"
    );

    // Read your writes: own listing and own newsfeed, before any worker ran.
    let listed = app
        .get(&format!("/api/tweets/?user_id={alice}"), None)
        .await;
    assert_eq!(tweet_ids(&listed.body), vec![tweet["id"].as_i64().unwrap()]);
    let feed = app.get("/api/newsfeeds/", Some(&ta)).await;
    assert_eq!(tweet_ids(&feed.body), vec![tweet["id"].as_i64().unwrap()]);
    assert_eq!(feed.body["results"][0]["created_at"], tweet["created_at"]);

    let detail = app
        .get(&format!("/api/tweets/{}/", tweet["id"]), None)
        .await;
    assert_eq!(detail.status, StatusCode::OK);
    assert_eq!(detail.body["content"], "hello world");
    assert_eq!(detail.body["comments"], json!([]));
    assert_eq!(detail.body["likes"], json!([]));
}

/// A compose's cache step after its commit makes three Redis round trips: the pipeline of its
/// list merges and objects, the near-cache eviction of its author's counts, the streams'
/// publish. The new tweet's author comes from the row its transaction counted the tweet on
/// (before, a fourth read it back from the cache it had just evicted it from): the profile as
/// it is now, a nickname changed on another process just before included.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_compose_makes_three_redis_round_trips_and_carries_its_authors_profile(db: PgPool) {
    let (a, b) = crate::helpers::two_processes(db).await;
    // (No followers: their fan-out job would make round trips of its own meanwhile.)
    let (alice, ta) = a.signup("alice").await;
    for (i, nickname) in ["Al", "Alice", "A."].into_iter().enumerate() {
        // Warm what a reader holds: the author's tweets and newsfeed, her profile.
        a.get(&format!("/api/tweets/?user_id={alice}"), None).await;
        a.get("/api/newsfeeds/", Some(&ta)).await;
        let uri = format!("/api/users/{alice}/");
        let edit = json!({"nickname": nickname});
        let res = b.request(Method::PATCH, &uri, Some(&ta), Some(edit)).await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.body);
        // Less the token's lookup, if `a`'s memory did not answer it: under a loaded suite
        // its lease may lapse for a moment (CI once counted 4).
        let own = || a.redis_round_trips() - a.stat("token_lookups");
        let before = own();
        let tweet = a.tweet(&ta, &format!("hello {i}")).await;
        assert_eq!(own() - before, 3, "compose {i}");
        assert_eq!(tweet["user"]["id"], alice);
        assert_eq!(tweet["user"]["nickname"], nickname, "compose {i}");
        let listed = a.get(&format!("/api/tweets/?user_id={alice}"), None).await;
        assert_eq!(
            listed.body["results"][0], tweet,
            "compose {i}: listed as returned"
        );
    }
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn bad_tweets_are_rejected_and_change_nothing(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, ta) = app.signup("alice").await;
    assert_eq!(
        app.post("/api/tweets/", None, json!({"content": "hi"}))
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    for body in [
        json!({}),
        json!({"content": "   "}),
        json!({"content": "x".repeat(281)}),
        json!({"content": 5}),
    ] {
        let res = app.post("/api/tweets/", Some(&ta), body.clone()).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{body}");
        assert!(res.body["errors"]["content"].is_array(), "{}", res.body);
    }
    // 280 characters (not bytes) is fine.
    app.tweet(&ta, &"é".repeat(280)).await;
    let count: i64 = sqlx::query_scalar("select count(*) from tweets")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(count, 1);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn listing_tweets_needs_a_valid_existing_user(db: PgPool) {
    let app = TestApp::new(db).await;
    let res = app.get("/api/tweets/", None).await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    assert!(res.body["errors"]["user_id"].is_array());
    assert_eq!(
        app.get("/api/tweets/?user_id=abc", None).await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        app.get("/api/tweets/?user_id=424242", None).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        app.get("/api/tweets/424242/", None).await.status,
        StatusCode::NOT_FOUND
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn only_the_author_deletes_a_tweet(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    let (_, tb) = app.signup("bob").await;
    let id = app.tweet(&ta, "mine").await["id"].as_i64().unwrap();
    let uri = format!("/api/tweets/{id}/");
    assert_eq!(
        app.delete(&uri, None).await.status,
        StatusCode::UNAUTHORIZED
    );
    let res = app.delete(&uri, Some(&tb)).await;
    assert_eq!(res.status, StatusCode::FORBIDDEN);
    assert_eq!(
        res.body,
        json!({"detail": "You do not have permission to perform this action."})
    );
    assert_eq!(app.get(&uri, None).await.status, StatusCode::OK);

    let res = app.delete(&uri, Some(&ta)).await;
    assert_eq!(res.body, json!({"success": true}));
    assert_eq!(app.get(&uri, None).await.status, StatusCode::NOT_FOUND);
    assert_eq!(
        app.delete(&uri, Some(&ta)).await.status,
        StatusCode::NOT_FOUND
    );
    let profile = app.get(&format!("/api/users/{alice}/"), None).await;
    assert_eq!(profile.body["tweets_count"], 0);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn unknown_routes_methods_and_bodies_get_json_errors(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, ta) = app.signup("alice").await;
    let res = app.get("/api/nothing/here/", None).await;
    assert_eq!(
        (res.status, res.body),
        (StatusCode::NOT_FOUND, json!({"detail": "Not found."}))
    );
    let res = app
        .request(Method::PUT, "/api/tweets/", Some(&ta), None)
        .await;
    assert_eq!(
        (res.status, res.body),
        (
            StatusCode::METHOD_NOT_ALLOWED,
            json!({"detail": "Method not allowed."})
        )
    );
    let big = json!({"content": "x".repeat(70 * 1024)});
    let res = app.post("/api/tweets/", Some(&ta), big).await;
    assert_eq!(res.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(res.body["detail"].is_string());
    let req = axum::http::Request::post("/api/tweets/")
        .header("authorization", format!("Bearer {ta}"))
        .header("content-type", "text/plain")
        .body(axum::body::Body::from("hi"))
        .unwrap();
    let res = app.send(req).await;
    assert_eq!(res.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let req = axum::http::Request::post("/api/tweets/")
        .header("authorization", format!("Bearer {ta}"))
        .header("content-type", "application/json")
        .body(axum::body::Body::from("{\"content\": "))
        .unwrap();
    let res = app.send(req).await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    assert!(res.body["errors"]["body"].is_array());
    let count: i64 = sqlx::query_scalar("select count(*) from tweets")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(count, 0);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn healthz_reports_both_stores(db: PgPool) {
    let app = TestApp::new(db).await;
    let res = app.get("/healthz", None).await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(res.body["postgres"], "ok");
    assert_eq!(res.body["redis"], "ok");
}

/// `/healthz` reports the fan-out lag (../shared/API.md v3): a worker that is not running shows
/// as queued jobs whose oldest grows older; once the jobs ran, none.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn healthz_reports_a_stalled_fan_out_as_a_growing_lag(db: PgPool) {
    let app = TestApp::new(db).await;
    let res = app.get("/healthz", None).await;
    assert_eq!(res.body["fanout"]["queued_jobs"], 0, "{}", res.body);
    assert_eq!(res.body["fanout"]["oldest_job_age_ms"], json!(null));
    assert_eq!(res.body["fanout"]["refusing_composes"], false);
    let (_, token) = app.signup("alice").await;
    app.tweet(&token, "waiting for a worker").await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let res = app.get("/healthz", None).await;
    assert_eq!(res.body["fanout"]["queued_jobs"], 1, "{}", res.body);
    let age = res.body["fanout"]["oldest_job_age_ms"]
        .as_i64()
        .expect("an age");
    assert!(age >= 300, "{age}");
    app.drain().await;
    // `/healthz` probes at most once per interval.
    tokio::time::sleep(chirp::http::health::Probe::INTERVAL).await;
    let res = app.get("/healthz", None).await;
    assert_eq!(res.body["fanout"]["queued_jobs"], 0, "{}", res.body);
}

/// Issue 36: when composes outrun the fan-out, a tweet accepted now reaches its followers
/// late (six minutes under the DeathStarBench mix). While the oldest fan-out job no runner has
/// taken has waited longer than `CHIRP_FANOUT_MAX_WAIT_MS`, a compose answers 503 with
/// `Retry-After` and stores nothing; reads and likes go on; once the runners catch up,
/// composes are accepted again.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_compose_while_the_fan_out_is_behind_is_a_503_with_retry_after(db: PgPool) {
    let app = TestApp::with(db, |c| c.fanout_max_wait_ms = 200).await;
    let (_, token) = app.signup("alice").await;
    let first = app.tweet(&token, "waiting for a worker").await["id"]
        .as_i64()
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    app.state.backlog.refresh(app.db()).await.unwrap();
    let req = Request::builder()
        .method(Method::POST)
        .uri("/api/tweets/")
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(Body::from(json!({"content": "one more"}).to_string()))
        .unwrap();
    let res = app.app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["retry-after"], "1");
    let tweets: i64 = sqlx::query_scalar("select count(*) from tweets")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(tweets, 1, "nothing stored");
    let health = app.get("/healthz", None).await;
    assert_eq!(
        health.body["fanout"]["refusing_composes"], true,
        "{}",
        health.body
    );
    // Everything else goes on.
    assert_eq!(
        app.get(&format!("/api/tweets/{first}/"), Some(&token))
            .await
            .status,
        StatusCode::OK
    );
    app.drain().await;
    app.state.backlog.refresh(app.db()).await.unwrap();
    app.tweet(&token, "accepted again").await;
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_tweet_keeps_its_coordinates_and_bad_ones_are_a_400(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    let res = app
        .post(
            "/api/tweets/",
            Some(&ta),
            json!({"content": "here", "lon": "-149.9", "lat": 61.2}),
        )
        .await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    assert_eq!(res.body["coordinates"], json!([-149.9, 61.2]));
    assert_eq!(res.body["place"], json!(null));
    let id = res.body["id"].as_i64().unwrap();
    // From the cache, then from Postgres alone.
    for _ in 0..2 {
        let detail = app.get(&format!("/api/tweets/{id}/"), None).await;
        assert_eq!(detail.body["coordinates"], json!([-149.9, 61.2]));
        let listed = app
            .get(&format!("/api/tweets/?user_id={alice}"), None)
            .await;
        assert_eq!(
            listed.body["results"][0]["coordinates"],
            json!([-149.9, 61.2])
        );
        app.flush_cache().await;
    }
    for (body, field) in [
        // The missing half is named.
        (json!({"content": "x", "lat": 1}), "lon"),
        (json!({"content": "x", "lon": 1}), "lat"),
        (json!({"content": "x", "lon": 181, "lat": 1}), "lon"),
        (json!({"content": "x", "lon": 1, "lat": "north"}), "lat"),
        (json!({"content": "x", "lon": 1, "lat": -90.5}), "lat"),
    ] {
        let res = app.post("/api/tweets/", Some(&ta), body.clone()).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{body}");
        assert!(res.body["errors"][field].is_array(), "{body}: {}", res.body);
    }
    let count: i64 = sqlx::query_scalar("select count(*) from tweets")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(count, 1);
}

/// A compose reads the predecessors of its cached-list merges (the author's newest tweet, its
/// newest pulled one, the circle's newest) at the top of their indexes: a row each, however
/// many tweets the author has, also when the planner's statistics predate them. Written as
/// `max(created_at)`, the plan aggregated over every tweet of the author (2.5 ms of a 10 ms
/// compose at 4,380 tweets, growing with each one).
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_composes_predecessors_are_read_at_the_top_of_their_indexes(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    app.tweet(&ta, "first").await;
    sqlx::query("analyze tweets")
        .execute(app.db())
        .await
        .unwrap();
    // 5,000 tweets the statistics do not know of (a new account that posts a lot).
    sqlx::query(
        "insert into tweets (user_id, content, created_at)
         select $1, 'bulk ' || g, now() - make_interval(secs => g) from generate_series(1, 5000) g",
    )
    .bind(alice)
    .execute(app.db())
    .await
    .unwrap();
    let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "explain (analyze, format json) {}",
        chirp::tweets::PREDECESSORS
    )))
    .bind(alice)
    .bind(true)
    .bind(None::<i64>)
    .fetch_one(app.db())
    .await
    .unwrap();
    let rows = rows_scanned(&plan[0]["Plan"]);
    assert!(rows <= 3, "{rows} rows read for three predecessors: {plan}");
    // The compose's insert reads them in the same statement (decision 0033): the same index
    // tops, and a row or two of its own CTEs (rolled back; one of them queues the fan-out
    // job, decision 0036).
    let mut tx = app.db().begin().await.unwrap();
    let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "explain (analyze, format json) {}",
        chirp::tweets::INSERT
    )))
    .bind(alice)
    .bind(false)
    .bind(None::<i64>)
    .bind("planned")
    .bind(chrono::Utc::now())
    .bind(Vec::<String>::new())
    .bind(None::<Vec<f64>>)
    .bind(None::<sqlx::types::Json<serde_json::Value>>)
    .bind(None::<i64>)
    .bind(None::<i64>)
    .bind(None::<i64>)
    .bind(None::<i64>)
    .bind(Vec::<i64>::new())
    .bind(None::<chrono::DateTime<chrono::Utc>>)
    .bind(None::<String>)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    let rows = rows_scanned(&plan[0]["Plan"]);
    assert!(
        rows <= 8,
        "{rows} rows read by the compose's insert: {plan}"
    );

    // And the compose itself still names the newest as the predecessor: the new tweet tops the
    // author's list, cached and not.
    let id = app.tweet(&ta, "after the bulk").await["id"]
        .as_i64()
        .unwrap();
    let page = app
        .get(&format!("/api/tweets/?user_id={alice}"), None)
        .await;
    assert_eq!(tweet_ids(&page.body)[0], id);
}
