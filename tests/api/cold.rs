//! Cold first pages (issue 42): a miss answers from a page-sized load and grows the cached list
//! to its window after answering (`timeline::load_window`, `Cache::extend`). A cold page must
//! be exactly the warm page and the Postgres page, many cold readers of one list must cause one
//! load, and a growth that races writes must lose nothing and bring nothing back.

use std::collections::HashSet;

use axum::http::{Method, StatusCode};
use chirp::cache::held::NearId;
use chirp::config::CacheMode;
use chirp::timeline::Timeline;
use rand::Rng;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{TestApp, eventually, page_all, seeded_rng, urlencode};
use crate::statements::Statements;

const LIST_LIMIT: u32 = 40;

/// Who is who in [`world`].
struct World {
    bob: i64,
    tb: String,
    alice: i64,
    ta: String,
    carol: i64,
    tc: String,
}

/// A newsfeed and a user timeline longer than the cached window: bob follows alice and carol,
/// who post 30 tweets each in turn, then dave's 12 earlier tweets arrive by a follow's backfill
/// (entries stamped above their tweets: `ListEntry::shift`); bob likes some.
async fn world(app: &TestApp) -> World {
    let (alice, ta) = app.signup("alice").await;
    let (carol, tc) = app.signup("carol").await;
    let (dave, td) = app.signup("dave").await;
    let (bob, tb) = app.signup("bob").await;
    app.follow(&tb, alice).await;
    app.follow(&tb, carol).await;
    let dave_tweets = app.tweets(&td, "dave", 12).await;
    for i in 0..30 {
        app.tweet(&ta, &format!("alice {i}")).await;
        app.tweet(&tc, &format!("carol {i}")).await;
    }
    app.follow(&tb, dave).await;
    app.drain().await;
    for id in dave_tweets.iter().step_by(3) {
        app.like(&tb, "tweet", *id).await;
    }
    World {
        bob,
        tb,
        alice,
        ta,
        carol,
        tc,
    }
}

/// How many members `reader`'s cached newsfeed holds (`None`: not cached).
async fn cached_len(app: &TestApp, reader: i64) -> Option<usize> {
    app.cached_members(Timeline::Newsfeed(reader))
        .await
        .map(|m| m.len())
}

/// The `created_at` of every entry of a listing, newest first (from one page of 100).
async fn times(app: &TestApp, base: &str, token: Option<&str>) -> Vec<String> {
    let sep = if base.contains('?') { '&' } else { '?' };
    let res = app.get(&format!("{base}{sep}page_size=100"), token).await;
    assert_eq!(res.status, StatusCode::OK);
    res.body["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["created_at"].as_str().expect("created_at").to_owned())
        .collect()
}

/// For every page size from 1 to 100, a first page, a page below a random entry or a refresh
/// above one, of bob's newsfeed or alice's tweets (as bob, for `has_liked`): read right after a
/// flush (cold), then again (warm, while the list may be growing), then with the cache off
/// (Postgres). The three bodies are equal, field for field.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_cold_page_is_the_warm_page_and_the_postgres_page(db: PgPool) {
    let (_, mut rng) = seeded_rng("CHIRP_COLD_SEED", "cold pages");
    let app = TestApp::with(db.clone(), |c| c.cache_list_limit = LIST_LIMIT).await;
    let off = TestApp::with(db, |c| c.cache = CacheMode::Off).await;
    let World { tb, alice, .. } = world(&app).await;
    let timelines = [
        "/api/newsfeeds/".to_owned(),
        format!("/api/tweets/?user_id={alice}"),
    ];
    let all = [
        times(&off, &timelines[0], Some(&tb)).await,
        times(&off, &timelines[1], Some(&tb)).await,
    ];
    assert_eq!((all[0].len(), all[1].len()), (72, 30));
    let mut newsfeed_pages = 0;
    for size in 1..=100 {
        let which = rng.random_range(0..2);
        newsfeed_pages += u64::from(which == 0);
        let base = &timelines[which];
        let sep = if base.contains('?') { '&' } else { '?' };
        let at = &all[which][rng.random_range(0..all[which].len())];
        let cursor = match rng.random_range(0..3) {
            0 => String::new(),
            1 => format!("&created_at__lt={}", urlencode(at)),
            _ => format!("&created_at__gt={}", urlencode(at)),
        };
        let uri = format!("{base}{sep}page_size={size}{cursor}");
        app.flush_cache().await;
        let cold = app.get(&uri, Some(&tb)).await;
        let warm = app.get(&uri, Some(&tb)).await;
        let postgres = off.get(&uri, Some(&tb)).await;
        assert_eq!(postgres.status, StatusCode::OK, "{uri}: {}", postgres.body);
        assert_eq!(cold.body, postgres.body, "cold page of {uri}");
        assert_eq!(warm.body, postgres.body, "warm page of {uri}");
    }
    // (A first page of a user's tweets may come from the list's head in this process's
    // memory, which a flush of Redis does not take.)
    assert!(
        app.stat("loads") >= newsfeed_pages,
        "every newsfeed page began cold: {} loads",
        app.stat("loads")
    );
    // The last lists grew to their window; what they hold is Postgres's.
    eventually("a list grew after its first page", async || {
        app.stat("extensions") > 0
    })
    .await;
    let report = chirp::check::run(app.db(), &app.state.cache)
        .await
        .expect("check");
    assert!(report.differences.is_empty(), "{:?}", report.differences);
}

