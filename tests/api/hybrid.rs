//! Hybrid timelines (`CHIRP_FANOUT_PULL_ABOVE`): the tweets of authors above the threshold are
//! pulled at read time, not fanned out, and every newsfeed stays what pure fan-out gives.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use axum::http::StatusCode;
use rand::Rng;
use serde_json::{Value, json};
use sqlx::PgPool;

use chirp::cache::AfterCommit;

use crate::helpers::{
    Ev, Stream, TestApp, eventually, lock_waiters, page_all, seeded_rng, urlencode,
};
use crate::statements::Statements;

/// An app whose authors are pulled above `above` followers and pushed again below `below`,
/// with a settle time short enough for a test.
async fn hybrid_app(db: PgPool, above: u64, below: u64) -> TestApp {
    TestApp::with(db, |c| {
        c.fanout_pull_above = above;
        c.fanout_pull_below = Some(below);
        c.fanout_pull_settle_ms = 10;
    })
    .await
}

/// Whether tweet `id` was pulled (posted without newsfeed rows for its author's followers).
async fn is_pulled(app: &TestApp, id: i64) -> bool {
    sqlx::query_scalar("select pulled from tweets where id = $1")
        .bind(id)
        .fetch_one(app.db())
        .await
        .expect("pulled")
}

/// `(entry id, entry created_at, tweet id)` of a page of newsfeeds.
fn entries(page: &Value) -> Vec<(i64, String, i64)> {
    page["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| {
            (
                r["id"].as_i64().expect("id"),
                r["created_at"].as_str().expect("created_at").to_owned(),
                r["tweet"]["id"].as_i64().expect("tweet id"),
            )
        })
        .collect()
}

/// A course front end's newsfeed view: the entries it holds and the newest one's time.
#[derive(Default)]
struct View {
    held: HashMap<i64, i64>,
    newest: Option<String>,
}

#[sqlx::test]
async fn a_pulled_authors_tweet_writes_no_newsfeed_rows_and_is_on_every_followers_next_read(
    db: PgPool,
) {
    let app = hybrid_app(db, 2, 1).await;
    let (star, star_token) = app.signup("star").await;
    let mut fans = Vec::new();
    for i in 0..3 {
        let fan = app.signup(&format!("fan{i}")).await;
        app.follow(&fan.1, star).await;
        fans.push(fan);
    }
    app.drain().await;
    // The first compose above the threshold makes the author a pull source, the next one
    // starts the settle time: both are fanned out.
    let pushed = app.tweets(&star_token, "pushed", 2).await;
    app.drain().await;
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let rows_before: i64 = sqlx::query_scalar("select count(*) from newsfeeds")
        .fetch_one(app.db())
        .await
        .expect("count");
    let pulled = app.tweet(&star_token, "pulled").await["id"]
        .as_i64()
        .expect("id");
    app.drain().await;
    let rows_after: i64 = sqlx::query_scalar("select count(*) from newsfeeds")
        .fetch_one(app.db())
        .await
        .expect("count");
    assert_eq!(rows_after, rows_before + 1, "only the author's own row");
    assert!(is_pulled(&app, pulled).await);
    for (_, token) in &fans {
        let page = app.get("/api/newsfeeds/", Some(token)).await;
        assert_eq!(page.status, StatusCode::OK);
        let ids: Vec<i64> = entries(&page.body).iter().map(|e| e.2).collect();
        assert_eq!(ids, vec![pulled, pushed[1], pushed[0]]);
        assert_eq!(entries(&page.body)[0].0, -pulled, "a pulled entry's id");
    }
    // Operators see how many authors are pulled.
    let health = app.get("/healthz", None).await;
    assert_eq!(health.body["fanout"]["pull_sources"], 1, "{}", health.body);
    let (_, _, metrics) = app.get_text("/metrics").await;
    assert!(
        metrics.lines().any(|l| l == "chirp_fanout_pull_sources 1"),
        "{metrics}"
    );
}

