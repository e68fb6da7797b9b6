use axum::http::StatusCode;
use chirp::config::CacheMode;
use chirp::timeline::Timeline;
use serde_json::Value;
use sqlx::PgPool;

use crate::helpers::{TestApp, page_all, tweet_ids, urlencode};

/// 45 tweets by alice (whom bob follows), oldest first; returns (alice id, bob token, ids newest
/// first).
async fn setup(app: &TestApp) -> (i64, String, Vec<i64>) {
    let (alice, ta) = app.signup("alice").await;
    let (_, tb) = app.signup("bob").await;
    app.follow(&tb, alice).await;
    let mut ids = app.tweets(&ta, "tweet ", 45).await;
    app.drain().await;
    ids.reverse();
    (alice, tb, ids)
}

/// The tweets of the newsfeed of `token`'s user in the order of its entries in Postgres: the
/// order of their tweets' times, except that an entry that arrived behind newer ones (here the
/// follow's backfill, if it ran after some of the fan-outs) lies above them.
async fn feed_order(app: &TestApp, token: &str) -> Vec<i64> {
    let me = app
        .get("/api/accounts/login_status/", Some(token))
        .await
        .body["user"]["id"]
        .as_i64()
        .expect("user");
    sqlx::query_scalar("select tweet_id from newsfeeds where user_id = $1 order by created_at desc")
        .bind(me)
        .fetch_all(app.db())
        .await
        .expect("newsfeed")
}

fn sorted(ids: &[i64]) -> Vec<i64> {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids
}

