//! Circles: membership, posting into a circle, the circle's tweets, and the daily rank.

use std::sync::Arc;

use axum::http::StatusCode;
use chirp::timeline::Timeline;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{Res, TestApp, hold_user_row, lock_waiters, tweet_ids, urlencode};

async fn new_circle(app: &TestApp, token: &str, name: &str) -> i64 {
    let res = app
        .post("/api/circles/", Some(token), json!({"name": name}))
        .await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    res.body["id"].as_i64().expect("id")
}

async fn post_into(app: &TestApp, token: &str, circle: i64, content: &str) -> i64 {
    let res = app
        .post(
            "/api/tweets/",
            Some(token),
            json!({"content": content, "circle_id": circle}),
        )
        .await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    assert_eq!(res.body["circle_id"], json!(circle));
    res.body["id"].as_i64().expect("id")
}

/// `POST /api/circles/{circle}/join/` as `token`.
async fn join(app: &TestApp, token: &str, circle: i64) -> Res {
    let uri = format!("/api/circles/{circle}/join/");
    app.post(&uri, Some(token), json!({})).await
}

fn today() -> String {
    chrono::Utc::now().format("%Y-%m-%d").to_string()
}

/// `(tweet id, score)` of a rank page, in rank order; also checks ranks are 1, 2, 3, …
fn ranked(body: &Value) -> Vec<(i64, i64)> {
    let results = body["results"].as_array().expect("results");
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["rank"], json!(i + 1), "{body}");
    }
    results
        .iter()
        .map(|r| {
            (
                r["tweet"]["id"].as_i64().unwrap(),
                r["score"].as_i64().unwrap(),
            )
        })
        .collect()
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn only_members_post_into_a_circle_whose_tweets_are_a_cached_timeline(db: PgPool) {
    let app = TestApp::new(db).await;
    let (owner_id, owner) = app.quick_user("owner").await;
    let (bob, tb) = app.quick_user("bob").await;
    let (_, fan) = app.quick_user("fan").await;
    app.follow(&fan, bob).await;
    let circle = new_circle(&app, &owner, "Rustaceans").await;
    let detail = app
        .get(&format!("/api/circles/{circle}/"), Some(&owner))
        .await
        .body;
    assert_eq!(
        (detail["members_count"].clone(), detail["is_member"].clone()),
        (json!(1), json!(true))
    );
    assert_eq!(detail["owner"]["id"], json!(owner_id));
    let res = app
        .post("/api/circles/", Some(&tb), json!({"name": "RUSTACEANS"}))
        .await;
    assert_eq!(
        res.status,
        StatusCode::BAD_REQUEST,
        "names are case-insensitive"
    );

    // Not a member: 403, and nothing is stored. An unknown circle: 400.
    let body = json!({"content": "let me in", "circle_id": circle});
    let res = app.post("/api/tweets/", Some(&tb), body).await;
    assert_eq!(res.status, StatusCode::FORBIDDEN);
    let res = app
        .post(
            "/api/tweets/",
            Some(&tb),
            json!({"content": "x", "circle_id": 999999}),
        )
        .await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    let stored: i64 = sqlx::query_scalar("select count(*) from tweets")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(stored, 0);

    let uri = format!("/api/circles/{circle}/tweets/");
    assert_eq!(
        tweet_ids(&app.get(&uri, None).await.body),
        Vec::<i64>::new()
    );
    let res = join(&app, &tb, circle).await;
    assert_eq!(
        (res.status, res.body),
        (
            StatusCode::CREATED,
            json!({"success": true, "duplicate": false})
        )
    );
    let res = join(&app, &tb, circle).await;
    assert_eq!(res.body, json!({"success": true, "duplicate": true}));
    let first = post_into(&app, &tb, circle, "hello circle").await;
    let second = post_into(&app, &owner, circle, "welcome").await;
    app.tweet(&tb, "not in the circle").await;
    app.drain().await;

    // In the circle's cached timeline (written through), the author's tweets and the fan's feed.
    let cached = app
        .cached_members(Timeline::Circle(circle))
        .await
        .expect("cached");
    assert!(cached.contains(&first.to_string()), "{cached:?}");
    assert_eq!(
        tweet_ids(&app.get(&uri, None).await.body),
        vec![second, first]
    );
    let feed = tweet_ids(&app.get("/api/newsfeeds/", Some(&fan)).await.body);
    assert!(feed.contains(&first), "{feed:?}");
    let circles = app.get("/api/circles/", Some(&tb)).await.body;
    assert_eq!(circles["results"][0]["tweets_count"], json!(2));
    assert_eq!(circles["results"][0]["is_member"], json!(true));
    assert_eq!(
        app.get("/api/circles/", None).await.body["results"][0]["is_member"],
        json!(false)
    );
    let members = app
        .get(&format!("/api/circles/{circle}/members/"), None)
        .await
        .body;
    assert_eq!(members["results"].as_array().map(Vec::len), Some(2));

    // Leaving keeps the tweets; deleting one takes it out of the circle and its rank.
    let res = app
        .post(
            &format!("/api/circles/{circle}/leave/"),
            Some(&tb),
            json!({}),
        )
        .await;
    assert_eq!(res.body, json!({"success": true, "deleted": 1}));
    let res = app
        .post(
            "/api/tweets/",
            Some(&tb),
            json!({"content": "again?", "circle_id": circle}),
        )
        .await;
    assert_eq!(res.status, StatusCode::FORBIDDEN);
    let res = app
        .delete(&format!("/api/tweets/{first}/"), Some(&tb))
        .await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(tweet_ids(&app.get(&uri, None).await.body), vec![second]);
    let rank = app
        .get(&format!("/api/circles/{circle}/rank/"), None)
        .await
        .body;
    assert_eq!(ranked(&rank), vec![(second, 0)]);
    assert_eq!(rank["date"], json!(today()));
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn rank_scores_are_exact_under_concurrency_after_a_flush_and_after_a_cancel(db: PgPool) {
    let app = Arc::new(TestApp::new(db).await);
    let (_, owner) = app.quick_user("owner").await;
    let circle = new_circle(&app, &owner, "rankers").await;
    let liked = post_into(&app, &owner, circle, "liked").await;
    let commented = post_into(&app, &owner, circle, "commented").await;
    let older_zero = post_into(&app, &owner, circle, "nothing, older").await;
    let newer_zero = post_into(&app, &owner, circle, "nothing, newer").await;
    let uri = format!("/api/circles/{circle}/rank/?date={}", today());
    // Cached before the writes, so they go through the write-through path.
    assert_eq!(
        ranked(&app.get(&uri, None).await.body),
        vec![(newer_zero, 0), (older_zero, 0), (commented, 0), (liked, 0)]
    );

    // 50 concurrent writers: 30 like one tweet, 20 comment on another.
    let mut users = Vec::new();
    for i in 0..50 {
        users.push(app.quick_user(&format!("user{i}")).await);
    }
    let mut tasks = Vec::new();
    for (i, (_, token)) in users.iter().cloned().enumerate() {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let res = if i < 30 {
                app.post(
                    "/api/likes/",
                    Some(&token),
                    json!({"content_type": "tweet", "object_id": liked}),
                )
                .await
            } else {
                app.post(
                    "/api/comments/",
                    Some(&token),
                    json!({"tweet_id": commented, "content": format!("comment {i}")}),
                )
                .await
            };
            assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let expected = vec![
        (liked, 30),
        (commented, 20),
        (newer_zero, 0),
        (older_zero, 0),
    ];
    assert_eq!(ranked(&app.get(&uri, None).await.body), expected);
    let rank = app.list_key_of(chirp::cache::rank::rank_key(
        circle,
        chrono::Utc::now()
            .format("%Y%m%d")
            .to_string()
            .parse()
            .unwrap(),
    ));
    let mut r = app.redis().await;
    let scores: Vec<(String, f64)> = redis::cmd("ZREVRANGE")
        .arg(&rank)
        .arg(0)
        .arg(1)
        .arg("WITHSCORES")
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(
        scores.iter().map(|s| s.1).collect::<Vec<_>>(),
        vec![30.0, 20.0],
        "written through to the cached rank: {scores:?}"
    );
    let ttl: i64 = redis::cmd("TTL")
        .arg(&rank)
        .query_async(&mut r)
        .await
        .unwrap();
    assert!(ttl > 29 * 24 * 3600, "a 30-day TTL, not {ttl}");

    // After a flush the rank is rebuilt from Postgres, exact.
    app.flush_cache().await;
    assert_eq!(ranked(&app.get(&uri, None).await.body), expected);
    assert_eq!(
        ranked(&app.get(&format!("{uri}&limit=2"), None).await.body),
        expected[..2]
    );

    // A cancelled like lowers the score at once; a like on a tweet outside the rank's day
    // creates nothing (no blind increment of a missing key).
    assert_eq!(app.unlike(&users[0].1, "tweet", liked).await, 1);
    assert_eq!(ranked(&app.get(&uri, None).await.body)[0], (liked, 29));
    app.flush_cache().await;
    app.post(
        "/api/likes/",
        Some(&users[0].1),
        json!({"content_type": "tweet", "object_id": liked}),
    )
    .await;
    let exists: bool = redis::cmd("EXISTS")
        .arg(&rank)
        .query_async(&mut r)
        .await
        .unwrap();
    assert!(!exists, "a write-through never creates a rank");
    assert_eq!(ranked(&app.get(&uri, None).await.body)[0], (liked, 30));
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn rank_dates_and_limits_are_checked(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, owner) = app.quick_user("owner").await;
    let circle = new_circle(&app, &owner, "dates").await;
    let day = |days: i64| {
        (chrono::Utc::now() - chrono::Duration::days(days))
            .format("%Y-%m-%d")
            .to_string()
    };
    let rank = |q: String| format!("/api/circles/{circle}/rank/?{q}");
    for (q, field) in [
        (format!("date={}", day(-1)), "date"),
        (format!("date={}", day(31)), "date"),
        ("date=yesterday".to_owned(), "date"),
        ("limit=0".to_owned(), "limit"),
        ("limit=101".to_owned(), "limit"),
    ] {
        let res = app.get(&rank(q.clone()), None).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{q}");
        assert!(res.body["errors"][field].is_array(), "{q}: {}", res.body);
    }
    let res = app.get(&rank(format!("date={}", day(30))), None).await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(res.body, json!({"date": day(30), "results": []}));
    assert_eq!(
        app.get("/api/circles/999999/rank/", None).await.status,
        StatusCode::NOT_FOUND
    );
}

/// A circle's tweets are exact (docs/API.md "Refresh and resume are exact"): a post that took
/// its time first but committed after a newer one (it waited for its author's row) still comes
/// above the newer one, so a client that refreshed from the newer one gets it, from the cached
/// list and from Postgres alike. Before, it kept its earlier time and no refresh returned it.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_circle_post_that_commits_late_still_reaches_a_refreshing_client(db: PgPool) {
    let app = Arc::new(TestApp::new(db).await);
    let (ann, ta) = app.quick_user("ann").await;
    let (_, tb) = app.quick_user("bob").await;
    let circle = new_circle(&app, &ta, "late ones").await;
    let joined = join(&app, &tb, circle).await;
    assert_eq!(joined.status, StatusCode::CREATED, "{}", joined.body);
    let uri = format!("/api/circles/{circle}/tweets/");
    assert_eq!(
        tweet_ids(&app.get(&uri, None).await.body),
        Vec::<i64>::new()
    );

    // Ann's post takes its time, then waits for her row (another session holds it).
    let holder = hold_user_row(&app, ann).await;
    let late = tokio::spawn({
        let (app, ta) = (app.clone(), ta.clone());
        async move { post_into(&app, &ta, circle, "late").await }
    });
    lock_waiters(&app, 1).await;
    let on_time = post_into(&app, &tb, circle, "on time").await;
    let page = app.get(&uri, None).await;
    assert_eq!(tweet_ids(&page.body), vec![on_time]);
    let newest = page.body["results"][0]["created_at"]
        .as_str()
        .unwrap()
        .to_owned();
    holder.commit().await.unwrap();
    let late = late.await.unwrap();

    let refresh = format!("{uri}?created_at__gt={}", urlencode(&newest));
    let cached = app.get(&refresh, None).await;
    assert_eq!(tweet_ids(&cached.body), vec![late], "{}", cached.body);
    app.flush_cache().await;
    assert_eq!(tweet_ids(&app.get(&refresh, None).await.body), vec![late]);
    assert_eq!(
        tweet_ids(&app.get(&uri, None).await.body),
        vec![late, on_time]
    );
}