/// The pull clock (see `chirp::hybrid`): a fan-out batch is stamping its entry at its tweet's
/// time when a pulled tweet, newer, is posted and commits first. Had the batch committed its
/// entry below the pulled tweet, a client that refreshed in between would hold the pulled tweet,
/// and its next refresh (from the pulled tweet's time) would never return the entry. The
/// batch's check before its commit finds the newer pulled tweet and stamps its entry again,
/// above it: every entry reaches the client once.
#[sqlx::test]
async fn a_fan_out_batch_overtaken_by_a_pulled_tweet_stamps_again_so_no_refresh_misses_it(
    db: PgPool,
) {
    let app = std::sync::Arc::new(hybrid_app(db, 2, 2).await);
    // The star has crossed the threshold and settled: its next tweet is pulled.
    let PulledStar {
        star_token,
        small_token,
        reader,
        reader_token,
        ..
    } = a_pulled_star(&app).await;

    let mut held: HashMap<i64, i64> = HashMap::new();
    let mut newest = String::new();
    let refresh = async |held: &mut HashMap<i64, i64>, newest: &mut String| {
        let uri = if newest.is_empty() {
            "/api/newsfeeds/?page_size=100".to_owned()
        } else {
            format!("/api/newsfeeds/?created_at__gt={}", urlencode(newest))
        };
        let page = app.get(&uri, Some(&reader_token)).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        for (id, at, tweet) in entries(&page.body) {
            assert!(
                held.insert(id, tweet).is_none(),
                "entry {id} (tweet {tweet}) again"
            );
            if at > *newest {
                *newest = at;
            }
        }
    };
    refresh(&mut held, &mut newest).await;

    let pushed = app.tweet(&small_token, "fanned out").await["id"]
        .as_i64()
        .expect("id");
    // Another session holds the reader's newsfeed head: the fan-out batch stops there, after
    // it read the pull clock and before it stamps.
    let mut holder = app.db().begin().await.expect("begin");
    sqlx::query("select 1 from feed_heads where user_id = $1 for update")
        .bind(reader)
        .execute(&mut *holder)
        .await
        .expect("lock");
    let batch = {
        let app = app.clone();
        tokio::spawn(async move { app.state.worker.run_one().await.expect("job") })
    };
    lock_waiters(&app, 1).await;
    // A pulled tweet commits meanwhile (it does not wait for the batch).
    let pulled = app.tweet(&star_token, "pulled").await["id"]
        .as_i64()
        .expect("id");
    // The reader refreshes while the batch is in flight: it holds the pulled tweet.
    refresh(&mut held, &mut newest).await;
    assert!(held.values().any(|&t| t == pulled), "{held:?}");
    holder.commit().await.expect("commit");
    assert!(batch.await.expect("batch"));
    app.drain().await;
    refresh(&mut held, &mut newest).await;

    assert!(is_pulled(&app, pulled).await);
    let tweets: HashSet<i64> = held.values().copied().collect();
    assert!(
        tweets.contains(&pulled),
        "the pulled tweet reached the reader"
    );
    assert!(
        tweets.contains(&pushed),
        "the fanned-out tweet reached the reader: held {held:?}"
    );
}