/// A cold fill gives Redis only the objects this process does not hold at their version
/// (decision 0039). Bob's first page stores its tweets, counters and authors, and the process
/// holds them from then on; erin's first page shows some of the same tweets (carol's newest)
/// and others. One of the shared tweets, its counters and carol's profile are then taken out of
/// Redis (as an eviction would), and so is one of the others: erin's fill does not send the
/// first three again and sends the other, and her page, cold and warm, is the Postgres page all
/// the same. Then carol edits that tweet (every process forgets it) and erin's fill after a
/// flush sends its new version. On the code before, every fill sent every object of its page.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_cold_fill_sends_only_the_objects_this_process_does_not_hold(db: PgPool) {
    let writer = TestApp::with(db.clone(), |c| c.cache_list_limit = LIST_LIMIT).await;
    let off = TestApp::with(db.clone(), |c| c.cache = CacheMode::Off).await;
    let World {
        tb, carol, tc, bob, ..
    } = world(&writer).await;
    let (_, te) = writer.signup("erin").await;
    writer.follow(&te, carol).await;
    writer.drain().await;
    // A process of its own, whose memory holds none of the tweets (the writer's holds those it
    // posted).
    let app = TestApp::with(db, |c| c.cache_list_limit = LIST_LIMIT).await;
    let uri = "/api/newsfeeds/?page_size=20";
    let ids = |page: &Value| -> Vec<i64> {
        (page["results"].as_array().expect("results").iter())
            .map(|r| r["tweet"]["id"].as_i64().expect("id"))
            .collect()
    };
    let near = app.state.cache.near_objects().expect("cache on");
    eventually("the process answers from memory", async || {
        near.get(&app.state.cache, &NearId::Tweet(0));
        near.is_trusted(&app.state.cache)
    })
    .await;
    let bobs = app.get(uri, Some(&tb)).await;
    assert_eq!(bobs.body, off.get(uri, Some(&tb)).await.body);
    assert!(cached_len(&app, bob).await.is_some(), "bob's list stored");
    let erins = off.get(uri, Some(&te)).await.body;
    let (shown, seen) = (ids(&erins), ids(&bobs.body));
    let shared = *shown
        .iter()
        .find(|id| seen.contains(id))
        .expect("carol's newest on both");
    let own = *shown.last().expect("a full page");
    assert!(
        !seen.contains(&own),
        "the oldest of erin's page is not on bob's"
    );
    assert!(
        near.get(&app.state.cache, &NearId::Tweet(shared)).is_some(),
        "the fill's tweets held"
    );
    let keys = app.keys();
    let taken = [
        keys.tweet(shared),
        keys.tweet_counts(shared),
        keys.user(carol),
    ];
    let not_held = [keys.tweet(own), keys.tweet_counts(own)];
    let mut r = app.redis().await;
    let () = redis::cmd("DEL")
        .arg(&taken)
        .arg(&not_held)
        .query_async(&mut r)
        .await
        .expect("del");
    let held_before = app.stat("fill_objects_held");
    let cold = app.get(uri, Some(&te)).await;
    assert_eq!(cold.body, erins, "erin's cold page");
    for key in &taken {
        assert_eq!(app.raw_get(key).await, None, "{key}: held, not sent again");
    }
    for key in &not_held {
        assert!(app.raw_get(key).await.is_some(), "{key}: not held, sent");
    }
    // The tweets on both pages (carol's newest; dave's backfilled ones lead bob's page), their
    // counters, and carol; and those of the two rows below each page that its fill loads too.
    let both = shown.iter().filter(|id| seen.contains(id)).count() as u64;
    let held = app.stat("fill_objects_held") - held_before;
    assert!(
        (2 * both + 1..=2 * both + 5).contains(&held),
        "{held} held, {both} on both"
    );
    assert_eq!(
        app.get(uri, Some(&te)).await.body,
        erins,
        "erin's warm page"
    );
    // An edit makes every process forget the tweet: the next fill sends its new version.
    let edit = format!("/api/tweets/{shared}/");
    let res = app
        .request(
            Method::PATCH,
            &edit,
            Some(&tc),
            Some(json!({"content": "carol, edited"})),
        )
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    app.flush_cache().await;
    let cold = app.get(uri, Some(&te)).await;
    assert_eq!(
        cold.body,
        off.get(uri, Some(&te)).await.body,
        "after the edit"
    );
    let stored = app.raw_get(&keys.tweet(shared)).await.expect("sent");
    assert!(stored.contains("carol, edited"), "{stored}");
}

