//! Streaming: `statuses/filter`, `statuses/sample` and `streaming/user` over SSE and NDJSON,
//! through real Redis pub/sub.

use std::time::Duration;

use futures_util::StreamExt;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sqlx::PgPool;
use tower::ServiceExt;

use crate::helpers::{Ev, Proxy, Stream, TestApp, eventually};

/// Percent-encodes everything but ASCII letters and digits.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn tweet_ids(events: &[Ev]) -> Vec<i64> {
    events
        .iter()
        .filter(|e| e.kind == "tweet")
        .map(|e| e.data["tweet"]["id"].as_i64().expect("id"))
        .collect()
}

async fn post(app: &TestApp, token: &str, body: Value) -> i64 {
    let res = app.post("/api/tweets/", Some(token), body).await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    res.body["id"].as_i64().expect("id")
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_filter_stream_matches_phrases_authors_and_boxes_with_their_edges(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice_id, alice) = app.signup("alice").await;
    let (bob_id, bob) = app.signup("bob").await;
    let (_, carol) = app.signup("carol").await;
    let uri = format!(
        "/api/streaming/statuses/filter/?track={}&follow={bob_id}&locations=-10,-10,10,10",
        urlencode("hello world,#rust")
    );
    let mut s = Stream::open(&app, &uri, &carol, None).await;
    let mut expected = Vec::new();
    expected.push(post(&app, &alice, json!({"content": "World, HELLO there"})).await);
    post(
        &app,
        &alice,
        json!({"content": "hello worlds (not a whole word)"}),
    )
    .await;
    post(&app, &alice, json!({"content": "hello"})).await;
    expected.push(post(&app, &alice, json!({"content": "learning #Rust today"})).await);
    post(
        &app,
        &alice,
        json!({"content": "learning rust without the tag"}),
    )
    .await;
    let bobs = post(&app, &bob, json!({"content": "anything at all"})).await;
    expected.push(bobs);
    // A reply to the followed account's tweet matches `follow` too (Twitter's rule).
    expected.push(
        post(
            &app,
            &alice,
            json!({"content": "an answer", "in_reply_to_tweet_id": bobs}),
        )
        .await,
    );
    // On the box's corner: inside (edges included).
    expected.push(
        post(
            &app,
            &alice,
            json!({"content": "at the corner", "lon": 10, "lat": -10}),
        )
        .await,
    );
    post(
        &app,
        &alice,
        json!({"content": "just outside", "lon": 10.0001, "lat": 0}),
    )
    .await;
    // A place whose bbox only touches the box's edge overlaps it; one beside it does not.
    let place = |bbox: [f64; 4]| chirp::model::Place {
        full_name: "Somewhere".into(),
        bbox,
    };
    // `create` tells its caller of each commit, to wake the fan-out runners.
    let mut commits = 0;
    for (bbox, matches) in [
        ([10.0, 10.0, 20.0, 20.0], true),
        ([10.5, -5.0, 20.0, 5.0], false),
    ] {
        let new = chirp::tweets::NewTweet {
            content: "from a place".into(),
            place: Some(place(bbox)),
            ..Default::default()
        };
        let committed = || commits += 1;
        let (t, _) = chirp::tweets::create(
            app.db(),
            &app.state.cache,
            &app.state.pull,
            alice_id,
            &new,
            committed,
        )
        .await
        .expect("create");
        if matches {
            expected.push(t.id);
        }
    }
    assert_eq!(commits, 2);
    let last = post(&app, &bob, json!({"content": "the end"})).await;
    expected.push(last);
    let got = s.tweets_until(last).await;
    assert_eq!(tweet_ids(&got), expected);
    // The tweet objects carry their location.
    assert_eq!(got[4].data["tweet"]["coordinates"], json!([10.0, -10.0]));
    assert_eq!(
        got[5].data["tweet"]["place"]["bbox"],
        json!([10.0, 10.0, 20.0, 20.0])
    );
    assert!(got.iter().all(|e| e.id.is_some()));
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_sample_keeps_the_callers_residues_and_everything_at_100_percent(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice_id, alice) = app.signup("alice").await;
    let mut all = Stream::open(
        &app,
        "/api/streaming/statuses/sample/?percent=100",
        &alice,
        None,
    )
    .await;
    let mut tenth = Stream::open(
        &app,
        "/api/streaming/statuses/sample/?percent=10",
        &alice,
        None,
    )
    .await;
    // 120 consecutive tweet ids cover every residue mod 100.
    let mut ids = Vec::new();
    for i in 0..120 {
        ids.push(post(&app, &alice, json!({"content": format!("tweet {i}")})).await);
    }
    let last = *ids.last().expect("ids");
    assert_eq!(tweet_ids(&all.tweets_until(last).await), ids);
    // The documented sample: residues offset..offset+10 (mod 100), offset = id × 37 mod 100.
    let offset = (alice_id * 37).rem_euclid(100);
    let expected: Vec<i64> = ids
        .iter()
        .copied()
        .filter(|id| (id.rem_euclid(100) - offset).rem_euclid(100) < 10)
        .collect();
    assert!(expected.len() >= 10, "{expected:?}");
    let last_kept = *expected.last().expect("kept");
    assert_eq!(tweet_ids(&tenth.tweets_until(last_kept).await), expected);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn bad_stream_parameters_are_a_400_before_the_stream_starts(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, alice) = app.signup("alice").await;
    let too_many = vec!["w"; 401].join(",");
    for uri in [
        "/api/streaming/statuses/filter/".to_owned(),
        format!("/api/streaming/statuses/filter/?track={too_many}"),
        "/api/streaming/statuses/filter/?track=%2C%2C!!".to_owned(),
        "/api/streaming/statuses/filter/?follow=1,x".to_owned(),
        "/api/streaming/statuses/filter/?locations=1,2,3".to_owned(),
        "/api/streaming/statuses/filter/?locations=10,0,-10,5".to_owned(),
        "/api/streaming/statuses/filter/?locations=0,0,181,5".to_owned(),
        "/api/streaming/statuses/filter/?track=a&format=xml".to_owned(),
        "/api/streaming/statuses/sample/?percent=0".to_owned(),
        "/api/streaming/user/?since=yesterday".to_owned(),
    ] {
        let res = app.get(&uri, Some(&alice)).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{uri}: {}", res.body);
        assert_eq!(res.body["success"], false, "{uri}");
    }
    for token in ["12.x.0", "12.1", "0.1.0"] {
        // Malformed, or from 1970 (more than 30 days back).
        let res = Stream::try_open(&app, "/api/streaming/user/", &alice, Some(token)).await;
        assert_eq!(
            res.err().map(|e| e.0),
            Some(StatusCode::BAD_REQUEST),
            "{token}"
        );
    }
    let res = app.get("/api/streaming/user/", None).await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED);
    // POST takes the same parameters from a form.
    let req = Request::post("/api/streaming/statuses/filter/")
        .header("authorization", format!("Bearer {alice}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from("locations=1,2"))
        .expect("request");
    assert_eq!(app.send(req).await.status, StatusCode::BAD_REQUEST);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn deletes_reach_the_filter_streams_that_matched_and_the_readers_user_streams(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice_id, alice) = app.signup("alice").await;
    let (_, bob) = app.signup("bob").await;
    app.follow(&bob, alice_id).await;
    let mut filter = Stream::open(
        &app,
        "/api/streaming/statuses/filter/?track=doomed",
        &bob,
        None,
    )
    .await;
    let mut feed = Stream::open(&app, "/api/streaming/user/", &bob, None).await;
    let doomed = post(&app, &alice, json!({"content": "a doomed tweet"})).await;
    let other = post(&app, &alice, json!({"content": "another one"})).await;
    app.drain().await;
    assert_eq!(
        tweet_ids(&feed.tweets_until(other).await),
        vec![doomed, other]
    );
    assert_eq!(tweet_ids(&filter.tweets_until(doomed).await), vec![doomed]);
    for id in [other, doomed] {
        let res = app
            .delete(&format!("/api/tweets/{id}/"), Some(&alice))
            .await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    }
    // The filter only hears of the tweet that matched it.
    let ev = filter.next(Duration::from_secs(5)).await.expect("delete");
    assert_eq!(ev.kind, "delete");
    assert_eq!(
        ev.data,
        json!({"event": "delete", "tweet_id": doomed, "user_id": alice_id})
    );
    assert!(filter.next(Duration::from_millis(300)).await.is_none());
    let mut deleted = Vec::new();
    for _ in 0..2 {
        let ev = feed.next(Duration::from_secs(5)).await.expect("delete");
        assert_eq!(ev.kind, "delete");
        assert!(ev.id.is_none());
        deleted.push(ev.data["tweet_id"].as_i64().expect("id"));
    }
    assert_eq!(deleted, vec![other, doomed]);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_tweet_posted_on_one_server_reaches_a_stream_on_another(db: PgPool) {
    let one = TestApp::new(db.clone()).await;
    let prefix = one.prefix.clone();
    let two = TestApp::with(db, |c| c.redis_prefix = prefix).await;
    let (alice_id, alice) = one.signup("alice").await;
    let (_, bob) = one.signup("bob").await;
    one.follow(&bob, alice_id).await;
    let mut filter = Stream::open(
        &two,
        &format!("/api/streaming/statuses/filter/?follow={alice_id}"),
        &bob,
        None,
    )
    .await;
    let mut feed = Stream::open(&two, "/api/streaming/user/", &bob, None).await;
    // One subscription per process, not one per stream: two streams in `two`, and each process
    // listens once (both authenticated a request, which subscribes for token revocations).
    eventually("both processes subscribed", async || {
        one.state.subscriber.subscribed() && two.state.subscriber.subscribed()
    })
    .await;
    let mut redis = one.redis().await;
    let (_, listeners): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(one.state.cache.topic("streams").expect("cache on"))
        .query_async(&mut redis)
        .await
        .expect("numsub");
    assert_eq!(listeners, 2);
    let id = post(&one, &alice, json!({"content": "across processes"})).await;
    // Process one runs the fan-out; process two streams it.
    one.drain().await;
    assert_eq!(tweet_ids(&filter.tweets_until(id).await), vec![id]);
    let got = feed.tweets_until(id).await;
    assert_eq!(got[0].data["tweet"]["content"], "across processes");
    assert!(
        got[0].id.is_some(),
        "a user stream event carries its resume token"
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_user_stream_resumes_in_arrival_order_with_nothing_lost_or_twice(db: PgPool) {
    let app = TestApp::new(db).await;
    let (x_id, x) = app.signup("xavier").await;
    let (y_id, y) = app.signup("yvonne").await;
    let (_, c) = app.signup("carol").await;
    app.follow(&c, x_id).await;
    app.follow(&c, y_id).await;
    app.drain().await;
    let mut s = Stream::open(&app, "/api/streaming/user/?format=sse", &c, None).await;
    let own = post(&app, &c, json!({"content": "my own"})).await;
    let first = post(&app, &x, json!({"content": "first"})).await;
    app.drain().await;
    let got = s.tweets_until(first).await;
    assert_eq!(tweet_ids(&got), vec![own, first]);
    // A fan-out that lands late: X tweets before Y, but Y's fan-out runs first.
    let late = post(&app, &x, json!({"content": "older, lands late"})).await;
    let early = post(&app, &y, json!({"content": "newer, lands first"})).await;
    let jobs: Vec<(i64, i64)> =
        sqlx::query_as("select id, tweet_id from jobs where kind = 'fanout' order by id")
            .fetch_all(app.db())
            .await
            .expect("jobs");
    let job_of = |tweet: i64| jobs.iter().find(|(_, t)| *t == tweet).expect("job").0;
    chirp::newsfeeds::fanout(&app.state.worker, job_of(early), early, None, None)
        .await
        .expect("fanout");
    let got = s.tweets_until(early).await;
    assert_eq!(tweet_ids(&got), vec![early]);
    let token = got[0].id.clone().expect("token");
    drop(s);
    // While away: the late fan-out lands (older tweet, newer arrival), and a new tweet.
    chirp::newsfeeds::fanout(&app.state.worker, job_of(late), late, None, None)
        .await
        .expect("fanout");
    let away = post(&app, &y, json!({"content": "posted while away"})).await;
    app.drain().await; // also runs the jobs again: a second fan-out changes nothing
    let mut s = Stream::open(&app, "/api/streaming/user/", &c, Some(&token)).await;
    let live = post(&app, &x, json!({"content": "live again"})).await;
    app.drain().await;
    let got = s.tweets_until(live).await;
    assert_eq!(tweet_ids(&got), vec![late, away, live]);
    assert!(
        s.next(Duration::from_millis(300)).await.is_none(),
        "nothing twice"
    );
    // `since` replays by arrival too: everything that arrived after `late`'s tweet time.
    let since = got[0].data["tweet"]["created_at"]
        .as_str()
        .expect("time")
        .to_owned();
    let mut s = Stream::open(
        &app,
        &format!("/api/streaming/user/?since={}", urlencode(&since)),
        &c,
        None,
    )
    .await;
    let replayed = s.tweets_until(live).await;
    assert_eq!(tweet_ids(&replayed), vec![early, late, away, live]);
}

/// A `streaming/user` connection's first frame carries its place as an `id:` (no event), so a
/// client whose connection ends before any tweet resumes from where it opened: what came while
/// it was away arrives, once. Before, it had no id to send and a new stream began at its own
/// start, skipping those tweets (the history checker's seed 11: "stream none missed").
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_user_stream_that_ends_before_any_tweet_resumes_from_where_it_opened(db: PgPool) {
    let app = TestApp::new(db).await;
    let (x_id, x) = app.signup("xavier").await;
    let (_, c) = app.signup("carol").await;
    app.follow(&c, x_id).await;
    let before = post(&app, &x, json!({"content": "before the stream"})).await;
    app.drain().await;
    let s = Stream::open(&app, "/api/streaming/user/", &c, None).await;
    let place = s.last_id.clone().expect("the first frame's id");
    drop(s);
    let away = post(&app, &x, json!({"content": "posted while away"})).await;
    app.drain().await;
    let own = post(&app, &c, json!({"content": "my own, while away"})).await;
    let mut s = Stream::open(&app, "/api/streaming/user/", &c, Some(&place)).await;
    let got = s.tweets_until(own).await;
    assert_eq!(tweet_ids(&got), vec![away, own]);
    assert!(!tweet_ids(&got).contains(&before));
    assert!(
        s.next(Duration::from_millis(300)).await.is_none(),
        "nothing twice"
    );
    // An empty newsfeed has a place too (a token made now, which a resume accepts).
    let (_, d) = app.signup("dana").await;
    let s = Stream::open(&app, "/api/streaming/user/", &d, None).await;
    let place = s.last_id.clone().expect("the first frame's id");
    drop(s);
    let first = post(&app, &d, json!({"content": "my first"})).await;
    let mut s = Stream::open(&app, "/api/streaming/user/", &d, Some(&place)).await;
    assert_eq!(tweet_ids(&s.tweets_until(first).await), vec![first]);
    // NDJSON's first line stays empty; statuses streams carry no place.
    let filter = Stream::open(&app, "/api/streaming/statuses/sample/", &c, None).await;
    assert_eq!(filter.last_id, None);
}

/// `since` is strictly after: a client that opens its stream from the newest newsfeed entry it
/// holds does not get that entry again (its fan-out row arrived after its own time), only what
/// came after it.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_user_stream_since_the_newest_entry_held_does_not_replay_it(db: PgPool) {
    let app = TestApp::new(db).await;
    let (x_id, x) = app.signup("xavier").await;
    let (_, c) = app.signup("carol").await;
    app.follow(&c, x_id).await;
    app.drain().await;
    let held = post(&app, &x, json!({"content": "held"})).await;
    app.drain().await;
    let page = app.get("/api/newsfeeds/", Some(&c)).await.body;
    assert_eq!(page["results"][0]["tweet"]["id"], held);
    let since = page["results"][0]["created_at"]
        .as_str()
        .expect("time")
        .to_owned();
    let mut s = Stream::open(
        &app,
        &format!("/api/streaming/user/?since={}", urlencode(&since)),
        &c,
        None,
    )
    .await;
    let next = post(&app, &x, json!({"content": "next"})).await;
    app.drain().await;
    assert_eq!(tweet_ids(&s.tweets_until(next).await), vec![next]);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn tweets_that_land_during_a_catch_up_are_sent_once_in_order(db: PgPool) {
    let app = TestApp::new(db).await;
    let (me, c) = app.signup("carol").await;
    let mut s = Stream::open(&app, "/api/streaming/user/?format=ndjson", &c, None).await;
    let first = post(&app, &c, json!({"content": "first"})).await;
    // NDJSON: one object per line, with the resume token as "id".
    while !s.buf.contains('\n') {
        assert!(s.fill(Duration::from_secs(5)).await, "{}", s.buf);
    }
    let v: Value = serde_json::from_str(s.buf.trim()).expect("an NDJSON line");
    assert_eq!(v["event"], "tweet");
    assert_eq!(v["tweet"]["id"], first);
    let token = v["id"].as_str().expect("a token").to_owned();
    drop(s);
    // Resume from `first` by SSE while a burst is posted concurrently with the catch-up.
    let mut missed = Vec::new();
    for i in 0..150 {
        missed.push(post(&app, &c, json!({"content": format!("missed {i}")})).await);
    }
    let mut s = Stream::open(&app, "/api/streaming/user/", &c, Some(&token)).await;
    let poster = {
        let app_state = app.state.clone();
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..40 {
                let new = chirp::tweets::NewTweet {
                    content: format!("during catch-up {i}"),
                    ..Default::default()
                };
                let (t, _) = chirp::tweets::create(
                    &app_state.db,
                    &app_state.cache,
                    &app_state.pull,
                    me,
                    &new,
                    || (),
                )
                .await
                .expect("create");
                ids.push(t.id);
            }
            ids
        })
    };
    let during = poster.await.expect("poster");
    let last = *during.last().expect("ids");
    let got = tweet_ids(&s.tweets_until(last).await);
    let mut expected = missed;
    expected.extend(during);
    assert_eq!(got, expected);
    assert!(
        s.next(Duration::from_millis(300)).await.is_none(),
        "nothing twice"
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_slow_reader_is_cut_off_while_others_keep_receiving(db: PgPool) {
    let app = TestApp::with(db, |c| c.stream_buffer = 5).await;
    let (_, alice) = app.signup("alice").await;
    let mut slow = Stream::open(&app, "/api/streaming/user/", &alice, None).await;
    let mut fast = Stream::open(&app, "/api/streaming/user/", &alice, None).await;
    let mut ids = Vec::new();
    for i in 0..40 {
        ids.push(post(&app, &alice, json!({"content": format!("tweet {i}")})).await);
        // The fast reader keeps up.
        let ev = fast.next(Duration::from_secs(5)).await.expect("event");
        assert_eq!(ev.data["tweet"]["id"], *ids.last().expect("id"));
    }
    // The slow one, which read nothing since `:ok`, finds what its body held (at most 16
    // chunks), then the warning, then the end.
    let mut got = Vec::new();
    let warning = loop {
        let ev = slow.next(Duration::from_secs(5)).await.expect("an event");
        if ev.kind != "tweet" {
            break ev;
        }
        got.push(ev);
    };
    assert_eq!(warning.kind, "warning");
    assert_eq!(warning.data["code"], "FALLING_BEHIND");
    assert!(slow.ends_within(Duration::from_secs(5)).await);
    let got = tweet_ids(&got);
    assert!(got.len() <= 16, "{got:?}");
    assert_eq!(got, ids[..got.len()].to_vec(), "a prefix, in order");
    assert!(
        app.state
            .streams
            .stats
            .fell_behind
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
    assert_eq!(
        app.state.streams.counts().0,
        1,
        "the slow client left the hub"
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_user_gets_a_429_beyond_the_stream_limit_and_a_slot_back_when_one_ends(db: PgPool) {
    let app = TestApp::with(db, |c| c.streams_per_user = 2).await;
    let (_, alice) = app.signup("alice").await;
    let (_, bob) = app.signup("bob").await;
    let first = Stream::open(&app, "/api/streaming/user/", &alice, None).await;
    let _second = Stream::open(&app, "/api/streaming/statuses/sample/", &alice, None).await;
    let third = Stream::try_open(&app, "/api/streaming/user/", &alice, None).await;
    let (status, body) = third.err().expect("a 429");
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        body["detail"].as_str().is_some_and(|d| d.contains('2')),
        "{body}"
    );
    // Others are not limited by alice's streams.
    let _bob = Stream::open(&app, "/api/streaming/user/", &bob, None).await;
    // A lease lasts three heartbeats (45 s): only the release at the end frees the slot.
    drop(first);
    eventually("the ended stream's slot is free", async || {
        Stream::try_open(&app, "/api/streaming/user/", &alice, None)
            .await
            .is_ok()
    })
    .await;
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn streams_end_with_an_event_when_redis_goes_away_and_resume_from_postgres(db: PgPool) {
    let proxy = Proxy::start().await;
    let url = proxy.url();
    let app = TestApp::with(db, |c| c.redis_url = url).await;
    let (_, alice) = app.signup("alice").await;
    let mut s = Stream::open(&app, "/api/streaming/user/", &alice, None).await;
    let seen = post(&app, &alice, json!({"content": "before the outage"})).await;
    let token = s.tweets_until(seen).await[0].id.clone().expect("token");
    proxy.set_up(false);
    let ev = s.next(Duration::from_secs(5)).await.expect("disconnect");
    assert_eq!(ev.kind, "disconnect");
    assert_eq!(ev.data["code"], "UNAVAILABLE");
    assert!(s.ends_within(Duration::from_secs(5)).await);
    // Writes go on in Postgres; new streams are refused until Redis is back.
    let missed = [
        post(&app, &alice, json!({"content": "during the outage 1"})).await,
        post(&app, &alice, json!({"content": "during the outage 2"})).await,
    ];
    let refused = Stream::try_open(&app, "/api/streaming/user/", &alice, None).await;
    assert_eq!(
        refused.err().map(|e| e.0),
        Some(StatusCode::SERVICE_UNAVAILABLE)
    );
    proxy.set_up(true);
    eventually("redis is back", async || app.recover().await).await;
    let mut s = Stream::open(&app, "/api/streaming/user/", &alice, Some(&token)).await;
    let after = post(&app, &alice, json!({"content": "after the outage"})).await;
    let got = s.tweets_until(after).await;
    assert_eq!(tweet_ids(&got), vec![missed[0], missed[1], after]);
}

/// A `streaming/user` stream leaves out retweets of the tweets of an account its user mutes,
/// live and when it resumes (API.md, "Blocks and mutes"), and carries a retweet's tweet.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_stream_leaves_out_retweets_of_a_muted_account(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, alice) = app.signup("alice").await;
    let (bob_id, bob) = app.signup("bob").await;
    let (carol_id, carol) = app.signup("carol").await;
    app.follow(&alice, bob_id).await;
    let muted = app
        .post(
            &format!("/api/users/{carol_id}/mute/"),
            Some(&alice),
            json!({}),
        )
        .await;
    assert_eq!(muted.status, StatusCode::OK, "{}", muted.body);
    let carols = post(&app, &carol, json!({"content": "muted"})).await;
    let bobs = post(&app, &bob, json!({"content": "not muted"})).await;
    app.drain().await;
    let mut s = Stream::open(&app, "/api/streaming/user/", &alice, None).await;
    let retweet = |id: i64| {
        let app = &app;
        let bob = &bob;
        async move {
            let res = app
                .post(&format!("/api/tweets/{id}/retweet/"), Some(bob), json!({}))
                .await;
            assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
            res.body["id"].as_i64().expect("id")
        }
    };
    let of_carols = retweet(carols).await;
    let of_bobs = retweet(bobs).await;
    let last = post(&app, &bob, json!({"content": "the last"})).await;
    app.drain().await;
    let got = s.tweets_until(last).await;
    let token = got.last().and_then(|e| e.id.clone());
    assert_eq!(
        tweet_ids(&got),
        vec![last],
        "bob's own tweet was in the feed already"
    );
    // bob's retweet of his own tweet adds nothing (alice's newsfeed has the tweet), and the
    // retweet of carol's is left out; a retweet of another's shows with its tweet.
    let (dan_id, dan) = app.signup("dan").await;
    let dans = post(&app, &dan, json!({"content": "dan's"})).await;
    let of_dans = retweet(dans).await;
    let after = post(&app, &bob, json!({"content": "after"})).await;
    app.drain().await;
    let got = s.tweets_until(after).await;
    assert_eq!(tweet_ids(&got), vec![of_dans, after], "dan {dan_id}");
    assert_eq!(got[0].data["tweet"]["retweeted_tweet"]["id"], dans);
    // Resumed from before the retweets: the same, from Postgres.
    drop(s);
    let mut resumed = Stream::open(&app, "/api/streaming/user/", &alice, token.as_deref()).await;
    let got = resumed.tweets_until(after).await;
    assert_eq!(
        tweet_ids(&got),
        vec![of_dans, after],
        "{of_carols} {of_bobs}"
    );
    assert_eq!(got[0].data["tweet"]["retweeted_tweet"]["id"], dans);
}

/// A stream that ends while Redis is down can not give its lease back then; it does once Redis
/// is back, so its user is not refused (429) until the lease expires (45 s). The history
/// checker found a user locked out after streams ended across faults (seed
/// 15545086552391325399).
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_stream_that_ends_while_redis_is_down_gives_its_slot_back_later(db: PgPool) {
    let proxy = Proxy::start().await;
    let url = proxy.url();
    let app = TestApp::with(db, |c| {
        c.redis_url = url;
        c.streams_per_user = 1;
    })
    .await;
    let (_, alice) = app.signup("alice").await;
    let mut s = Stream::open(&app, "/api/streaming/user/", &alice, None).await;
    proxy.set_up(false);
    let ev = s.next(Duration::from_secs(5)).await.expect("disconnect");
    assert_eq!(ev.kind, "disconnect");
    assert!(s.ends_within(Duration::from_secs(5)).await);
    drop(s);
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set_up(true);
    eventually("redis is back", async || app.recover().await).await;
    eventually("the slot is free again", async || {
        Stream::try_open(&app, "/api/streaming/user/", &alice, None)
            .await
            .is_ok()
    })
    .await;
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn shutdown_ends_streams_with_a_disconnect_event(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, alice) = app.signup("alice").await;
    let mut s = Stream::open(
        &app,
        "/api/streaming/statuses/sample/?percent=100",
        &alice,
        None,
    )
    .await;
    let _ = app.state.shutdown.send(true);
    let ev = s.next(Duration::from_secs(5)).await.expect("disconnect");
    assert_eq!(ev.data["code"], "SHUTDOWN");
    assert!(s.ends_within(Duration::from_secs(5)).await);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn chirp_replay_posts_real_tweets_that_reach_the_streams(db: PgPool) {
    let app = TestApp::new(db).await;
    let dir = std::env::temp_dir().join(crate::helpers::unique_prefix());
    std::fs::create_dir_all(&dir).expect("dir");
    let follows = dir.join("graph.txt");
    std::fs::write(&follows, "10 20\n11 20\n").expect("graph");
    let line = |id: u64, author: u64, text: &str, place: bool| {
        let mut t = json!({
            "id_str": id.to_string(), "created_at": "Wed Nov 09 06:57:54 +0000 2016",
            "text": text, "user": {"id_str": author.to_string()},
        });
        if place {
            t["place"] = json!({"full_name": "Anchorage, AK", "bounding_box": {"type": "Polygon",
                "coordinates": [[[-150.0, 61.0], [-150.0, 61.4], [-149.5, 61.4], [-149.5, 61.0]]]}});
        }
        t.to_string()
    };
    let seed = dir.join("seed.jsonl");
    std::fs::write(&seed, line(1, 500, "seed", false)).expect("seed");
    let args = chirp::config::ImportArgs {
        follows: Some(follows),
        tweets: vec![seed],
        reset: false,
        tokens_out: None,
        tokens: 0,
        circles: None,
    };
    chirp::import::run(app.db(), &args).await.expect("import");
    let (_, watcher) = app.signup("watcher").await;
    let mut s = Stream::open(
        &app,
        "/api/streaming/statuses/filter/?locations=-151,60,-149,62",
        &watcher,
        None,
    )
    .await;
    let live = dir.join("live.jsonl");
    let lines = [
        line(2, 500, "in Anchorage", true),
        line(3, 501, "no place", false),
        line(4, 501, "Anchorage again", true),
    ];
    std::fs::write(&live, lines.join("\n")).expect("live");
    let replay = chirp::config::ReplayArgs {
        tweets: vec![live],
        rate: 1000.0,
        limit: 0,
    };
    let mut wakes = app.subscribe(chirp::jobs::TOPIC).await;
    let done = chirp::import::replay::run(app.db(), &app.state.cache, &app.state.pull, &replay)
        .await
        .expect("replay");
    assert_eq!((done.posted, done.failed), (3, 0));
    // Each post wakes the workers of other processes (replay runs none of its own).
    let mut messages = wakes.on_message();
    for _ in 0..3 {
        let woke = tokio::time::timeout(Duration::from_secs(5), messages.next()).await;
        assert!(
            matches!(woke, Ok(Some(_))),
            "a replayed post woke no worker"
        );
    }
    drop(messages);
    let mut got = Vec::new();
    while let Some(ev) = s.next(Duration::from_secs(2)).await {
        got.push(ev);
        if got.len() == 2 {
            break;
        }
    }
    let texts: Vec<&str> = got
        .iter()
        .map(|e| e.data["tweet"]["content"].as_str().unwrap_or_default())
        .collect();
    // Posted concurrently: either order.
    assert_eq!(texts.len(), 2, "{got:?}");
    assert!(texts.contains(&"in Anchorage") && texts.contains(&"Anchorage again"));
    assert_eq!(got[0].data["tweet"]["place"]["full_name"], "Anchorage, AK");
    // As imported accounts: the most active author got the most-followed account (20).
    assert!(
        got.iter().any(|e| e.data["tweet"]["user"]["id"] == 20),
        "{got:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn the_demo_page_is_served_and_reads_the_user_stream(db: PgPool) {
    let app = TestApp::new(db).await;
    let res = app
        .app
        .clone()
        .oneshot(Request::get("/demo/").body(Body::empty()).expect("request"))
        .await
        .expect("infallible");
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.headers()["content-type"],
        "text/html; charset=utf-8",
        "{:?}",
        res.headers()
    );
    let bytes = res.into_body().collect().await.expect("body").to_bytes();
    let html = String::from_utf8_lossy(&bytes);
    assert!(html.contains("/api/streaming/user/") && html.contains("Last-Event-ID"));
}

/// A row of `reader`'s newsfeed whose publish never came (a fan-out that committed while its
/// publish failed): inserted after every row the newsfeed holds, as `stamp` would, and no
/// message. Returns the tweet id.
async fn row_without_publish(app: &TestApp, reader: i64, token: &str) -> i64 {
    let tweet = post(app, token, json!({"content": "its publish was lost"})).await;
    sqlx::query(
        "with h as (
             insert into feed_heads (user_id, head) values ($1, clock_timestamp())
             on conflict (user_id) do update
                 set head = greatest(feed_heads.head, excluded.head)
             returning head)
         insert into newsfeeds (user_id, tweet_id, created_at, arrived_at)
         select $1, $2, head, clock_timestamp() from h",
    )
    .bind(reader)
    .bind(tweet)
    .execute(app.db())
    .await
    .expect("a row without its publish");
    tweet
}

/// Issue 37: a live `streaming/user` settles its cursor from Postgres every heartbeat, so a
/// row whose pub/sub message never came is delivered all the same, also on a stream that gets
/// nothing else (before, a live stream never sent it: only a reconnect found it).
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_row_whose_publish_never_came_reaches_the_live_stream_by_the_next_heartbeat(db: PgPool) {
    let app = TestApp::with(db, |c| c.stream_heartbeat_secs = 1).await;
    let (alice_id, alice) = app.signup("alice").await;
    let (_, carol) = app.signup("carol").await;
    let one = post(&app, &alice, json!({"content": "before the stream"})).await;
    let mut s = Stream::open(&app, "/api/streaming/user/", &alice, None).await;
    let lost = row_without_publish(&app, alice_id, &carol).await;
    let got = tweet_ids(&s.tweets_until(lost).await);
    assert_eq!(got, vec![lost], "not {one}, which predates the stream");
    let two = post(&app, &alice, json!({"content": "two"})).await;
    assert_eq!(tweet_ids(&s.tweets_until(two).await), vec![two]);
    assert!(
        s.next(Duration::from_millis(2500)).await.is_none(),
        "nothing twice at the next heartbeats"
    );
}

/// Review of cfc475e: a token's age is that of the newest entry it delivered, not of its base:
/// on a newsfeed whose newest entry is 40 days old, a stream's first event gives a token that
/// resumes (before, a 400 "at most 30 days back", which ends an EventSource for good). A
/// `since` before every entry is still a 400.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_token_from_a_quiet_newsfeed_resumes_and_an_ancient_since_does_not(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice_id, alice) = app.signup("alice").await;
    let old = post(&app, &alice, json!({"content": "long ago"})).await;
    sqlx::query(
        "update newsfeeds set created_at = created_at - interval '40 days'
         where user_id = $1 and tweet_id = $2",
    )
    .bind(alice_id)
    .bind(old)
    .execute(app.db())
    .await
    .expect("an old entry");
    let mut s = Stream::open(&app, "/api/streaming/user/", &alice, None).await;
    let new = post(&app, &alice, json!({"content": "today"})).await;
    let token = s.tweets_until(new).await[0].id.clone().expect("token");
    drop(s);
    let later = post(&app, &alice, json!({"content": "while away"})).await;
    let mut s = Stream::open(&app, "/api/streaming/user/", &alice, Some(&token)).await;
    assert_eq!(tweet_ids(&s.tweets_until(later).await), vec![later]);
    for since in ["1970-01-01T00:00:00Z", "2020-01-01T00:00:00Z"] {
        let res = Stream::try_open(
            &app,
            &format!("/api/streaming/user/?since={since}"),
            &alice,
            None,
        )
        .await;
        assert!(
            matches!(res, Err((StatusCode::BAD_REQUEST, _))),
            "since={since} reaches back too far"
        );
    }
}

/// Issue 37: a resume follows Postgres's order of the newsfeed, not the arrival times that the
/// processes stamped: a row stamped by a process whose clock runs 10 s slow (the arrival time
/// the fan-out wrote before) is found. Before, the resume read rows that arrived after its
/// floor by that clock, and skipped it.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_resume_finds_a_row_whatever_arrival_time_its_process_stamped(db: PgPool) {
    let app = TestApp::new(db).await;
    let (bob_id, bob) = app.signup("bob").await;
    let (alice_id, alice) = app.signup("alice").await;
    app.follow(&alice, bob_id).await;
    app.drain().await;
    let mut s = Stream::open(&app, "/api/streaming/user/", &alice, None).await;
    let first = post(&app, &bob, json!({"content": "first"})).await;
    app.drain().await;
    let token = s.tweets_until(first).await[0].id.clone().expect("token");
    drop(s);
    let away = post(&app, &bob, json!({"content": "while away"})).await;
    app.drain().await;
    sqlx::query(
        "update newsfeeds set arrived_at = arrived_at - interval '10 seconds'
         where user_id = $1 and tweet_id = $2",
    )
    .bind(alice_id)
    .bind(away)
    .execute(app.db())
    .await
    .expect("a slow clock's stamp");
    let mut s = Stream::open(&app, "/api/streaming/user/", &alice, Some(&token)).await;
    let live = post(&app, &bob, json!({"content": "live"})).await;
    app.drain().await;
    assert_eq!(tweet_ids(&s.tweets_until(live).await), vec![away, live]);
}

/// Issue 37: however many rows arrive, a live stream holds at most `RECENT_MAX` delivered ids
/// above its base (a full cursor settles from Postgres, which also sends a row whose publish
/// never came), and a token made after 300 arrivals resumes with nothing lost or twice.
/// Before, a token listed the newest 256 ids and moved its base past the rest: a row below
/// them that had not been delivered was skipped for good.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_busy_stream_stays_bounded_and_its_token_loses_nothing(db: PgPool) {
    // No heartbeat within the test: only a full cursor settles.
    let app = TestApp::with(db, |c| c.stream_heartbeat_secs = 600).await;
    let (alice_id, alice) = app.signup("alice").await;
    let (_, carol) = app.signup("carol").await;
    let mut s = Stream::open(&app, "/api/streaming/user/", &alice, None).await;
    let lost = row_without_publish(&app, alice_id, &carol).await;
    let mut posted = Vec::new();
    for i in 0..300 {
        posted.push(post(&app, &alice, json!({"content": format!("busy {i}")})).await);
    }
    let last = *posted.last().expect("posted");
    let got = s.tweets_until(last).await;
    let mut ids = tweet_ids(&got);
    assert!(
        ids.contains(&lost),
        "the full cursor's settle sent the lost row"
    );
    let token = got.last().and_then(|e| e.id.clone()).expect("token");
    assert!(
        token.split('.').count() <= 2 + 256,
        "a token lists at most 256 ids: {} parts",
        token.split('.').count()
    );
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 301, "each once");
    drop(s);
    let after = post(&app, &alice, json!({"content": "after"})).await;
    let mut s = Stream::open(&app, "/api/streaming/user/", &alice, Some(&token)).await;
    assert_eq!(tweet_ids(&s.tweets_until(after).await), vec![after]);
    assert!(
        s.next(Duration::from_millis(300)).await.is_none(),
        "nothing twice"
    );
}

/// A token made before the cursor followed Postgres's order (`{base}.{floor µs}.{span}.{ids}`,
/// held by a client across an upgrade) still resumes: the rows that arrived after its floor,
/// then live, each once.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_token_of_the_earlier_version_still_resumes(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, alice) = app.signup("alice").await;
    let before = post(&app, &alice, json!({"content": "before the token"})).await;
    let floor: i64 =
        sqlx::query_scalar("select (extract(epoch from clock_timestamp()) * 1000000)::bigint")
            .fetch_one(app.db())
            .await
            .expect("now");
    let missed = post(&app, &alice, json!({"content": "missed"})).await;
    let mut s = Stream::open(
        &app,
        "/api/streaming/user/",
        &alice,
        Some(&format!("0.{floor}.0")),
    )
    .await;
    let live = post(&app, &alice, json!({"content": "live"})).await;
    let got = tweet_ids(&s.tweets_until(live).await);
    assert_eq!(got, vec![missed, live]);
    assert!(!got.contains(&before));
    assert!(
        s.next(Duration::from_millis(300)).await.is_none(),
        "nothing twice"
    );
}