/// The model test of issue 36: random histories of posts, deletes, follows, unfollows and
/// Redis flushes, with a threshold so low that authors cross it in both directions all the
/// time. After every step, for a random reader: a pull-to-refresh from the newest entry its
/// view holds returns no entry it holds and leaves no tweet of its newsfeed missing from the
/// view; a walk down the whole newsfeed with a random page size gives exactly the tweets pure
/// fan-out would (the reader's own and all of its followees', each once, newest first) and
/// equals the oracle query (`newsfeeds::page`) entry for entry.
#[sqlx::test]
async fn hybrid_newsfeeds_are_pure_fan_out_over_random_histories(db: PgPool) {
    let (seed, mut rng) = seeded_rng("CHIRP_HYBRID_SEED", "hybrid model");
    let app = hybrid_app(db, 2, 2).await;
    const USERS: usize = 6;
    let mut users = Vec::new();
    for i in 0..USERS {
        users.push(app.signup(&format!("user{i}")).await);
    }
    let mut follows: HashSet<(usize, usize)> = HashSet::new();
    let mut tweets: Vec<(i64, usize)> = Vec::new();
    let mut views: Vec<View> = (0..USERS).map(|_| View::default()).collect();
    // After the random steps, an epilogue makes sure of a crossing back: an author with pulled
    // tweets loses its followers one by one, then posts (fanned out again). If the random steps
    // left no pulled tweet (some seeds do), the epilogue first has every other user follow one
    // author and that author post until a tweet is pulled.
    let (mut going_back, mut posted_back): (Option<usize>, bool) = (None, false);
    let (mut going_up, mut posts_up): (Option<usize>, u32) = (None, 0);
    for step in 0.. {
        let who = rng.random_range(0..USERS);
        let token = &users[who].1;
        if step == 300 {
            let star: Option<i64> = sqlx::query_scalar(
                "select user_id from tweets where pulled order by created_at desc limit 1",
            )
            .fetch_optional(app.db())
            .await
            .expect("a pulled author");
            going_back = star.and_then(|id| users.iter().position(|u| u.0 == id));
            if going_back.is_none() {
                going_up = Some(who);
            }
        }
        let what = if let Some(star) = going_up {
            match (0..USERS).find(|&f| f != star && !follows.contains(&(f, star))) {
                Some(fan) => {
                    follows.insert((fan, star));
                    app.follow(&users[fan].1, users[star].0).await;
                    format!("u{fan} follows u{star} (epilogue)")
                }
                None => {
                    // Past the pull policy's settle time (10 ms here) above the threshold.
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    let id = app.tweet(&users[star].1, "up").await["id"]
                        .as_i64()
                        .expect("id");
                    tweets.push((id, star));
                    posts_up += 1;
                    let pulled = is_pulled(&app, id).await;
                    assert!(
                        pulled || posts_up < 20,
                        "seed {seed}: u{star} is never pulled"
                    );
                    if pulled {
                        (going_up, going_back) = (None, Some(star));
                    }
                    format!("u{star} posts {id} (epilogue, pulled: {pulled})")
                }
            }
        } else if let Some(star) = going_back {
            match follows.iter().find(|f| f.1 == star).copied() {
                Some((fan, _)) => {
                    follows.remove(&(fan, star));
                    let uri = format!("/api/friendships/{}/unfollow/", users[star].0);
                    let res = app.post(&uri, Some(&users[fan].1), json!({})).await;
                    assert!(res.status.is_success(), "{}", res.body);
                    format!("u{fan} unfollows u{star} (epilogue)")
                }
                None if posted_back => break,
                None => {
                    let id = app.tweet(&users[star].1, "back").await["id"]
                        .as_i64()
                        .expect("id");
                    tweets.push((id, star));
                    posted_back = true;
                    format!("u{star} posts {id} (epilogue)")
                }
            }
        } else {
            match rng.random_range(0..100) {
                0..40 => {
                    let id = app.tweet(token, &format!("s{step}")).await["id"]
                        .as_i64()
                        .expect("id");
                    tweets.push((id, who));
                    format!("u{who} posts {id}")
                }
                40..50 => {
                    let own: Vec<usize> =
                        (0..tweets.len()).filter(|&i| tweets[i].1 == who).collect();
                    let Some(&i) = own.get(rng.random_range(0..own.len().max(1))) else {
                        continue;
                    };
                    let (id, _) = tweets.remove(i);
                    let res = app.delete(&format!("/api/tweets/{id}/"), Some(token)).await;
                    assert!(res.status.is_success(), "{}", res.body);
                    format!("u{who} deletes {id}")
                }
                // Follows and unfollows, in phases that favour one then the other, so authors
                // cross the threshold in both directions.
                50..92 if rng.random_bool(if (step / 50) % 2 == 0 { 0.8 } else { 0.1 }) => {
                    let to = rng.random_range(0..USERS);
                    if to == who || !follows.insert((who, to)) {
                        continue;
                    }
                    app.follow(token, users[to].0).await;
                    format!("u{who} follows u{to}")
                }
                50..92 => {
                    let to = rng.random_range(0..USERS);
                    if !follows.remove(&(who, to)) {
                        continue;
                    }
                    let uri = format!("/api/friendships/{}/unfollow/", users[to].0);
                    let res = app.post(&uri, Some(token), json!({})).await;
                    assert!(res.status.is_success(), "{}", res.body);
                    format!("u{who} unfollows u{to}")
                }
                92..96 => {
                    app.flush_cache().await;
                    "flush".to_owned()
                }
                _ => {
                    tokio::time::sleep(std::time::Duration::from_millis(15)).await;
                    "settle".to_owned()
                }
            }
        };
        app.drain().await;
        let reader = rng.random_range(0..USERS);
        let (reader_id, token) = (users[reader].0, &users[reader].1);
        let context = format!("seed {seed}, step {step} ({what}), reader u{reader}");
        // Pull to refresh from the newest entry held (the first read: the whole first page).
        let view = &mut views[reader];
        let uri = match &view.newest {
            Some(t) => format!("/api/newsfeeds/?created_at__gt={}", urlencode(t)),
            None => "/api/newsfeeds/?page_size=100".to_owned(),
        };
        let page = app.get(&uri, Some(token)).await;
        assert_eq!(page.status, StatusCode::OK, "{context}: {}", page.body);
        assert_eq!(page.body["has_next_page"], json!(false), "{context}");
        for (id, at, tweet) in entries(&page.body) {
            assert!(
                view.held.insert(id, tweet).is_none(),
                "{context}: the refresh delivered entry {id} (tweet {tweet}) again"
            );
            if view.newest.as_ref().is_none_or(|n| at > *n) {
                view.newest = Some(at);
            }
        }
        // What pure fan-out shows: the reader's own tweets and all of its followees'.
        let expected: HashSet<i64> = tweets
            .iter()
            .filter(|(_, a)| *a == reader || follows.contains(&(reader, *a)))
            .map(|(id, _)| *id)
            .collect();
        let held: HashSet<i64> = view.held.values().copied().collect();
        let missing: Vec<&i64> = expected.difference(&held).collect();
        assert!(
            missing.is_empty(),
            "{context}: tweets {missing:?} are in the newsfeed but no refresh delivered them"
        );
        // The whole newsfeed, page by page.
        let size = rng.random_range(1..8);
        let walked = page_all(&app, "/api/newsfeeds/", Some(token), size).await;
        let unique: HashSet<i64> = walked.iter().copied().collect();
        assert_eq!(
            unique.len(),
            walked.len(),
            "{context}: repeats in {walked:?}"
        );
        assert_eq!(unique, expected, "{context}: the walk (page size {size})");
        // Entry for entry what the oracle query says.
        let page = app.get("/api/newsfeeds/?page_size=100", Some(token)).await;
        let served: Vec<(i64, i64)> = entries(&page.body).iter().map(|e| (e.0, e.2)).collect();
        let oracle: Vec<(i64, i64)> = chirp::newsfeeds::page(app.db(), reader_id, None, None, 100)
            .await
            .expect("oracle")
            .iter()
            .map(|r| (r.entry_id, r.tweet_id))
            .collect();
        assert_eq!(
            served, oracle,
            "{context}: the served newsfeed and the oracle"
        );
    }
    // The history crossed the threshold both ways.
    let (pulled, pushed_after): (i64, i64) = sqlx::query_as(
        "select count(*) filter (where pulled),
                count(*) filter (where not pulled and exists (
                    select 1 from tweets p where p.user_id = t.user_id and p.pulled
                      and p.created_at < t.created_at))
         from tweets t",
    )
    .fetch_one(app.db())
    .await
    .expect("counts");
    let (merged, fallbacks) = (app.stat("merged"), app.stat("merge_fallbacks"));
    eprintln!(
        "seed {seed}: {pulled} pulled tweets, {pushed_after} pushed after a pulled one; \
         {merged} pages merged from cached lists, {fallbacks} from Postgres"
    );
    // One process, each write's cache step done before the next read: no list ever lags.
    assert!(merged > 0, "seed {seed}: no page was merged from the cache");
    assert_eq!(fallbacks, 0, "seed {seed}: a page fell back to Postgres");
    assert!(pulled > 0, "seed {seed}: no tweet was pulled");
    assert!(
        pushed_after > 0,
        "seed {seed}: no author went back to fan-out"
    );
}