/// A returning reader's first newsfeed page with nothing of theirs in Redis or in the process's
/// memory (a fresh process after a flush) makes four Redis round trips: the token's miss, and
/// three for the page: the range read that finds the list missing (its sample of the liked set
/// says that is missing too), which takes along the store of the token and of the reader's
/// hidden set that one Postgres statement read with it (decision 0037; a round trip of its own
/// before), one that begins both loads (and tells whether another loader stored the list
/// meanwhile), one that stores the page, its objects and the liked set. Before decision 0030
/// the hidden set took two more (a miss, then storing it after a second statement), and before
/// round 32 (issue 42) the page took nine. It makes two Postgres statements (counted through a
/// proxy): the token's, and the page's with the reader's liked set (decision 0035; three
/// before, the liked set's on its own). The page is the Postgres page, `has_liked` included;
/// the list, the liked set, the hidden set and the token are cached after it, and the warm
/// page is the same. Then the reader mutes an account whose tweets the page shows: a first
/// touch filters them out with the set read with the token.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_first_touch_makes_four_redis_round_trips_and_two_statements(db: PgPool) {
    let off = TestApp::with(db.clone(), |c| c.cache = CacheMode::Off).await;
    let World { bob, tb, carol, .. } = world(&off).await;
    let first_touch = async |size: usize| {
        let uri = format!("/api/newsfeeds/?page_size={size}");
        // A process of its own each time, nothing in its memory nor in Redis; its Postgres
        // statements counted.
        let (statements, through) = Statements::start(&db).await;
        let app = TestApp::with(through, |c| c.cache_list_limit = LIST_LIMIT).await;
        // (What a process reads once for every reader: the authors whose tweets are pulled.)
        let pulled = app.state.pull_authors.current(app.db()).await;
        assert!(pulled.expect("pull authors").is_empty());
        let (before, queries) = (app.redis_round_trips(), statements.count());
        let cold = app.get(&uri, Some(&tb)).await;
        let trips = app.redis_round_trips() - before;
        let queries = statements.count() - queries;
        assert_eq!(cold.body, off.get(&uri, Some(&tb)).await.body, "{uri}");
        assert!(cached_len(&app, bob).await.is_some(), "{uri}: list stored");
        let mut r = app.redis().await;
        let token = chirp::accounts::hash_token(&tb);
        for key in [
            app.keys().liked(bob),
            app.keys().hidden(bob),
            app.keys().token(&token),
        ] {
            let stored: bool = redis::cmd("EXISTS")
                .arg(&key)
                .query_async(&mut r)
                .await
                .expect("exists");
            assert!(stored, "{uri}: {key} stored");
        }
        assert_eq!(
            app.get(&uri, Some(&tb)).await.body,
            cold.body,
            "{uri}: warm"
        );
        (
            cold.body["results"].as_array().cloned().unwrap_or_default(),
            trips,
            queries,
        )
    };
    // (Up to the list limit: a larger page is answered from Postgres beyond the first window.)
    for size in [1, 5, 20, 38] {
        let (results, trips, queries) = first_touch(size).await;
        assert_eq!(results.len(), size, "page_size={size}: a full page");
        // Dave's tweets came last (by the follow's backfill), four of the twelve liked.
        let liked_shown = results.iter().any(|e| e["tweet"]["has_liked"] == true);
        assert!(
            liked_shown || size < 12,
            "page_size={size}: bob's likes shown"
        );
        assert_eq!(
            trips, 4,
            "page_size={size}: Redis round trips of a first touch"
        );
        assert_eq!(
            queries, 2,
            "page_size={size}: Postgres statements of a first touch (the token, the page)"
        );
    }
    let uri = format!("/api/users/{carol}/mute/");
    off.post_expecting(StatusCode::OK, &uri, Some(&tb), json!({}))
        .await;
    // (More round trips now: the page is read again where hidden tweets left it short.)
    let (results, _, _) = first_touch(38).await;
    assert_eq!(results.len(), 38, "a full page without carol's tweets");
    assert!(
        results.iter().all(|e| e["tweet"]["user"]["id"] != carol),
        "carol is muted"
    );
}