async fn pages_equal_the_full_list(app: &TestApp) {
    let (alice, tb, ids) = setup(app).await;
    for size in [1, 7, 20, 44, 45, 100] {
        let listed = page_all(app, &format!("/api/tweets/?user_id={alice}"), None, size).await;
        assert_eq!(listed, ids, "user tweets, page_size {size}");
        let feed = page_all(app, "/api/newsfeeds/", Some(&tb), size).await;
        assert_eq!(
            feed,
            feed_order(app, &tb).await,
            "newsfeed, page_size {size}"
        );
        assert_eq!(sorted(&feed), sorted(&ids));
    }
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn paging_45_items_in_any_page_size_gives_the_whole_list(db: PgPool) {
    pages_equal_the_full_list(&TestApp::new(db).await).await;
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn paging_gives_the_whole_list_with_the_cache_off(db: PgPool) {
    pages_equal_the_full_list(&TestApp::with(db, |c| c.cache = CacheMode::Off).await).await;
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn paging_gives_the_whole_list_across_a_small_cached_window(db: PgPool) {
    let app = TestApp::with(db, |c| c.cache_list_limit = 10).await;
    pages_equal_the_full_list(&app).await;
    assert!(
        app.stat("fallbacks") > 0,
        "pages past the window came from Postgres"
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_page_with_a_cached_member_it_can_not_decode_continues_right_below_it(db: PgPool) {
    let app = TestApp::with(db, |c| c.cache_list_limit = 10).await;
    let (alice, tb, ids) = setup(&app).await;
    let bob = app.get("/api/accounts/login_status/", Some(&tb)).await.body["user"]["id"]
        .as_i64()
        .expect("bob");
    let feeds = [
        (
            Timeline::UserTweets(alice),
            format!("/api/tweets/?user_id={alice}"),
            None,
        ),
        (
            Timeline::Newsfeed(bob),
            "/api/newsfeeds/".to_owned(),
            Some(tb.as_str()),
        ),
    ];
    for (timeline, base, token) in &feeds {
        let expected = match token {
            Some(token) => feed_order(&app, token).await,
            None => ids.clone(),
        };
        // Cache the window of 10, then slip two members of no known encoding in right above
        // the 3rd and the 4th newest.
        assert_eq!(page_all(&app, base, *token, 45).await, expected);
        let key = app.list_key(*timeline);
        let mut r = app.redis().await;
        let scores: Vec<(Vec<u8>, i64)> = redis::cmd("ZREVRANGE")
            .arg(&key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut r)
            .await
            .expect("zrange");
        assert_eq!(scores.len(), 10, "an incomplete window of 10");
        for i in [2, 3] {
            // Right above the i-th newest in the set's order (same second, a member it is
            // the prefix of), and too long for any id.
            let mut junk = scores[i].0.clone();
            junk.extend([0xff; 9]);
            let _: i64 = redis::cmd("ZADD")
                .arg(&key)
                .arg(scores[i].1)
                .arg(junk)
                .query_async(&mut r)
                .await
                .expect("zadd");
        }
        // The first page of 5 (6 with the one that tells whether there is a next page) finds
        // 4 it can decode in a full window: Postgres gives the next 2 from right below them,
        // not from below the list's floor (a gap) nor from the top (repeats).
        for size in [5, 3] {
            assert_eq!(
                page_all(&app, base, *token, size).await,
                expected,
                "{base}, {size}"
            );
        }
    }
}

fn created(page: &Value, i: usize) -> String {
    urlencode(page["results"][i]["created_at"].as_str().unwrap())
}

/// The course's `newsfeeds/tests test_pagination`: a refresh from the newest entry a client
/// holds returns nothing, then exactly the new tweet. Two tweets posted before their fan-outs
/// ran: the older one's fan-out row arrives after the newer one's time (a refresh used to
/// return it again).
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_refresh_from_the_newest_entry_returns_nothing_then_exactly_the_new_tweet(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    let (_, tb) = app.signup("bob").await;
    app.follow(&tb, alice).await;
    app.drain().await;
    let older = app.tweets(&ta, "older ", 3).await;
    app.drain().await;
    for flush in [false, true] {
        if flush {
            app.flush_cache().await;
        }
        let first = app.get("/api/newsfeeds/?page_size=2", Some(&tb)).await.body;
        assert_eq!(tweet_ids(&first), [older[2], older[1]]);
        let refresh = format!("/api/newsfeeds/?created_at__gt={}", created(&first, 0));
        let res = app.get(&refresh, Some(&tb)).await;
        assert_eq!(
            tweet_ids(&res.body),
            Vec::<i64>::new(),
            "cache flushed: {flush}"
        );
    }
    let first = app.get("/api/newsfeeds/", Some(&tb)).await.body;
    let refresh = format!("/api/newsfeeds/?created_at__gt={}", created(&first, 0));
    let new = app.tweet(&ta, "new").await["id"].as_i64().unwrap();
    app.drain().await;
    let res = app.get(&refresh, Some(&tb)).await;
    assert_eq!(tweet_ids(&res.body), [new]);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn newer_than_and_between_cursors_work(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, _, ids) = setup(&app).await;
    let base = format!("/api/tweets/?user_id={alice}");
    let all = app.get(&format!("{base}&page_size=45"), None).await.body;

    // Pull to refresh: everything newer than item 30, newest first.
    let res = app
        .get(
            &format!("{base}&created_at__gt={}", created(&all, 30)),
            None,
        )
        .await;
    assert_eq!(tweet_ids(&res.body), ids[..30].to_vec());
    assert_eq!(res.body["has_next_page"], false);
    // Nothing newer than the newest.
    let res = app
        .get(&format!("{base}&created_at__gt={}", created(&all, 0)), None)
        .await;
    assert_eq!(tweet_ids(&res.body), Vec::<i64>::new());

    // Gap filling: strictly between items 5 and 20, page_size at a time from the __lt end.
    let between = format!(
        "{base}&created_at__lt={}&created_at__gt={}",
        created(&all, 5),
        created(&all, 20)
    );
    let res = app.get(&format!("{between}&page_size=10"), None).await;
    assert_eq!(tweet_ids(&res.body), ids[6..16].to_vec());
    assert_eq!(res.body["has_next_page"], true);
    let res = app.get(&format!("{between}&page_size=14"), None).await;
    assert_eq!(tweet_ids(&res.body), ids[6..20].to_vec());
    assert_eq!(res.body["has_next_page"], false);

    // Older than the oldest: empty.
    let res = app
        .get(
            &format!("{base}&created_at__lt={}", created(&all, 44)),
            None,
        )
        .await;
    assert_eq!(res.body["results"].as_array().unwrap().len(), 0);
    assert_eq!(res.body["has_next_page"], false);
    // Any RFC 3339 timestamp works as a cursor, e.g. with an offset.
    let res = app
        .get(
            &format!("{base}&created_at__lt=2000-01-01T01:00:00%2B01:00"),
            None,
        )
        .await;
    assert_eq!(res.status, StatusCode::OK);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn bad_cursors_and_page_sizes_are_400s(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    for (query, field) in [
        ("created_at__lt=yesterday", "created_at__lt"),
        ("created_at__gt=2026-13-01T00:00:00Z", "created_at__gt"),
        ("page_size=0", "page_size"),
        ("page_size=101", "page_size"),
        ("page_size=ten", "page_size"),
    ] {
        let res = app
            .get(&format!("/api/tweets/?user_id={alice}&{query}"), None)
            .await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{query}");
        assert!(
            res.body["errors"][field].is_array(),
            "{query}: {}",
            res.body
        );
        let res = app
            .get(&format!("/api/newsfeeds/?{query}"), Some(&ta))
            .await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{query}");
    }
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn concurrent_tweets_get_unique_timestamps_and_page_without_skips(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    let mut tasks = Vec::new();
    for i in 0..40 {
        let app_ = app.app.clone();
        let ta = ta.clone();
        tasks.push(tokio::spawn(async move {
            use tower::ServiceExt;
            let req = axum::http::Request::post("/api/tweets/")
                .header("authorization", format!("Bearer {ta}"))
                .header("content-type", "application/json")
                .body(axum::body::Body::from(format!("{{\"content\": \"t{i}\"}}")))
                .unwrap();
            app_.oneshot(req).await.unwrap().status()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), StatusCode::CREATED);
    }
    let distinct: i64 = sqlx::query_scalar("select count(distinct created_at) from tweets")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(distinct, 40);
    let listed = page_all(&app, &format!("/api/tweets/?user_id={alice}"), None, 3).await;
    let mut sorted = listed.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 40);
    assert_eq!(listed.len(), 40);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn the_schema_refuses_equal_timestamps_in_a_listing(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    let t = app.tweet(&ta, "first").await;
    let dup = sqlx::query(
        "insert into tweets (user_id, content, created_at) values ($1, 'dup', $2::timestamptz)",
    )
    .bind(alice)
    .bind(t["created_at"].as_str().unwrap())
    .execute(app.db())
    .await;
    assert!(chirp::db::violates(
        &dup.unwrap_err(),
        "tweets_created_at_key"
    ));
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_refresh_of_more_than_1000_items_says_there_is_a_gap(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, _) = app.signup("alice").await;
    sqlx::query(
        "insert into tweets (user_id, content, created_at)
         select $1, 'bulk ' || i, timestamptz '2020-01-01' + i * interval '1 second' from generate_series(1, 1005) i",
    )
    .bind(alice)
    .execute(app.db())
    .await
    .unwrap();
    let res = app
        .get(
            &format!("/api/tweets/?user_id={alice}&created_at__gt=2019-01-01T00:00:00Z"),
            None,
        )
        .await;
    let results = res.body["results"].as_array().unwrap();
    assert_eq!(results.len(), 1000);
    assert_eq!(res.body["has_next_page"], true);
    assert_eq!(results[0]["content"], "bulk 1005");
    let res = app
        .get(
            &format!("/api/tweets/?user_id={alice}&created_at__gt=2020-01-01T00:10:00Z"),
            None,
        )
        .await;
    assert_eq!(res.body["results"].as_array().unwrap().len(), 1005 - 600);
    assert_eq!(res.body["has_next_page"], false);
}

/// A cached timeline scores whole seconds and keeps the µs inside a second in its members
/// (`chirp::cache::lists::pack_entry`): cursors on a second, inside one, at its first and last
/// µs, from above and below, must page exactly as Postgres orders the tweets, in a cached
/// window and below it.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn cursors_on_and_inside_one_second_page_as_postgres_orders_the_tweets(db: PgPool) {
    let app = TestApp::with(db, |c| c.cache_list_limit = 8).await;
    let (alice, ta) = app.quick_user("alice").await;
    let (_, tb) = app.quick_user("bob").await;
    app.follow(&tb, alice).await;
    // µs from a whole second: several tweets on whole seconds (as every imported tweet is),
    // others inside them, at their first and last µs.
    let offsets: [i64; 12] = [
        -2_000_000, -1_000_000, -999_999, -1, 0, 1, 250_000, 999_999, 1_000_000, 1_000_001,
        2_000_000, 3_500_000,
    ];
    let ids = app.tweets(&ta, "t", offsets.len()).await;
    app.drain().await;
    let second = 1_478_606_400_000_000_i64; // 2016-11-08T12:00:00Z
    for (id, offset) in ids.iter().zip(offsets) {
        let at = chrono::DateTime::from_timestamp_micros(second + offset).unwrap();
        for sql in [
            "update tweets set created_at = $2 where id = $1",
            "update newsfeeds set created_at = $2, arrived_at = $2 where tweet_id = $1",
        ] {
            sqlx::query(sql)
                .bind(id)
                .bind(at)
                .execute(app.db())
                .await
                .unwrap();
        }
    }
    app.flush_cache().await;
    // (µs, id), newest first.
    let truth: Vec<(i64, i64)> = offsets
        .iter()
        .map(|o| second + o)
        .zip(ids.iter().copied())
        .rev()
        .collect();
    let mut cursors: Vec<i64> = truth
        .iter()
        .flat_map(|(t, _)| [t - 1, *t, t + 1])
        .chain((-3..=4).map(|s| second + s * 1_000_000))
        .collect();
    cursors.sort_unstable();
    cursors.dedup();
    let at = |t: i64| {
        urlencode(
            &chrono::DateTime::from_timestamp_micros(t)
                .unwrap()
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        )
    };
    let expect = |lt: Option<i64>, gt: Option<i64>, size: usize| -> Vec<i64> {
        // `__gt` alone is a pull-to-refresh: everything newer.
        let size = if gt.is_some() && lt.is_none() {
            usize::MAX
        } else {
            size
        };
        truth
            .iter()
            .filter(|(t, _)| lt.is_none_or(|lt| *t < lt) && gt.is_none_or(|gt| *t > gt))
            .take(size)
            .map(|(_, id)| *id)
            .collect()
    };
    let feeds = [
        (format!("/api/tweets/?user_id={alice}"), None),
        ("/api/newsfeeds/?x=1".to_owned(), Some(tb.as_str())),
    ];
    for (base, token) in &feeds {
        // The first page caches the newest 8 (the floor lies inside the data).
        let first = app.get(&format!("{base}&page_size=3"), *token).await;
        assert_eq!(tweet_ids(&first.body), expect(None, None, 3), "{base}");
        let hits = app.stat("hits");
        for size in [1, 3] {
            let mut cases: Vec<(Option<i64>, Option<i64>)> = Vec::new();
            for c in &cursors {
                cases.push((Some(*c), None));
                cases.push((None, Some(*c)));
                cases.extend(
                    cursors
                        .iter()
                        .filter(|g| *g < c)
                        .map(|g| (Some(*c), Some(*g))),
                );
            }
            for (lt, gt) in cases {
                let mut uri = format!("{base}&page_size={size}");
                if let Some(lt) = lt {
                    uri += &format!("&created_at__lt={}", at(lt));
                }
                if let Some(gt) = gt {
                    uri += &format!("&created_at__gt={}", at(gt));
                }
                let page = app.get(&uri, *token).await;
                assert_eq!(tweet_ids(&page.body), expect(lt, gt, size), "{uri}");
            }
        }
        assert!(app.stat("hits") > hits, "{base}: read from the cached list");
    }
}