/// A newsfeed that merges pulled tweets from their author's cached list checks the lists
/// against one Postgres snapshot: while a pulled tweet's cache step has not landed (process A
/// committed it and stalls before Redis), a fan-out row of a later tweet is already in the
/// reader's cached newsfeed (process B). Merged as they stand, the page would show the later
/// row without the pulled tweet below it, and a refresh from it would never deliver the pulled
/// one. The page must equal the oracle, and once the list caught up, pages merge from the
/// cache again.
#[sqlx::test]
async fn a_page_merged_while_a_pulled_list_lags_is_the_snapshots_page(db: PgPool) {
    let b = hybrid_app(db.clone(), 2, 1).await;
    let prefix = b.prefix.clone();
    let a = TestApp::with(db, |c| {
        c.redis_prefix = prefix;
        c.fanout_pull_above = 2;
        c.fanout_pull_below = Some(1);
        c.fanout_pull_settle_ms = 10;
    })
    .await;
    let (star, star_token) = b.signup("star").await;
    let (reader, reader_token) = b.signup("reader").await;
    let (friend, friend_token) = b.signup("friend").await;
    b.follow(&reader_token, friend).await;
    for fan in [&reader_token, &friend_token, &b.signup("fan").await.1] {
        b.follow(fan, star).await;
    }
    b.tweets(&star_token, "pushed", 2).await;
    b.drain().await;
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let first = b.tweet(&star_token, "pulled first").await["id"]
        .as_i64()
        .expect("id");
    assert!(is_pulled(&b, first).await);
    let oracle = async |app: &TestApp| -> Vec<(i64, i64)> {
        chirp::newsfeeds::page(app.db(), reader, None, None, 100)
            .await
            .expect("oracle")
            .iter()
            .map(|r| (r.entry_id, r.tweet_id))
            .collect()
    };
    let served = async |app: &TestApp| -> Vec<(i64, i64)> {
        let page = app
            .get("/api/newsfeeds/?page_size=100", Some(&reader_token))
            .await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        entries(&page.body).iter().map(|e| (e.0, e.2)).collect()
    };
    // Both lists cached, the page merged from them.
    assert_eq!(served(&b).await, oracle(&b).await);
    assert_eq!(served(&b).await, oracle(&b).await);
    assert_eq!((b.stat("merged"), b.stat("merge_fallbacks")), (2, 0));

    // Process A commits a pulled tweet and stalls before its cache step (its applied rows
    // deleted first: the one row counted below is the stalled one).
    a.state.cache.forgotten().await;
    let gate = Arc::new(tokio::sync::Mutex::new(()));
    let held = gate.clone().lock_owned().await;
    a.state.cache.set_after_commit(AfterCommit::Gate(gate));
    let a = Arc::new(a);
    let post = {
        let (a, token) = (a.clone(), star_token.clone());
        tokio::spawn(async move { a.tweet(&token, "pulled late").await["id"].as_i64() })
    };
    eventually("the pulled tweet committed", async || {
        b.outbox_rows().await == 1
    })
    .await;
    // Process B: a later tweet of a pushed author reaches the reader's cached newsfeed.
    let later = b.tweet(&friend_token, "later").await["id"]
        .as_i64()
        .expect("id");
    b.drain().await;
    let page = served(&b).await;
    let expected = oracle(&b).await;
    assert_eq!(page, expected, "the merged page and the oracle");
    assert_eq!(page[0].1, later);
    assert_eq!(b.stat("merge_fallbacks"), 1);

    drop(held);
    let late = post.await.expect("post").expect("id");
    assert!(is_pulled(&b, late).await);
    a.state.cache.forgotten().await;
    assert_eq!(b.outbox_rows().await, 0);
    let page = served(&b).await;
    assert_eq!(page, oracle(&b).await);
    assert_eq!(page[1], (-late, late));
    assert_eq!(b.stat("merge_fallbacks"), 1, "merged from the cache again");
}

