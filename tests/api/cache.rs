//! The cache-aside behaviour, observed through the API and by looking into Redis.

use axum::http::StatusCode;
use chirp::timeline::Timeline;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{CountsOf, TestApp, member_tweet, page_all, tweet_ids};

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_newsfeed_is_loaded_once_then_served_and_updated_in_redis(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    let (_, tb) = app.signup("bob").await;
    app.follow(&tb, alice).await;
    let first = app.tweet(&ta, "before any read").await["id"]
        .as_i64()
        .unwrap();
    app.drain().await;
    let bob_feed = Timeline::Newsfeed(2);
    assert_eq!(
        app.cached_members(bob_feed).await,
        None,
        "nothing cached before a read"
    );

    // Miss: loaded from Postgres, stored.
    assert_eq!(
        tweet_ids(&app.get("/api/newsfeeds/", Some(&tb)).await.body),
        vec![first]
    );
    assert_eq!((app.stat("misses"), app.stat("loads")), (1, 1));
    let members = app
        .cached_members(bob_feed)
        .await
        .expect("cached after the first read");
    assert_eq!(
        members.len(),
        2,
        "one entry and the completeness marker: {members:?}"
    );

    // Hit.
    assert_eq!(
        tweet_ids(&app.get("/api/newsfeeds/", Some(&tb)).await.body),
        vec![first]
    );
    assert_eq!((app.stat("hits"), app.stat("loads")), (1, 1));

    // A write updates the cached list in place.
    let second = app.tweet(&ta, "after").await["id"].as_i64().unwrap();
    app.drain().await;
    let members = app.cached_members(bob_feed).await.unwrap();
    assert_eq!(members.len(), 3);
    assert_eq!(member_tweet(&members[0]), second, "{members:?}");
    assert_eq!(
        tweet_ids(&app.get("/api/newsfeeds/", Some(&tb)).await.body),
        vec![second, first]
    );
    assert_eq!(app.stat("loads"), 1, "served without reloading");
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn cached_lists_are_trimmed_to_the_limit_and_paging_continues_in_postgres(db: PgPool) {
    let app = TestApp::with(db, |c| c.cache_list_limit = 10).await;
    let (alice, ta) = app.signup("alice").await;
    let mut ids = app.tweets(&ta, "t", 25).await;
    ids.reverse();
    let listing = format!("/api/tweets/?user_id={alice}");
    app.get(&listing, None).await; // load
    for i in 25..30 {
        ids.insert(
            0,
            app.tweet(&ta, &format!("t{i}")).await["id"]
                .as_i64()
                .unwrap(),
        );
    }
    let members = app
        .cached_members(Timeline::UserTweets(alice))
        .await
        .unwrap();
    assert_eq!(
        members.len(),
        10,
        "trimmed to the limit, marker gone: {members:?}"
    );
    let expected: Vec<String> = ids[..10].iter().map(|i| i.to_string()).collect();
    assert_eq!(members, expected);
    assert_eq!(page_all(&app, &listing, None, 4).await, ids);
    assert!(app.stat("fallbacks") > 0);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn thirty_concurrent_cold_reads_load_once_and_leave_no_duplicates(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    for i in 0..15 {
        app.tweet(&ta, &format!("t{i}")).await;
    }
    let mut tasks = Vec::new();
    for _ in 0..30 {
        let app_ = app.app.clone();
        tasks.push(tokio::spawn(async move {
            use tower::ServiceExt;
            let req = axum::http::Request::get(format!("/api/tweets/?user_id={alice}"))
                .body(axum::body::Body::empty())
                .unwrap();
            let res = app_.oneshot(req).await.unwrap();
            assert_eq!(res.status(), StatusCode::OK);
            http_body_util::BodyExt::collect(res.into_body())
                .await
                .unwrap()
                .to_bytes()
        }));
    }
    let mut bodies = Vec::new();
    for t in tasks {
        bodies.push(t.await.unwrap());
    }
    assert!(
        bodies.windows(2).all(|w| w[0] == w[1]),
        "every reader saw the same page"
    );
    let members = app
        .cached_members(Timeline::UserTweets(alice))
        .await
        .unwrap();
    assert_eq!(members.len(), 16, "15 entries + marker, no duplicates");
    assert_eq!(app.stat("loads"), 1, "one Postgres load for the stampede");
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn paging_survives_a_cache_flush_in_the_middle(db: PgPool) {
    let app = TestApp::with(db, |c| c.cache_list_limit = 8).await;
    let (alice, ta) = app.signup("alice").await;
    let mut ids = app.tweets(&ta, "t", 20).await;
    ids.reverse();
    let base = format!("/api/tweets/?user_id={alice}&page_size=6");
    let page1 = app.get(&base, None).await.body;
    assert_eq!(tweet_ids(&page1), ids[..6].to_vec());
    app.flush_cache().await;
    let last = page1["results"][5]["created_at"]
        .as_str()
        .unwrap()
        .replace(':', "%3A");
    let page2 = app
        .get(&format!("{base}&created_at__lt={last}"), None)
        .await
        .body;
    assert_eq!(tweet_ids(&page2), ids[6..12].to_vec());
    app.flush_cache().await;
    let last = page2["results"][5]["created_at"]
        .as_str()
        .unwrap()
        .replace(':', "%3A");
    let page3 = app
        .get(&format!("{base}&created_at__lt={last}&page_size=100"), None)
        .await
        .body;
    assert_eq!(tweet_ids(&page3), ids[12..].to_vec());
}

/// The warm path must not touch the tweets or newsfeeds tables (the bar); in fact it
/// makes no Postgres query at all. To prove it, every table a read could touch is renamed away:
/// any query against them fails, which would turn the response into a 500.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_warm_first_page_makes_no_postgres_query(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    let (_, tb) = app.signup("bob").await;
    app.follow(&tb, alice).await;
    for i in 0..30 {
        app.tweet(&ta, &format!("t{i}")).await;
    }
    app.drain().await;
    let like = serde_json::json!({"content_type": "tweet", "object_id": tweet_ids(&app.get(&format!("/api/tweets/?user_id={alice}"), None).await.body)[3]});
    app.post("/api/likes/", Some(&tb), like).await;
    let feed = app.get("/api/newsfeeds/", Some(&tb)).await.body;
    let tweets = app
        .get(&format!("/api/tweets/?user_id={alice}"), Some(&tb))
        .await
        .body;
    assert_eq!(feed["results"][3]["tweet"]["has_liked"], true);

    let tables = [
        "tweets",
        "newsfeeds",
        "users",
        "auth_tokens",
        "tweet_likes",
        "friendships",
    ];
    for t in tables {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "alter table {t} rename to {t}_away"
        )))
        .execute(app.db())
        .await
        .unwrap();
    }
    let warm_feed = app.get("/api/newsfeeds/", Some(&tb)).await;
    assert_eq!(warm_feed.status, StatusCode::OK, "{}", warm_feed.body);
    assert_eq!(warm_feed.body, feed);
    let warm_tweets = app
        .get(&format!("/api/tweets/?user_id={alice}"), Some(&tb))
        .await;
    assert_eq!(warm_tweets.status, StatusCode::OK);
    assert_eq!(warm_tweets.body, tweets);

    // The control: a read that needs Postgres does fail while the tables are away. (The first
    // page would not: this process holds its head, tweets, counters and author in memory; a
    // page below a cursor reads the list from Redis, and finds it gone.)
    app.flush_cache().await;
    let below = format!("/api/tweets/?user_id={alice}&created_at__lt=2100-01-01T00:00:00Z");
    assert_eq!(
        app.get(&below, None).await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    for t in tables {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "alter table {t}_away rename to {t}"
        )))
        .execute(app.db())
        .await
        .unwrap();
    }
    assert_eq!(app.get("/api/newsfeeds/", Some(&tb)).await.body, feed);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn deleting_a_tweet_removes_it_from_every_cached_list(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    let mut readers = Vec::new();
    for name in ["bob", "carol", "dave"] {
        let (id, token) = app.signup(name).await;
        app.follow(&token, alice).await;
        readers.push((id, token));
    }
    let keep = app.tweet(&ta, "keep").await["id"].as_i64().unwrap();
    let gone = app.tweet(&ta, "gone").await["id"].as_i64().unwrap();
    app.drain().await;
    // bob and carol have cached feeds; dave's is not cached.
    for (_, token) in &readers[..2] {
        assert_eq!(
            tweet_ids(&app.get("/api/newsfeeds/", Some(token)).await.body),
            vec![gone, keep]
        );
    }
    app.get(&format!("/api/tweets/?user_id={alice}"), None)
        .await;

    let res = app.delete(&format!("/api/tweets/{gone}/"), Some(&ta)).await;
    assert_eq!(res.status, StatusCode::OK);
    for (id, token) in &readers {
        assert_eq!(
            tweet_ids(&app.get("/api/newsfeeds/", Some(token)).await.body),
            vec![keep]
        );
        if let Some(members) = app.cached_members(Timeline::Newsfeed(*id)).await {
            assert!(
                !members.iter().any(|m| member_tweet(m) == gone),
                "{members:?}"
            );
        }
    }
    assert_eq!(
        tweet_ids(
            &app.get(&format!("/api/tweets/?user_id={alice}"), None)
                .await
                .body
        ),
        vec![keep]
    );
    assert_eq!(
        app.cached_members(Timeline::UserTweets(alice))
            .await
            .unwrap(),
        vec![keep.to_string(), "#".to_string()]
    );
    let mut r = app.redis().await;
    let object: Option<String> = redis::cmd("GET")
        .arg(app.state.cache.keys().unwrap().tweet(gone))
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(object.as_deref(), Some("-"), "tombstone");
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_page_spliced_from_cached_json_equals_the_one_built_from_postgres(db: PgPool) {
    let on = TestApp::new(db.clone()).await;
    let (alice, ta) = on.signup("alice").await;
    let (_, tb) = on.signup("bob").await;
    on.follow(&tb, alice).await;
    let with_place = serde_json::json!({"content": "a \"quoted\" | piped\nline, ünïcode", "lon": -149.9, "lat": 61.2});
    assert_eq!(
        on.post("/api/tweets/", Some(&ta), with_place).await.status,
        StatusCode::CREATED
    );
    let liked = on.tweet(&ta, "liked").await["id"].as_i64().unwrap();
    on.post(
        "/api/likes/",
        Some(&tb),
        serde_json::json!({"content_type": "tweet", "object_id": liked}),
    )
    .await;
    on.drain().await;
    let off = TestApp::with(db, |c| c.cache = chirp::config::CacheMode::Off).await;
    for uri in ["/api/newsfeeds/", &format!("/api/tweets/?user_id={alice}")] {
        on.get(uri, Some(&tb)).await; // fills the caches
        let cached = on.get(uri, Some(&tb)).await.body;
        let built = off.get(uri, Some(&tb)).await.body;
        assert_eq!(cached, built, "{uri}");
        assert_eq!(cached["results"].as_array().map(Vec::len), Some(2));
    }
    let feed = on.get("/api/newsfeeds/", Some(&tb)).await.body;
    assert_eq!(feed["results"][0]["tweet"]["has_liked"], true);
    assert_eq!(feed["results"][0]["tweet"]["likes_count"], 1);
    assert_eq!(
        feed["results"][1]["tweet"]["coordinates"],
        serde_json::json!([-149.9, 61.2])
    );
    assert!(on.stat("hits") > 0, "served from the cache");
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_warm_page_takes_its_counters_with_the_range_and_they_stay_exact(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    let (_, tb) = app.signup("bob").await;
    let mut ids = app.tweets(&ta, "t", 3).await;
    ids.reverse();
    let listing = format!("/api/tweets/?user_id={alice}");
    // `(id, field)` of each tweet on the page, as the holder of `token` reads it.
    let page = async |token: Option<&str>, field: &str| {
        let body = app.get(&listing, token).await.body;
        (body["results"].as_array().expect("results").iter())
            .map(|t| (t["id"].as_i64().unwrap(), t[field].clone()))
            .collect::<Vec<_>>()
    };
    let likes = |page: &[(i64, i64)]| {
        page.iter()
            .map(|(id, n)| (*id, json!(n)))
            .collect::<Vec<_>>()
    };
    // Reads the page until one takes every counter it needs with the range.
    let warm = async |token: Option<&str>, field: &str, expected: Vec<(i64, Value)>| {
        let before = app.stat("prefetched");
        for _ in 0..5 {
            assert_eq!(page(token, field).await, expected);
            if app.stat("prefetched") > before {
                return;
            }
        }
        panic!("a warm page never took what it needs with the range");
    };
    // The list is loaded, the tweets come into the process's memory, then the page it
    // remembers is read with its counters in one round trip.
    warm(
        None,
        "likes_count",
        likes(&[(ids[0], 0), (ids[1], 0), (ids[2], 0)]),
    )
    .await;

    // A like between two reads: the counter read with the range is the new one.
    app.like(&tb, "tweet", ids[1]).await;
    let before = app.stat("prefetched");
    let liked_one = likes(&[(ids[0], 0), (ids[1], 1), (ids[2], 0)]);
    assert_eq!(page(None, "likes_count").await, liked_one);
    assert_eq!(
        app.stat("prefetched"),
        before + 1,
        "the same page, one round trip"
    );

    // A counter missing from Redis comes from Postgres, not as zero.
    let mut r = app.redis().await;
    let _: () = redis::cmd("DEL")
        .arg(app.counts_key(CountsOf::Tweet(ids[1])))
        .query_async(&mut r)
        .await
        .expect("del");
    assert_eq!(page(None, "likes_count").await, liked_one);

    // The page changes: the guess is the old page; the new tweet's counter is asked for.
    let new = app.tweet(&ta, "new").await["id"].as_i64().unwrap();
    app.like(&tb, "tweet", new).await;
    let expected = likes(&[(new, 1), (ids[0], 0), (ids[1], 1), (ids[2], 0)]);
    assert_eq!(page(None, "likes_count").await, expected);
    assert_eq!(page(None, "likes_count").await, expected);
    // And a deleted tweet leaves it although the guess still names it.
    let deleted = app.delete(&format!("/api/tweets/{new}/"), Some(&ta)).await;
    assert_eq!(deleted.status, StatusCode::OK);
    assert_eq!(page(None, "likes_count").await, expected[1..]);

    // A logged-in reader's likes come with the range too.
    let flags = |page: &[(i64, bool)]| {
        page.iter()
            .map(|(id, f)| (*id, json!(f)))
            .collect::<Vec<_>>()
    };
    warm(
        Some(&tb),
        "has_liked",
        flags(&[(ids[0], false), (ids[1], true), (ids[2], false)]),
    )
    .await;
    app.like(&tb, "tweet", ids[2]).await;
    let before = app.stat("prefetched");
    assert_eq!(
        page(Some(&tb), "has_liked").await,
        flags(&[(ids[0], false), (ids[1], true), (ids[2], true)])
    );
    assert_eq!(app.stat("prefetched"), before + 1);
}

/// A merge into an incomplete list skips what lies below its floor: with whole-second scores,
/// "below" inside the floor's own second is decided by the members' sub-second prefix.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_merge_inside_the_floors_second_keeps_only_what_lies_above_the_floor(db: PgPool) {
    use chirp::cache::{Guard, Update};
    use chirp::timeline::ListEntry;

    let app = TestApp::new(db).await;
    let cache = &app.state.cache;
    let list = Timeline::UserTweets(1);
    let second = 1_478_606_400_000_000_i64;
    let entry = |tweet_id: i64, micros: i64| ListEntry {
        id: tweet_id,
        tweet_id,
        author_id: 1,
        created_at: chrono::DateTime::from_timestamp_micros(second + micros).unwrap(),
        shift: 0,
    };
    // An incomplete list whose floor is half a second into `second`.
    let generation = cache.begin_load(list.key()).await.unwrap();
    let loaded = [entry(20, 2_000_000), entry(10, 500_000)].map(|e| list.scored(&e));
    assert!(
        cache
            .fill(list.key(), &generation, false, &loaded)
            .await
            .unwrap()
    );

    let merged = [
        entry(13, 600_000),
        entry(11, 499_999),
        entry(12, 0),
        entry(21, 1_000_000),
    ];
    cache
        .apply_best_effort(&[Update::Merge {
            list: list.key(),
            guard: Guard::None,
            after: None,
            entries: merged.iter().map(|e| list.scored(e)).collect(),
        }])
        .await;
    assert_eq!(
        app.cached_members(list).await.unwrap(),
        ["20", "21", "13", "10"].map(String::from),
        "above the floor: merged in order; below it, in the same second: left to Postgres"
    );
}

/// Two writers' cache steps that reach Redis out of order: a merge whose predecessor (the
/// timeline's newest entry before it) the list lacks drops the list, so no reader sees the
/// newer entry without the older one (and then refreshes past it); one whose predecessor is
/// there, sub-second part included, is applied.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_merge_whose_predecessor_has_not_landed_drops_the_list(db: PgPool) {
    use chirp::cache::{Guard, Update};
    use chirp::timeline::ListEntry;

    let app = TestApp::new(db).await;
    let cache = &app.state.cache;
    let list = Timeline::UserTweets(1);
    let second = 1_478_606_400_000_000_i64;
    let at = |micros: i64| chrono::DateTime::from_timestamp_micros(second + micros).unwrap();
    let entry = |tweet_id: i64, micros: i64| ListEntry {
        id: tweet_id,
        tweet_id,
        author_id: 1,
        created_at: at(micros),
        shift: 0,
    };
    let fill = async || {
        let generation = cache.begin_load(list.key()).await.unwrap();
        let loaded = [entry(10, 700_001)].map(|e| list.scored(&e));
        assert!(
            cache
                .fill(list.key(), &generation, true, &loaded)
                .await
                .unwrap()
        );
    };
    let merge = |e: ListEntry, after: i64| Update::Merge {
        list: list.key(),
        guard: Guard::None,
        after: Some(second + after),
        entries: vec![list.scored(&e)],
    };
    fill().await;
    // Entry 12 follows 11 (same second, a µs later than 10), which has not landed.
    cache
        .apply_best_effort(&[merge(entry(12, 900_000), 700_002)])
        .await;
    assert_eq!(app.cached_members(list).await, None, "dropped");
    fill().await;
    cache
        .apply_best_effort(&[merge(entry(11, 700_002), 700_001)])
        .await;
    cache
        .apply_best_effort(&[merge(entry(12, 900_000), 700_002)])
        .await;
    assert_eq!(
        app.cached_members(list).await.unwrap(),
        ["12", "11", "10", "#"].map(String::from)
    );
}