/// A returning reader's first page of a user's tweets, of a tweet's context and of a list, each
/// in a fresh process with nothing in Redis, filters with the hidden set read with the token
/// (`MaybeAuth::hidden`, decision 0030) and asks no cache for it. Beside an anonymous reader's
/// first touch of the same page it makes the token's one Redis round trip (its miss; storing it
/// with the set goes with the page's first read: decision 0037) and, where the page shows
/// `has_liked`, the liked set's three (the miss, the start of its load, its fill); the set's own
/// `GET` made one more before, the token's store one more until decision 0037. The list
/// leaves out the muted carol's tweets, and a user who blocks the reader is 404 on a first
/// touch too.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_first_touch_of_any_timeline_filters_with_the_set_read_with_the_token(db: PgPool) {
    let off = TestApp::with(db.clone(), |c| c.cache = CacheMode::Off).await;
    let World {
        bob,
        tb,
        alice,
        carol,
        ..
    } = world(&off).await;
    let list = off.new_list(&tb, "friends").await;
    off.add_to_list(&tb, list, alice).await;
    off.add_to_list(&tb, list, carol).await;
    let (erin, te) = off.signup("erin").await;
    off.tweet(&te, "erin").await;
    let uri = format!("/api/users/{bob}/block/");
    off.post_expecting(StatusCode::OK, &uri, Some(&te), json!({}))
        .await;
    let uri = format!("/api/users/{carol}/mute/");
    off.post_expecting(StatusCode::OK, &uri, Some(&tb), json!({}))
        .await;
    off.drain().await;
    let alices = off
        .get(&format!("/api/tweets/?user_id={alice}&page_size=1"), None)
        .await;
    let tweet = alices.body["results"][0]["id"].as_i64().expect("a tweet");
    // (status, body, Redis round trips) of `uri` as `token` in a process of its own, nothing in
    // its memory nor in Redis.
    let first_touch = async |uri: &str, token: Option<&str>| {
        let app = TestApp::with(db.clone(), |c| c.cache_list_limit = LIST_LIMIT).await;
        let before = app.redis_round_trips();
        let res = app.get(uri, token).await;
        (res.status, res.body, app.redis_round_trips() - before)
    };
    let pages = [
        (format!("/api/tweets/?user_id={alice}&page_size=30"), 1 + 3),
        (format!("/api/tweets/{tweet}/context/"), 1),
        (format!("/api/lists/{list}/timeline/?page_size=30"), 0),
    ];
    for (uri, more) in pages {
        let (status, body, trips) = first_touch(&uri, Some(&tb)).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {body}");
        let postgres = off.get(&uri, Some(&tb)).await.body;
        assert_eq!(body, postgres, "{uri}: the Postgres page");
        let shown = body.to_string();
        assert!(
            !shown.contains("\"carol "),
            "{uri}: carol is muted: {shown}"
        );
        if more > 0 {
            let (_, _, anonymous) = first_touch(&uri, None).await;
            assert_eq!(
                trips,
                anonymous + more,
                "{uri}: Redis round trips of a first touch, beside an anonymous one's"
            );
        }
    }
    let uri = format!("/api/tweets/?user_id={erin}");
    let (status, ..) = first_touch(&uri, Some(&tb)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "erin blocks bob");
}