/// A pulled author and others post into one circle at once: every compose locks the circle's
/// row before the pull clock (a pulled compose holds the clock exclusively, and the others
/// take it last), so none deadlocks and every post answers 201.
#[sqlx::test]
async fn pulled_and_fanned_out_composes_into_one_circle_never_deadlock(db: PgPool) {
    let app = std::sync::Arc::new(hybrid_app(db, 2, 2).await);
    let (star, star_token) = app.signup("star").await;
    let mut tokens = vec![star_token.clone()];
    for i in 0..3 {
        let (_, token) = app.signup(&format!("fan{i}")).await;
        app.follow(&token, star).await;
        tokens.push(token);
    }
    let res = app
        .post(
            "/api/circles/",
            Some(&star_token),
            json!({"name": "together"}),
        )
        .await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    let circle = res.body["id"].as_i64().expect("id");
    for token in &tokens[1..] {
        let uri = format!("/api/circles/{circle}/join/");
        let res = app.post(&uri, Some(token), json!({})).await;
        assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    }
    app.tweets(&star_token, "crossing", 2).await;
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let mut posts = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        let (app, token) = (app.clone(), token.clone());
        posts.push(tokio::spawn(async move {
            for n in 0..15 {
                let body = json!({"content": format!("{i}-{n}"), "circle_id": circle});
                let res = app.post("/api/tweets/", Some(&token), body).await;
                assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
            }
        }));
    }
    for post in posts {
        post.await.expect("posts");
    }
    let pulled: i64 = sqlx::query_scalar("select count(*) from tweets where pulled")
        .fetch_one(app.db())
        .await
        .expect("count");
    assert!(pulled >= 15, "the star's posts were pulled ({pulled})");
}