/// A cached list entry names no author: hydration takes each author from the tweet, from the
/// near cache, Redis (a second `MGET` once the tweets are read) or Postgres.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_page_finds_its_authors_through_its_tweets_wherever_they_are_cached(db: PgPool) {
    let app = TestApp::with(db, |c| c.object_cache_secs = 0).await;
    let (alice, ta) = app.signup("alice").await;
    let (carol, tc) = app.signup("carol").await;
    let (_, tb) = app.signup("bob").await;
    app.follow(&tb, alice).await;
    app.follow(&tb, carol).await;
    app.tweet(&ta, "by alice").await;
    app.tweet(&tc, "by carol").await;
    app.drain().await;
    let authors = |page: &Value| -> Vec<String> {
        page["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["tweet"]["user"]["username"].as_str().unwrap().to_owned())
            .collect()
    };
    let expected = ["carol", "alice"].map(String::from);
    // Loaded, then from Redis alone (no near cache: tweets, then their authors).
    for _ in 0..2 {
        let page = app.get("/api/newsfeeds/", Some(&tb)).await.body;
        assert_eq!(authors(&page), expected, "{page}");
    }
    // An author missing from Redis comes from Postgres.
    let keys = app.state.cache.keys().unwrap();
    let mut r = app.redis().await;
    let _: i64 = redis::cmd("DEL")
        .arg(keys.user(carol))
        .query_async(&mut r)
        .await
        .unwrap();
    let page = app.get("/api/newsfeeds/", Some(&tb)).await.body;
    assert_eq!(authors(&page), expected, "{page}");
}