/// 50 readers of one cold newsfeed at once: one Postgres load (the others wait for it and read
/// the list it stored) of one page, every reader gets the same page, and readers who scroll
/// below it grow the list to its window once.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn fifty_concurrent_cold_readers_of_one_list_cause_one_load(db: PgPool) {
    let app = TestApp::with(db, |c| c.cache_list_limit = LIST_LIMIT).await;
    let World { bob, tb, .. } = world(&app).await;
    app.flush_cache().await;
    let (loads, extensions) = (app.stat("loads"), app.stat("extensions"));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let app_ = app.app.clone();
        let token = tb.clone();
        tasks.push(tokio::spawn(async move {
            use tower::ServiceExt;
            let req = axum::http::Request::get("/api/newsfeeds/")
                .header("authorization", format!("Bearer {token}"))
                .body(axum::body::Body::empty())
                .expect("request");
            let res = app_.oneshot(req).await.expect("response");
            assert_eq!(res.status(), StatusCode::OK);
            http_body_util::BodyExt::collect(res.into_body())
                .await
                .expect("body")
                .to_bytes()
        }));
    }
    let mut bodies = Vec::new();
    for t in tasks {
        bodies.push(t.await.expect("reader"));
    }
    assert!(bodies.windows(2).all(|w| w[0] == w[1]), "one page for all");
    assert_eq!(app.stat("loads") - loads, 1, "one load for 50 cold readers");
    assert_eq!(
        cached_len(&app, bob).await,
        Some(22),
        "a first window of one page (20), the entry that tells whether a next page exists, and one more"
    );
    // A reader scrolls below the first window: the list grows, once.
    let page: Value = serde_json::from_slice(&bodies[0]).expect("json");
    let last = page["results"][19]["created_at"].as_str().expect("20th");
    let below = format!("/api/newsfeeds/?created_at__lt={}", urlencode(last));
    for _ in 0..3 {
        assert_eq!(app.get(&below, Some(&tb)).await.status, StatusCode::OK);
    }
    eventually("the list grew to its window", async || {
        app.cached_members(Timeline::Newsfeed(bob))
            .await
            .is_some_and(|m| m.len() == LIST_LIMIT as usize)
    })
    .await;
    assert_eq!(app.stat("extensions") - extensions, 1, "grown once");
    assert_eq!(app.stat("loads") - loads, 1);
}

/// A growth loads the entries below the list's lowest one, then stores them unless the list
/// was written since it began. Here an unfollow lands in between (its unmerge removes carol's
/// entries from the rows and the list): the growth is refused, and no page ever shows carol's
/// tweets again. Growths are off (`CHIRP_CACHE_EXTENSIONS=0`) so the test drives the only one.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_growth_that_races_an_unfollow_brings_nothing_back(db: PgPool) {
    let app = TestApp::with(db, |c| {
        c.cache_list_limit = LIST_LIMIT;
        c.cache_extensions = 0;
    })
    .await;
    let World { bob, tb, carol, .. } = world(&app).await;
    app.flush_cache().await;
    let first = app.get("/api/newsfeeds/?page_size=5", Some(&tb)).await;
    assert_eq!(first.status, StatusCode::OK);
    let list = Timeline::Newsfeed(bob);
    assert_eq!(
        app.cached_members(list).await.map(|m| m.len()),
        Some(7),
        "a page-sized first window"
    );
    let cache = &app.state.cache;
    let (generation, floor, len) = cache
        .begin_extend(list.key())
        .await
        .expect("redis")
        .expect("an incomplete list");
    let below = chirp::time::from_micros(floor.micros().expect("a timeline entry"));
    let loaded = chirp::newsfeeds::entries(app.db(), bob, Some(below), 100)
        .await
        .expect("entries");
    assert!(loaded.len() > 30 && len == 7);
    // The unfollow commits and its unmerge removes carol's entries, after the growth's load.
    let res = app
        .post(
            &format!("/api/friendships/{carol}/unfollow/"),
            Some(&tb),
            serde_json::json!({}),
        )
        .await;
    assert!(res.status.is_success(), "{}", res.body);
    app.drain().await;
    let scored: Vec<_> = loaded.iter().map(|e| list.scored(e)).collect();
    let stored = cache
        .extend(list.key(), &generation, &floor, false, &scored)
        .await
        .expect("redis");
    assert!(!stored, "a growth planned before a removal is refused");
    let carols: HashSet<i64> = sqlx::query_scalar("select id from tweets where user_id = $1")
        .bind(carol)
        .fetch_all(app.db())
        .await
        .expect("carol's tweets")
        .into_iter()
        .collect();
    for size in [5, 20, 100] {
        let feed = page_all(&app, "/api/newsfeeds/", Some(&tb), size).await;
        assert!(
            feed.iter().all(|id| !carols.contains(id)),
            "page size {size}: an unfollowed author's tweet came back"
        );
        assert_eq!(feed.len(), 42, "alice's 30 and dave's 12");
    }
}