/// The tweet ids of `events`' tweet events, in order.
fn streamed(events: &[Ev]) -> Vec<i64> {
    events
        .iter()
        .filter(|e| e.kind == "tweet")
        .filter_map(|e| e.data["tweet"]["id"].as_i64())
        .collect()
}

/// The hybrid tests' accounts on an app pulling above 2 followers: a star with two fans and a
/// reader, which follows the star and `small` (fanned out); the star has crossed the threshold
/// and settled, so its next tweets are pulled.
struct PulledStar {
    star: i64,
    star_token: String,
    small_token: String,
    reader: i64,
    reader_token: String,
}

/// Makes the accounts of [`PulledStar`] on `app`.
async fn a_pulled_star(app: &TestApp) -> PulledStar {
    let (star, star_token) = app.signup("star").await;
    let (small, small_token) = app.signup("small").await;
    let (reader, reader_token) = app.signup("reader").await;
    for i in 0..2 {
        let (_, fan) = app.signup(&format!("fan{i}")).await;
        app.follow(&fan, star).await;
    }
    app.follow(&reader_token, star).await;
    app.follow(&reader_token, small).await;
    app.drain().await;
    app.tweets(&star_token, "before", 2).await;
    app.drain().await;
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    PulledStar {
        star,
        star_token,
        small_token,
        reader,
        reader_token,
    }
}