/// Objects written in one batch (`Cache::put_tweets`; a cold page's fill does the same: one
/// `SET_IF_NEWER_EACH` call for all its objects) keep, key by key, the newer of what Redis holds
/// and what the batch brings: a newer or equally new cached object stays, an older one or a
/// floor of the same version (`"{version}|"`) is replaced, a deleted tweet's tombstone stays, a
/// missing one is stored. 1,400 keys, in one call on a single Redis: far more than a page's
/// (decision 0038 tried reading them with `MGET`s of 1,000 keys; this test caught a wrong index
/// into a chunk).
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_batch_of_object_writes_keeps_the_newer_of_each_key(db: PgPool) {
    use chirp::cache::counts::Versioned;
    use chirp::model::{TweetCounts, TweetRecord};
    let app = TestApp::new(db).await;
    let keys = app.keys();
    let mut r = app.redis().await;
    // 700 tweets: 1,400 keys, in one script call on a single Redis.
    let counts = |i: i64, version: i64| TweetCounts {
        likes: i,
        comments: 0,
        replies: 0,
        retweets: 0,
        version,
    };
    let rows: Vec<(TweetRecord, TweetCounts)> = (0..700)
        .map(|i| {
            let tweet: TweetRecord = serde_json::from_value(json!({
                "id": 1_000 + i, "user_id": 7, "content": format!("tweet {i}"),
                "created_at": "2026-12-07T18:00:00Z",
            }))
            .unwrap();
            (tweet, counts(i, 5))
        })
        .collect();
    // What Redis holds before, by case (i % 6): nothing, newer counts, older counts, a floor
    // of the same version, the same version with other numbers, a tombstone.
    let held = |i: i64| -> Option<String> {
        match i % 6 {
            1 => Some(counts(-1, 6).encode()),
            2 => Some(counts(-1, 4).encode()),
            3 => Some("5|".to_owned()),
            4 => Some(counts(-1, 5).encode()),
            _ => None,
        }
    };
    for i in 0..700 {
        let id = 1_000 + i;
        if let Some(value) = held(i) {
            let _: () = redis::cmd("SET")
                .arg(keys.tweet_counts(id))
                .arg(value)
                .query_async(&mut r)
                .await
                .unwrap();
        }
        if i % 6 == 5 {
            let _: () = redis::cmd("SET")
                .arg(keys.tweet(id))
                .arg("-")
                .query_async(&mut r)
                .await
                .unwrap();
        }
    }
    app.state.cache.put_tweets(&rows, &[]).await;
    for i in 0..700 {
        let id = 1_000 + i;
        let expected = match i % 6 {
            1 | 4 => held(i),
            _ => Some(counts(i, 5).encode()),
        };
        assert_eq!(
            app.raw_get(&keys.tweet_counts(id)).await,
            expected,
            "tweet {i}'s counts"
        );
        let object = app.raw_get(&keys.tweet(id)).await;
        if i % 6 == 5 {
            assert_eq!(
                object.as_deref(),
                Some("-"),
                "tweet {i}: the tombstone stays"
            );
        } else {
            let object = object.unwrap_or_default();
            assert!(
                object.contains(&format!("tweet {i}\"")),
                "tweet {i}: {object}"
            );
        }
    }
}