/// Random histories: while a reader walks down its newsfeed from a cold first page (a fill, then
/// growths), a followee posts (fan-out merges into the list being filled or grown) or the reader
/// unfollows or follows again (removals and backfills). After each round, every cached list is what Postgres holds
/// (`chirp check`) and the whole newsfeed paged from the cache is the newsfeed paged from
/// Postgres.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn fills_and_growths_that_race_fan_out_lose_nothing(db: PgPool) {
    let (_, mut rng) = seeded_rng("CHIRP_COLD_SEED", "cold races");
    let app = TestApp::with(db.clone(), |c| c.cache_list_limit = LIST_LIMIT).await;
    let off = TestApp::with(db, |c| c.cache = CacheMode::Off).await;
    let World { tb, ta, carol, .. } = world(&app).await;
    let mut following_carol = true;
    for round in 0..12 {
        app.flush_cache().await;
        // A walk down the whole newsfeed: a cold first page, then pages below its window,
        // which grow the list while the writes land.
        let size = rng.random_range(1..=30);
        let read = page_all(&app, "/api/newsfeeds/", Some(&tb), size);
        let write = async {
            match rng.random_range(0..3) {
                0 => {
                    app.tweet(&ta, &format!("race {round}")).await;
                }
                1 if following_carol => {
                    let r = app
                        .post(
                            &format!("/api/friendships/{carol}/unfollow/"),
                            Some(&tb),
                            serde_json::json!({}),
                        )
                        .await;
                    assert!(r.status.is_success());
                    following_carol = false;
                }
                _ => {
                    app.follow(&tb, carol).await;
                    following_carol = true;
                }
            }
            app.drain().await;
        };
        let (walked, ()) = tokio::join!(read, write);
        assert!(!walked.is_empty());
        app.drain().await;
        // Let the growth (if any) land, then compare.
        tokio::time::sleep(std::time::Duration::from_millis(rng.random_range(0..30))).await;
        let report = chirp::check::run(app.db(), &app.state.cache)
            .await
            .expect("check");
        assert!(
            report.differences.is_empty(),
            "round {round}: {:?}",
            report.differences
        );
        let size = rng.random_range(1..=50);
        let cached = page_all(&app, "/api/newsfeeds/", Some(&tb), size).await;
        let postgres = page_all(&off, "/api/newsfeeds/", Some(&tb), size).await;
        assert_eq!(cached, postgres, "round {round}, page size {size}");
    }
}

/// A refresh (`created_at__gt` alone) may return up to 1,000 entries but usually finds a few:
/// cold, it loads a default page's window like a first page (not the whole window), answers
/// from it when its cursor lies inside, and from Postgres when the cursor lies below it.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_cold_refresh_loads_a_page_sized_window(db: PgPool) {
    let app = TestApp::with(db.clone(), |c| c.cache_list_limit = LIST_LIMIT).await;
    let off = TestApp::with(db, |c| c.cache = CacheMode::Off).await;
    let World { bob, tb, .. } = world(&app).await;
    let all = times(&off, "/api/newsfeeds/", Some(&tb)).await;
    for (at, expected) in [(4, 4), (30, 30)] {
        app.flush_cache().await;
        let uri = format!("/api/newsfeeds/?created_at__gt={}", urlencode(&all[at]));
        let cold = app.get(&uri, Some(&tb)).await;
        assert_eq!(cold.body, off.get(&uri, Some(&tb)).await.body, "{uri}");
        assert_eq!(
            cold.body["results"].as_array().map(Vec::len),
            Some(expected)
        );
        if at < 20 {
            assert_eq!(
                cached_len(&app, bob).await,
                Some(22),
                "a default page's window, not {LIST_LIMIT} entries"
            );
        } // (Below the window, the refresh read Postgres and the list grows.)
    }
}