/// `streaming/user` sends a large account's pulled tweets to its followers as it sends fanned
/// out ones: live, once, in newsfeed order beside rows, again after a resume from a token (and
/// only what came after it), with their deletes; not to a user who does not follow the author;
/// and to one who follows the author while its stream is open, by its next heartbeat.
/// (Before, pulled tweets were never streamed: the first live one did not arrive.)
#[sqlx::test]
async fn pulled_tweets_reach_the_followers_user_streams_once_live_and_on_resume(db: PgPool) {
    let app = TestApp::with(db, |c| {
        c.fanout_pull_above = 2;
        c.fanout_pull_below = Some(1);
        c.fanout_pull_settle_ms = 10;
        c.stream_heartbeat_secs = 1;
    })
    .await;
    let PulledStar {
        star,
        star_token,
        small_token,
        reader_token: reader,
        ..
    } = a_pulled_star(&app).await;
    let (_, stranger) = app.signup("stranger").await;
    let (_, late) = app.signup("late").await;
    let uri = "/api/streaming/user/";
    let mut s = Stream::open(&app, uri, &reader, None).await;
    let mut other = Stream::open(&app, uri, &stranger, None).await;
    let mut joins = Stream::open(&app, uri, &late, None).await;
    let first = app.tweet(&star_token, "pulled, live").await["id"]
        .as_i64()
        .expect("id");
    assert!(
        is_pulled(&app, first).await,
        "the setup pulls the star's tweets"
    );
    let got = s.tweets_until(first).await;
    assert_eq!(streamed(&got), vec![first]);
    let token = got[0].id.clone().expect("a resume token");
    drop(s);
    // While away: a fanned-out tweet, then a pulled one.
    let pushed = app.tweet(&small_token, "pushed, while away").await["id"]
        .as_i64()
        .expect("id");
    app.drain().await;
    let away = app.tweet(&star_token, "pulled, while away").await["id"]
        .as_i64()
        .expect("id");
    let mut s = Stream::open(&app, uri, &reader, Some(&token)).await;
    let got = s.tweets_until(away).await;
    assert_eq!(
        streamed(&got),
        vec![pushed, away],
        "after the token, in order"
    );
    app.follow(&late, star).await;
    app.drain().await;
    let after_follow = app.tweet(&star_token, "pulled, live again").await["id"]
        .as_i64()
        .expect("id");
    let got = s.tweets_until(after_follow).await;
    assert_eq!(streamed(&got), vec![after_follow]);
    let got = joins.tweets_until(after_follow).await;
    assert_eq!(
        streamed(&got).last(),
        Some(&after_follow),
        "a follow made while the stream is open"
    );
    let res = app
        .delete(&format!("/api/tweets/{after_follow}/"), Some(&star_token))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let next = s.next(std::time::Duration::from_secs(5)).await;
    let next = next.expect("the delete");
    assert_eq!(
        (next.kind.as_str(), next.data["tweet_id"].as_i64()),
        ("delete", Some(after_follow))
    );
    // Across two heartbeats (two settles): nothing twice, and nothing to the stranger.
    assert!(
        s.next(std::time::Duration::from_millis(2500))
            .await
            .is_none(),
        "nothing twice"
    );
    let strays = other.next(std::time::Duration::from_millis(200)).await;
    assert!(strays.is_none(), "{strays:?}");
}

/// A stream's user unfollows a pull source after the stream read whom it follows (and before
/// its next heartbeat reads it again): the author's next pulled tweet is not sent to it, since
/// each pulled tweet's followers are read from Postgres when it comes (a stream that trusted
/// what it had read sent it).
#[sqlx::test]
async fn a_stream_is_not_sent_the_pulled_tweet_of_an_author_its_user_unfollowed(db: PgPool) {
    let app = TestApp::with(db, |c| {
        c.fanout_pull_above = 2;
        c.fanout_pull_below = Some(1);
        c.fanout_pull_settle_ms = 10;
        c.stream_heartbeat_secs = 15;
    })
    .await;
    let PulledStar {
        star,
        star_token,
        small_token,
        reader_token: reader,
        ..
    } = a_pulled_star(&app).await;
    let mut s = Stream::open(&app, "/api/streaming/user/", &reader, None).await;
    let followed = app.tweet(&star_token, "followed").await["id"]
        .as_i64()
        .expect("id");
    assert_eq!(streamed(&s.tweets_until(followed).await), vec![followed]);
    let res = app
        .post(
            &format!("/api/friendships/{star}/unfollow/"),
            Some(&reader),
            json!({}),
        )
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    app.drain().await;
    let unfollowed = app.tweet(&star_token, "after the unfollow").await["id"]
        .as_i64()
        .expect("id");
    assert!(is_pulled(&app, unfollowed).await);
    let pushed = app.tweet(&small_token, "pushed").await["id"]
        .as_i64()
        .expect("id");
    app.drain().await;
    assert_eq!(streamed(&s.tweets_until(pushed).await), vec![pushed]);
}

/// A pulled author's reply is fanned out instead (crate::replies): to the followers who follow
/// the replied-to user too, and nobody else's newsfeed merges it at read time.
#[sqlx::test]
async fn a_pulled_authors_reply_is_fanned_out_to_the_readers_who_follow_both(db: PgPool) {
    let app = hybrid_app(db, 2, 1).await;
    let (star, star_token) = app.signup("star").await;
    let (bob, bob_token) = app.signup("bob").await;
    let mut fans = Vec::new();
    for i in 0..3 {
        let fan = app.signup(&format!("fan{i}")).await;
        app.follow(&fan.1, star).await;
        fans.push(fan);
    }
    app.follow(&fans[0].1, bob).await;
    app.drain().await;
    app.tweets(&star_token, "pushed", 2).await;
    app.drain().await;
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let pulled = app.tweet(&star_token, "pulled").await["id"]
        .as_i64()
        .unwrap();
    assert!(is_pulled(&app, pulled).await);
    let bobs = app.tweet(&bob_token, "bob's").await["id"].as_i64().unwrap();
    let res = app
        .post(
            "/api/tweets/",
            Some(&star_token),
            serde_json::json!({"content": "to bob", "in_reply_to_tweet_id": bobs}),
        )
        .await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    let reply = res.body["id"].as_i64().unwrap();
    assert!(!is_pulled(&app, reply).await, "a reply is never pulled");
    app.drain().await;
    for round in ["warm", "flushed"] {
        for (i, (_, token)) in fans.iter().enumerate() {
            let ids = page_all(&app, "/api/newsfeeds/", Some(token), 2).await;
            assert_eq!(ids.contains(&reply), i == 0, "fan {i}, {round}: {ids:?}");
            assert!(ids.contains(&pulled), "fan {i}, {round}");
        }
        app.flush_cache().await;
    }
}

/// Decision 0033: a compose reads its predecessors and takes its time (for a pulled author,
/// under the pull clock) in its insert; decision 0036: the insert queues its fan-out job too.
/// A fanned-out author's post makes 6 statements with its commit (8 before 0033, 7 before
/// 0036), a pulled author's 5 (8, then 6), counted through a proxy from the request to the
/// delete of its applied outbox row after the answer, with its `BEGIN` and that delete.
#[sqlx::test]
async fn a_compose_makes_six_statements_and_a_pulled_one_five(db: PgPool) {
    let (statements, through) = Statements::start(&db).await;
    let app = hybrid_app(through, 2, 1).await;
    let (star, token) = app.signup("star").await;
    for i in 0..3 {
        let (_, fan) = app.signup(&format!("fan{i}")).await;
        app.follow(&fan, star).await;
    }
    app.drain().await;
    let counted = async |content: &str| {
        app.state.cache.forgotten().await;
        let before = statements.count();
        let id = app.tweet(&token, content).await["id"].as_i64().expect("id");
        app.state.cache.forgotten().await;
        let made = statements.count() - before;
        app.drain().await;
        (id, made)
    };
    // The first compose above the threshold makes the author a pull source, the next one
    // starts the settle time: both are fanned out.
    let (first, _) = counted("first").await;
    let (pushed, made) = counted("pushed").await;
    assert!(!is_pulled(&app, first).await && !is_pulled(&app, pushed).await);
    assert_eq!(made, 1 + 6 + 1, "a fanned-out compose's statements");
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let (pulled, made) = counted("pulled").await;
    assert!(is_pulled(&app, pulled).await);
    assert_eq!(made, 1 + 5 + 1, "a pulled compose's statements");
}
