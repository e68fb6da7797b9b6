//! Retweets (issue 41, ../shared/API.md v3 "Retweets" and "Blocks and mutes";
//! docs/decisions/0026-retweets.md): the retweet object and its 201/200 answers, an exact
//! `retweets_count` under concurrency, a status at most once in a newsfeed (the first entry
//! stays, undoing it shows the next one on top) against a model of random histories, warm,
//! flushed and with Redis down, also for undos at once, for a pulled author's tweets and for
//! removals whose cache step never ran, an undo that meets a new retweeter's unfollow, and
//! mutes hiding retweets by and of the muted account.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use axum::http::StatusCode;
use chirp::config::Config;
use rand::Rng;
use rand::seq::IndexedRandom;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{
    Proxy, Res, TestApp, page_all, page_tweets, seeded_rng, two_processes, urlencode,
};

async fn retweet(app: &TestApp, token: &str, id: i64) -> Res {
    app.post(
        &format!("/api/tweets/{id}/retweet/"),
        Some(token),
        json!({}),
    )
    .await
}

async fn unretweet(app: &TestApp, token: &str, id: i64) -> Res {
    app.post(
        &format!("/api/tweets/{id}/unretweet/"),
        Some(token),
        json!({}),
    )
    .await
}

/// Retweets `id` as `token`, which must answer 201; the retweet's id.
async fn new_retweet(app: &TestApp, token: &str, id: i64) -> i64 {
    let res = retweet(app, token, id).await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    res.body["id"].as_i64().expect("id")
}

/// Unretweets `id` as `token`, which must answer 200; the `deleted` it answers.
async fn unretweet_deleted(app: &TestApp, token: &str, id: i64) -> i64 {
    let res = unretweet(app, token, id).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(res.body["success"], true, "{}", res.body);
    res.body["deleted"].as_i64().expect("deleted")
}

/// A tweet's detail, which must be a 200.
async fn detail(app: &TestApp, id: i64, token: Option<&str>) -> Value {
    let res = app.get(&format!("/api/tweets/{id}/"), token).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    res.body
}

/// `(retweets_count, has_retweeted)` of a tweet's detail as `token` sees it.
async fn retweets_of(app: &TestApp, id: i64, token: Option<&str>) -> (i64, bool) {
    let body = detail(app, id, token).await;
    (
        body["retweets_count"].as_i64().expect("retweets_count"),
        body["has_retweeted"].as_bool().expect("has_retweeted"),
    )
}

/// `(the column, live retweet rows)` of tweet `id` in Postgres.
async fn retweets_in_postgres(app: &TestApp, id: i64) -> (i64, i64) {
    let column: i64 = sqlx::query_scalar("select retweets_count from tweets where id = $1")
        .bind(id)
        .fetch_one(app.db())
        .await
        .unwrap();
    let rows: i64 = sqlx::query_scalar("select count(*) from tweets where retweeted_tweet_id = $1")
        .bind(id)
        .fetch_one(app.db())
        .await
        .unwrap();
    (column, rows)
}

async fn tweets_count(app: &TestApp, user: i64) -> i64 {
    let res = app.get(&format!("/api/users/{user}/"), None).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    res.body["tweets_count"].as_i64().expect("tweets_count")
}

/// One newsfeed item as a client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    /// The newsfeed entry's id and `created_at` (its place).
    id: i64,
    at: String,
    /// The item's tweet (a retweet, or the original itself) and its author.
    tweet: i64,
    author: i64,
    /// `retweeted_tweet.id`, if not null.
    retweeted: Option<i64>,
    /// `retweeted_tweet_id` is set but `retweeted_tweet` is null.
    orphan: bool,
    /// The status object's (`retweeted_tweet`, or the tweet itself) `retweets_count` and
    /// `has_retweeted`.
    retweets_count: i64,
    has_retweeted: bool,
}

impl Entry {
    fn of(item: &Value) -> Entry {
        let tweet = &item["tweet"];
        let original = &tweet["retweeted_tweet"];
        let retweeted = original["id"].as_i64();
        if retweeted.is_some() {
            assert_eq!(tweet["content"], "", "a retweet's own text: {item}");
            assert_eq!(tweet["retweeted_tweet_id"], original["id"], "{item}");
        }
        let status = if retweeted.is_some() { original } else { tweet };
        Entry {
            id: item["id"].as_i64().expect("id"),
            at: item["created_at"].as_str().expect("created_at").to_owned(),
            tweet: tweet["id"].as_i64().expect("tweet id"),
            author: tweet["user"]["id"].as_i64().expect("author"),
            retweeted,
            orphan: tweet["retweeted_tweet_id"].is_i64() && original.is_null(),
            retweets_count: status["retweets_count"].as_i64().expect("retweets_count"),
            has_retweeted: status["has_retweeted"].as_bool().expect("has_retweeted"),
        }
    }

    /// The status it shows: the retweeted tweet, or the tweet itself.
    fn status(&self) -> i64 {
        self.retweeted.unwrap_or(self.tweet)
    }

    /// The same entry with `retweets_count` at `n` if it shows `status`.
    fn counted(&self, status: i64, n: i64) -> Entry {
        let mut e = self.clone();
        if e.status() == status {
            e.retweets_count = n;
        }
        e
    }

    /// Where it is: what a client holds and a refresh must not move.
    fn place(&self) -> (i64, &str, i64) {
        (self.id, self.at.as_str(), self.tweet)
    }
}

/// Every entry of `token`'s newsfeed, newest first, paged with `created_at__lt`.
async fn feed(app: &TestApp, token: &str, page_size: usize) -> Vec<Entry> {
    let base = format!("/api/newsfeeds/?page_size={page_size}");
    let mut uri = base.clone();
    let mut all = Vec::new();
    for _ in 0..1000 {
        let res = app.get(&uri, Some(token)).await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.body);
        let results = res.body["results"].as_array().expect("results");
        assert!(results.len() <= page_size);
        all.extend(results.iter().map(Entry::of));
        if !res.body["has_next_page"].as_bool().expect("has_next_page") {
            return all;
        }
        let last = &all.last().expect("a full page has a last item").at;
        uri = format!("{base}&created_at__lt={}", urlencode(last));
    }
    panic!("paging did not end");
}

/// The entries newer than `after` (a pull to refresh).
async fn refresh(app: &TestApp, token: &str, after: &str) -> Vec<Entry> {
    let uri = format!("/api/newsfeeds/?created_at__gt={}", urlencode(after));
    let res = app.get(&uri, Some(token)).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(res.body["has_next_page"], false, "{}", res.body);
    res.body["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(Entry::of)
        .collect()
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_retweet_carries_its_tweet_and_counts_once_per_user(db: PgPool) {
    let app = TestApp::new(db).await;
    let (ann, ta) = app.quick_user("ann").await;
    let (bob, tb) = app.quick_user("bob").await;
    let (cat, tc) = app.quick_user("cat").await;
    let (dan, td) = app.quick_user("dan").await;
    let original = app.tweet(&ta, "retweet me").await;
    assert_eq!(original["retweets_count"], 0, "{original}");
    assert_eq!(original["has_retweeted"], false, "{original}");
    assert_eq!(original["retweeted_tweet"], Value::Null, "{original}");
    assert!(original.get("retweeted_tweet_id").is_none(), "{original}");
    let id = original["id"].as_i64().unwrap();
    // Cached with its counts before the retweet.
    assert_eq!(retweets_of(&app, id, Some(&tb)).await, (0, false));

    let res = retweet(&app, &tb, id).await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    let rt = res.body;
    let rt_id = rt["id"].as_i64().unwrap();
    assert_ne!(rt_id, id);
    assert_eq!(rt["content"], "", "{rt}");
    assert_eq!(rt["user"]["id"], bob, "{rt}");
    assert_eq!(rt["retweeted_tweet_id"], id, "{rt}");
    assert_eq!(rt["retweeted_tweet"]["id"], id, "{rt}");
    assert_eq!(rt["retweeted_tweet"]["content"], "retweet me", "{rt}");
    assert_eq!(rt["retweeted_tweet"]["user"]["id"], ann, "{rt}");
    assert_eq!(rt["retweeted_tweet"]["has_retweeted"], true, "{rt}");
    assert_eq!(rt["retweeted_tweet"]["retweets_count"], 1, "{rt}");
    assert_eq!(
        rt["retweeted_tweet"]["retweeted_tweet"],
        Value::Null,
        "{rt}"
    );

    // Again, and a retweet of the retweet: the same retweet, 200.
    for target in [id, rt_id] {
        let again = retweet(&app, &tb, target).await;
        assert_eq!(again.status, StatusCode::OK, "{target}: {}", again.body);
        assert_eq!(again.body["id"], rt_id, "{target}: {}", again.body);
        assert_eq!(again.body["retweeted_tweet"]["id"], id, "{}", again.body);
        assert_eq!(again.body["retweeted_tweet"]["retweets_count"], 1);
    }
    for round in ["warm", "flushed"] {
        assert_eq!(retweets_of(&app, id, Some(&tb)).await, (1, true), "{round}");
        assert_eq!(
            retweets_of(&app, id, Some(&ta)).await,
            (1, false),
            "{round}"
        );
        assert_eq!(
            retweets_of(&app, id, Some(&tc)).await,
            (1, false),
            "{round}"
        );
        assert_eq!(retweets_of(&app, id, None).await, (1, false), "{round}");
        let shown = detail(&app, rt_id, Some(&tb)).await;
        assert_eq!(shown["content"], "", "{round}: {shown}");
        assert_eq!(shown["retweeted_tweet"]["id"], id, "{round}: {shown}");
        assert_eq!(shown["retweeted_tweet"]["has_retweeted"], true, "{round}");
        let shown = detail(&app, rt_id, Some(&tc)).await;
        assert_eq!(shown["retweeted_tweet"]["has_retweeted"], false, "{round}");
        assert_eq!(shown["retweeted_tweet"]["retweets_count"], 1, "{round}");
        // The retweeter's timeline shows the retweet with its tweet.
        let page = app.get(&format!("/api/tweets/?user_id={bob}"), None).await;
        assert_eq!(
            page.body["results"][0]["id"], rt_id,
            "{round}: {}",
            page.body
        );
        assert_eq!(page.body["results"][0]["retweeted_tweet"]["id"], id);
        assert_eq!(tweets_count(&app, bob).await, 1, "{round}");
        app.flush_cache().await;
    }
    assert_eq!(retweets_in_postgres(&app, id).await, (1, 1));

    // cat retweets bob's retweet: a retweet of the original.
    let res = retweet(&app, &tc, rt_id).await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    assert_eq!(res.body["retweeted_tweet_id"], id, "{}", res.body);
    assert_eq!(res.body["retweeted_tweet"]["id"], id, "{}", res.body);
    assert_eq!(res.body["retweeted_tweet"]["retweets_count"], 2);
    let cat_rt = res.body["id"].as_i64().unwrap();
    assert_eq!(retweets_of(&app, id, Some(&tc)).await, (2, true));
    assert_eq!(
        retweets_of(&app, rt_id, Some(&tc)).await.0,
        0,
        "a retweet is not retweeted"
    );

    // Unknown tweets: 404 and nothing changes.
    let unknown = cat_rt + 10_000;
    let res = retweet(&app, &tb, unknown).await;
    assert_eq!(res.status, StatusCode::NOT_FOUND, "{}", res.body);
    let res = unretweet(&app, &tb, unknown).await;
    assert_eq!(res.status, StatusCode::NOT_FOUND, "{}", res.body);
    // A block either way: 403.
    let dans = app.tweet(&td, "dan's").await["id"].as_i64().unwrap();
    let blocked = app
        .post(&format!("/api/users/{dan}/block/"), Some(&ta), json!({}))
        .await;
    assert_eq!(blocked.status, StatusCode::OK, "{}", blocked.body);
    let res = retweet(&app, &td, id).await;
    assert_eq!(
        res.status,
        StatusCode::FORBIDDEN,
        "blocked by the author: {}",
        res.body
    );
    let res = retweet(&app, &ta, dans).await;
    assert_eq!(
        res.status,
        StatusCode::FORBIDDEN,
        "the author blocks: {}",
        res.body
    );
    assert_eq!(retweets_of(&app, id, None).await.0, 2);
    assert_eq!(retweets_of(&app, dans, None).await.0, 0);

    // The author is told, once per retweeter.
    let res = app.get("/api/notifications/?page_size=50", Some(&ta)).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let mut told: Vec<(i64, String, i64)> = res.body["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["verb"] == "retweeted your tweet")
        .map(|n| {
            (
                n["actor"]["id"].as_i64().unwrap(),
                n["target_type"].as_str().unwrap().to_owned(),
                n["target_id"].as_i64().unwrap(),
            )
        })
        .collect();
    told.sort();
    assert_eq!(
        told,
        vec![(bob, "tweet".to_owned(), id), (cat, "tweet".to_owned(), id)],
        "{}",
        res.body
    );

    // Undo: deleted 1, then 0; the count goes back down.
    assert_eq!(unretweet_deleted(&app, &tb, id).await, 1);
    assert_eq!(unretweet_deleted(&app, &tb, id).await, 0);
    assert_eq!(unretweet_deleted(&app, &ta, id).await, 0, "never retweeted");
    let gone = app.get(&format!("/api/tweets/{rt_id}/"), None).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND, "{}", gone.body);
    assert_eq!(retweets_of(&app, id, Some(&tb)).await, (1, false));
    assert_eq!(unretweet_deleted(&app, &tc, id).await, 1);
    for round in ["warm", "flushed"] {
        assert_eq!(
            retweets_of(&app, id, Some(&tc)).await,
            (0, false),
            "{round}"
        );
        assert_eq!(tweets_count(&app, bob).await, 0, "{round}");
        assert_eq!(tweets_count(&app, cat).await, 0, "{round}");
        let page = app.get(&format!("/api/tweets/?user_id={bob}"), None).await;
        assert_eq!(page.body["results"], json!([]), "{round}: {}", page.body);
        app.flush_cache().await;
    }
    assert_eq!(retweets_in_postgres(&app, id).await, (0, 0));
}

/// 64 users retweet one tweet at once on two processes, some twice at once, a third of them
/// undo it again meanwhile: `retweets_count` is the number of live retweets in the cache, in
/// Postgres and after a flush, and each user holds one retweet at most. A reader who follows
/// all of them (not the author) shows the tweet once after two job runners fanned the retweets
/// out at once, and still once, by the one retweet left, after all but the newest are undone at
/// once (each undo of the shown one shows the next, which may be being undone too).
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn sixty_four_concurrent_retweeters_count_exactly(db: PgPool) {
    let (a, b) = two_processes(db).await;
    let (_, ta) = a.quick_user("ann").await;
    let (rita, tr) = a.quick_user("rita").await;
    let id = a.tweet(&ta, "retweet me").await["id"].as_i64().unwrap();
    assert_eq!(retweets_of(&b, id, None).await.0, 0);
    let mut users = Vec::new();
    for i in 0..64 {
        let user = a.quick_user(&format!("rt{i}")).await;
        a.follow(&tr, user.0).await;
        users.push(user);
    }
    a.drain().await;
    let undone = |i: usize| i.is_multiple_of(3);
    let made = futures_util::future::join_all(users.iter().enumerate().map(|(i, (_, t))| {
        let app = if i % 2 == 0 { &a } else { &b };
        async move {
            let made = if i % 4 == 0 {
                // Twice at once: one retweet, answered 201 and 200.
                let (x, y) =
                    futures_util::future::join(retweet(app, t, id), retweet(app, t, id)).await;
                let mut statuses = [x.status, y.status];
                statuses.sort();
                assert_eq!(
                    statuses,
                    [StatusCode::OK, StatusCode::CREATED],
                    "{} / {}",
                    x.body,
                    y.body
                );
                assert_eq!(x.body["id"], y.body["id"], "{} / {}", x.body, y.body);
                x.body
            } else {
                let res = retweet(app, t, id).await;
                assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
                res.body
            };
            assert_eq!(made["retweeted_tweet"]["id"], id, "{made}");
            if undone(i) {
                assert_eq!(unretweet_deleted(app, t, id).await, 1);
            }
            made["id"].as_i64().unwrap()
        }
    }))
    .await;
    let live = (0..users.len()).filter(|i| !undone(*i)).count() as i64;
    assert_eq!(live, 42);
    for round in ["written through", "flushed"] {
        assert_eq!(retweets_of(&a, id, None).await.0, live, "{round}");
        assert_eq!(retweets_of(&b, id, None).await.0, live, "{round}");
        for (i, (user, t)) in users.iter().enumerate().take(8) {
            assert_eq!(
                retweets_of(&b, id, Some(t)).await.1,
                !undone(i),
                "{round}, {i}"
            );
            assert_eq!(
                tweets_count(&a, *user).await,
                i64::from(!undone(i)),
                "{round}, {i}"
            );
        }
        a.flush_cache().await;
    }
    assert_eq!(retweets_in_postgres(&a, id).await, (live, live));
    let per_user: i64 = sqlx::query_scalar(
        "select count(*) from (select user_id from tweets where retweeted_tweet_id = $1
                               group by user_id having count(*) > 1) s",
    )
    .bind(id)
    .fetch_one(a.db())
    .await
    .unwrap();
    assert_eq!(per_user, 0, "one retweet per user");

    // Two job runners at once fan the retweets out to rita: the tweet once, by a live retweet.
    futures_util::future::join(a.drain(), b.drain()).await;
    a.drain().await;
    let alive: Vec<(usize, i64)> = (made.iter().copied().enumerate())
        .filter(|(i, _)| !undone(*i))
        .collect();
    let shown = feed(&b, &tr, 5).await;
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(shown[0].retweeted, Some(id), "{shown:?}");
    assert!(
        alive.iter().any(|(_, rt)| *rt == shown[0].tweet),
        "{shown:?}"
    );
    // All but the newest retweet undone at once: rita shows the newest, once.
    let newest = alive.iter().map(|(_, rt)| *rt).max().unwrap();
    futures_util::future::join_all(alive.iter().filter(|(_, rt)| *rt != newest).map(|(i, _)| {
        let app = if i % 2 == 0 { &a } else { &b };
        let token = &users[*i].1;
        async move { assert_eq!(unretweet_deleted(app, token, id).await, 1) }
    }))
    .await;
    a.drain().await;
    // (newsfeed row, tweet, status, whether the tweet exists) of rita's newsfeed in Postgres.
    let rows: Vec<(i64, i64, Option<i64>, bool)> = sqlx::query_as(
        "select n.id, n.tweet_id, n.status_id, exists (select 1 from tweets t where t.id = n.tweet_id)
         from newsfeeds n where n.user_id = $1",
    )
    .bind(rita)
    .fetch_all(a.db())
    .await
    .unwrap();
    for round in ["written through", "flushed"] {
        let shown = feed(&b, &tr, 5).await;
        assert_eq!(
            shown.iter().map(|e| e.tweet).collect::<Vec<_>>(),
            vec![newest],
            "{round}: {shown:?}; rita's rows (id, tweet, status, tweet exists): {rows:?}"
        );
        assert_eq!(retweets_of(&a, id, None).await.0, 1, "{round}");
        a.flush_cache().await;
    }
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((rows[0].1, rows[0].2, rows[0].3), (newest, Some(id), true));
    // A cache step that did not confirm in time leaves its row to the relay, by design.
    a.relay().await;
    assert_eq!(a.outbox_rows().await, 0);
    assert_eq!(retweets_of(&b, id, None).await.0, 1);
}

/// A reader's newsfeed: a status shows once, by the first entry that reached it; undoing that
/// retweet shows the next one (another following's retweet, here) as a new entry on top, which
/// a refresh returns; deleting the original takes every retweet of it everywhere.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn undoing_the_shown_retweet_shows_the_next_one_on_top(db: PgPool) {
    let app = TestApp::new(db).await;
    let (ann, ta) = app.quick_user("ann").await;
    let (bob, tb) = app.quick_user("bob").await;
    let (cat, tc) = app.quick_user("cat").await;
    let (_, tr) = app.quick_user("rita").await; // follows bob and cat, not ann
    let (_, tf) = app.quick_user("fred").await; // follows ann and bob
    for who in [bob, cat] {
        app.follow(&tr, who).await;
    }
    for who in [ann, bob] {
        app.follow(&tf, who).await;
    }
    let s = app.tweet(&ta, "the status").await["id"].as_i64().unwrap();
    app.drain().await;
    let rb = new_retweet(&app, &tb, s).await;
    app.drain().await;
    let tweets = |entries: &[Entry]| entries.iter().map(|e| e.tweet).collect::<Vec<_>>();
    let rita = feed(&app, &tr, 2).await;
    assert_eq!(tweets(&rita), vec![rb]);
    assert_eq!(rita[0].retweeted, Some(s));
    assert_eq!(rita[0].author, bob);
    let fred = feed(&app, &tf, 2).await;
    assert_eq!(tweets(&fred), vec![s], "fred shows the original already");
    assert_eq!(fred[0].retweets_count, 1);
    assert_eq!(
        tweets(&feed(&app, &tb, 2).await),
        vec![rb],
        "bob's own newsfeed"
    );
    assert_eq!(
        page_all(&app, &format!("/api/tweets/?user_id={bob}"), None, 2).await,
        vec![rb]
    );

    let r1 = app.tweet(&tr, "rita's own").await["id"].as_i64().unwrap();
    let rc = new_retweet(&app, &tc, s).await;
    app.drain().await;
    let before = feed(&app, &tr, 2).await;
    assert_eq!(
        tweets(&before),
        vec![r1, rb],
        "cat's later retweet adds nothing"
    );
    assert_eq!(before[1], rita[0].counted(s, 2), "in place");
    assert_eq!(
        tweets(&feed(&app, &tc, 2).await),
        vec![rc],
        "cat's own newsfeed"
    );

    // bob takes his back: rita gets cat's, as a new entry above everything she held.
    assert_eq!(unretweet_deleted(&app, &tb, s).await, 1);
    let after = feed(&app, &tr, 2).await;
    assert_eq!(tweets(&after), vec![rc, r1]);
    assert_eq!(after[1], before[0]);
    assert!(after[0].at > before[0].at, "{after:?}");
    assert!(!before.iter().any(|e| e.id == after[0].id), "a new entry");
    assert_eq!(refresh(&app, &tr, &before[0].at).await, after[..1]);
    assert_eq!(
        feed(&app, &tf, 2).await,
        fred.iter().map(|e| e.counted(s, 1)).collect::<Vec<_>>(),
        "fred unchanged"
    );

    // bob retweets again (nothing for rita); cat undoes hers: rita gets bob's new one.
    let rb2 = retweet(&app, &tb, s).await;
    assert_eq!(rb2.status, StatusCode::CREATED, "{}", rb2.body);
    let rb2 = rb2.body["id"].as_i64().unwrap();
    app.drain().await;
    assert_eq!(
        feed(&app, &tr, 2).await,
        after.iter().map(|e| e.counted(s, 2)).collect::<Vec<_>>()
    );
    assert_eq!(unretweet_deleted(&app, &tc, s).await, 1);
    let last = feed(&app, &tr, 2).await;
    assert_eq!(tweets(&last), vec![rb2, r1]);
    assert!(last[0].at > after[0].at);
    app.flush_cache().await;
    assert_eq!(feed(&app, &tr, 1).await, last, "the same from Postgres");

    // Deleting the original deletes every retweet of it, everywhere.
    let res = app.delete(&format!("/api/tweets/{s}/"), Some(&ta)).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    for round in ["warm", "flushed"] {
        assert_eq!(tweets(&feed(&app, &tr, 2).await), vec![r1], "{round}");
        assert_eq!(feed(&app, &tf, 2).await, vec![], "{round}");
        assert_eq!(feed(&app, &tb, 2).await, vec![], "{round}");
        assert_eq!(tweets_count(&app, bob).await, 0, "{round}");
        let page = app.get(&format!("/api/tweets/?user_id={bob}"), None).await;
        assert_eq!(page.body["results"], json!([]), "{round}: {}", page.body);
        let res = app.get(&format!("/api/tweets/{rb2}/"), None).await;
        assert_eq!(res.status, StatusCode::NOT_FOUND, "{round}: {}", res.body);
        app.flush_cache().await;
    }
    let left: i64 = sqlx::query_scalar("select count(*) from tweets where retweeted_tweet_id = $1")
        .bind(s)
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(left, 0);
}

/// What the histories below know: the users, who follows whom (fixed), the live originals and
/// retweets, and every retweet ever made.
#[derive(Default)]
struct Model {
    users: Vec<i64>,
    /// `(reader, author)` indexes.
    follows: BTreeSet<(usize, usize)>,
    /// Live originals: id → author.
    originals: BTreeMap<i64, usize>,
    /// Live retweets: id → (retweeter, original).
    retweets: BTreeMap<i64, (usize, i64)>,
    /// Every retweet ever made: id → (retweeter, original).
    ever: HashMap<i64, (usize, i64)>,
}

impl Model {
    fn retweet_by(&self, user: usize, status: i64) -> Option<i64> {
        self.retweets
            .iter()
            .find(|(_, (u, s))| *u == user && *s == status)
            .map(|(id, _)| *id)
    }

    fn retweets_count(&self, status: i64) -> i64 {
        self.retweets.values().filter(|(_, s)| *s == status).count() as i64
    }

    /// Whether `reader`'s newsfeed gets what `author` writes: their own, or a followee's.
    fn reaches(&self, reader: usize, author: usize) -> bool {
        reader == author || self.follows.contains(&(reader, author))
    }

    /// The statuses `reader`'s newsfeed shows: each live original by the reader or a followee,
    /// or with a live retweet by the reader or a followee.
    fn statuses(&self, reader: usize) -> BTreeSet<i64> {
        self.originals
            .iter()
            .filter(|(id, author)| {
                self.reaches(reader, **author)
                    || (self.retweets.values()).any(|(u, s)| s == *id && self.reaches(reader, *u))
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// A user's own timeline: their live originals and retweets, by id.
    fn timeline(&self, user: usize) -> Vec<i64> {
        let mut ids: Vec<i64> = (self.originals.iter().map(|(id, a)| (*id, *a)))
            .chain(self.retweets.iter().map(|(id, (u, _))| (*id, *u)))
            .filter(|(_, a)| *a == user)
            .map(|(id, _)| id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// (a) no status twice, (b) no orphan and nothing deleted or from elsewhere, (c) every
    /// status it should show, with exact counts and `has_retweeted`.
    fn check(&self, reader: usize, got: &[Entry], ctx: &str) {
        let mut seen = HashSet::new();
        for e in got {
            assert!(
                seen.insert(e.status()),
                "{ctx}: status {} twice: {got:?}",
                e.status()
            );
            assert!(!e.orphan, "{ctx}: an orphaned retweet {e:?}");
            let author = match self.ever.get(&e.tweet) {
                Some((retweeter, original)) => {
                    assert_eq!(e.retweeted, Some(*original), "{ctx}: {e:?}");
                    assert!(
                        self.retweets.contains_key(&e.tweet),
                        "{ctx}: a deleted retweet {e:?}"
                    );
                    *retweeter
                }
                None => {
                    assert_eq!(e.retweeted, None, "{ctx}: {e:?}");
                    *self
                        .originals
                        .get(&e.tweet)
                        .unwrap_or_else(|| panic!("{ctx}: a deleted original {e:?}"))
                }
            };
            assert_eq!(e.author, self.users[author], "{ctx}: {e:?}");
            assert!(
                self.reaches(reader, author),
                "{ctx}: from someone not followed: {e:?}"
            );
            assert!(
                self.originals.contains_key(&e.status()),
                "{ctx}: the original is gone: {e:?}"
            );
            assert_eq!(
                e.retweets_count,
                self.retweets_count(e.status()),
                "{ctx}: {e:?}"
            );
            assert_eq!(
                e.has_retweeted,
                self.retweet_by(reader, e.status()).is_some(),
                "{ctx}: {e:?}"
            );
        }
        let want = self.statuses(reader);
        let have: BTreeSet<i64> = seen.into_iter().collect();
        assert_eq!(
            have,
            want,
            "{ctx}: missing {:?}, extra {:?}",
            want.difference(&have).collect::<Vec<_>>(),
            have.difference(&want).collect::<Vec<_>>()
        );
    }
}

/// The histories' configuration: a cached window of 8 entries (pages of 3 read past it, from
/// Postgres), the one-tweet or the batched fan-out, and with `pull` authors of more than two
/// followers pulled at read time (hybrid timelines).
fn history_config(c: &mut Config, batch_jobs: u32, pull: bool) {
    c.cache_list_limit = 8;
    c.fanout_batch_jobs = batch_jobs;
    if pull {
        c.fanout_pull_above = 2;
        c.fanout_pull_below = Some(1);
        c.fanout_pull_settle_ms = 10;
    }
}

/// What the checks saw (printed, to see what a seed exercised).
#[derive(Debug, Default)]
struct Seen {
    /// Entries read (each reader's newsfeed, once per check).
    entries: usize,
    /// Of which retweets.
    retweets: usize,
    /// New entries of a status the reader held by another entry at the check before (the
    /// next one shown after an undo).
    next_shown: usize,
}

/// Reads every reader's whole newsfeed on `apps` (the first one twice, at two page sizes) and
/// checks it against the model; each reader's entries must be identical on every app, and
/// against `held` (what the reader got at the previous check): an entry still live keeps its
/// place and, with `on_top` (no follow since), every other one is newer than all it held, and
/// a refresh from the newest one held returns exactly those.
async fn check_feeds(
    apps: &[&TestApp],
    tokens: &[String],
    model: &Model,
    held: &mut [Vec<Entry>],
    seen: &mut Seen,
    (ctx, on_top): (&str, bool),
) {
    for (r, token) in tokens.iter().enumerate() {
        let ctx = format!("{ctx}, reader {r}");
        let got = feed(apps[0], token, 3).await;
        // Evidence for a failure: newsfeed rows whose tweet is gone (they hold the status).
        let dangling: Vec<(i64, i64, Option<i64>)> = sqlx::query_as(
            "select n.id, n.tweet_id, n.status_id from newsfeeds n
             where n.user_id = $1 and not exists (select 1 from tweets t where t.id = n.tweet_id)",
        )
        .bind(model.users[r])
        .fetch_all(apps[0].db())
        .await
        .unwrap();
        let ctx = format!("{ctx}; rows (id, tweet, status) naming deleted tweets: {dangling:?}");
        model.check(r, &got, &ctx);
        let places: HashSet<_> = got.iter().map(Entry::place).collect();
        let live = |e: &Entry| {
            model.originals.contains_key(&e.tweet) || model.retweets.contains_key(&e.tweet)
        };
        for e in held[r].iter().filter(|e| live(e)) {
            assert!(
                places.contains(&e.place()),
                "{ctx}: held {e:?} moved or left: {got:?}"
            );
        }
        if let Some(newest) = held[r].first().filter(|_| on_top) {
            let old: HashSet<_> = held[r].iter().map(Entry::place).collect();
            let new: Vec<Entry> = got
                .iter()
                .filter(|e| !old.contains(&e.place()))
                .cloned()
                .collect();
            let statuses: HashSet<i64> = held[r].iter().map(Entry::status).collect();
            seen.next_shown += new
                .iter()
                .filter(|e| statuses.contains(&e.status()))
                .count();
            for e in &new {
                assert!(
                    e.at > newest.at,
                    "{ctx}: {e:?} arrived below {newest:?}: {got:?}"
                );
            }
            assert_eq!(
                refresh(apps[0], token, &newest.at).await,
                new,
                "{ctx}: refresh"
            );
        }
        assert_eq!(feed(apps[0], token, 5).await, got, "{ctx}: read again");
        for (i, app) in apps.iter().enumerate().skip(1) {
            assert_eq!(feed(app, token, 3).await, got, "{ctx}: on process {i}");
        }
        seen.entries += got.len();
        seen.retweets += got.iter().filter(|e| e.retweeted.is_some()).count();
        held[r] = got;
    }
}

/// Random histories of posts, retweets (some of a retweet), undos (some at once with other
/// retweets of the same tweet) and deletes of originals among six users with fixed random
/// follows (one-tweet or batched fan-out, with or without pulled authors; fan-out runs after
/// some steps only): every reader's whole newsfeed shows each status it should exactly once,
/// nothing deleted and no orphan, entries never move and new ones come on top, on two
/// processes, warm, after flushes and with Redis down; timelines and counts follow. A few late
/// follows at the end (their backfill) keep all of it but "on top".
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_status_appears_once_in_a_newsfeed_over_random_histories(db: PgPool) {
    let (seed, mut rng) = seeded_rng("CHIRP_RETWEETS_SEED", "retweet histories");
    let batch_jobs = *[1u32, 16].choose(&mut rng).unwrap();
    let pull = rng.random_bool(0.5);
    let setup = format!("seed {seed}, fanout_batch_jobs {batch_jobs}, pull {pull}");
    let a = TestApp::with(db.clone(), |c| history_config(c, batch_jobs, pull)).await;
    let prefix = a.prefix.clone();
    let b = TestApp::with(db.clone(), |c| {
        history_config(c, batch_jobs, pull);
        c.redis_prefix = prefix;
    })
    .await;
    let mut model = Model::default();
    let mut tokens = Vec::new();
    for i in 0..6 {
        let (id, token) = a.quick_user(&format!("user{i}")).await;
        model.users.push(id);
        tokens.push(token);
    }
    let n = tokens.len();
    for (r, token) in tokens.iter().enumerate() {
        for w in 0..n {
            if r != w && rng.random_bool(0.4) {
                a.follow(token, model.users[w]).await;
                model.follows.insert((r, w));
            }
        }
    }
    a.drain().await;
    let mut history: Vec<String> = Vec::new();
    let mut deleted: Vec<i64> = Vec::new();
    let mut held: Vec<Vec<Entry>> = vec![Vec::new(); n];
    let mut seen = Seen::default();
    for step in 0..120 {
        let live: Vec<i64> = model.originals.keys().copied().collect();
        // Half the time a retweeted status (several retweets of one status, undone, deleted).
        let hot: Vec<i64> = (model.retweets.values().map(|(_, s)| *s)).collect();
        let pick = |rng: &mut rand::rngs::StdRng| match rng.random_bool(0.5) && !hot.is_empty() {
            true => hot.choose(rng),
            false => live.choose(rng),
        };
        let roll: f64 = rng.random();
        let ctx = |history: &[String]| format!("{setup}, step {step}: {}", history.join("; "));
        if live.len() < 3 || roll < 0.15 {
            let u = rng.random_range(0..n);
            let id = a.tweet(&tokens[u], &format!("t{step}")).await["id"]
                .as_i64()
                .unwrap();
            model.originals.insert(id, u);
            history.push(format!("u{u} posts {id}"));
        } else if roll < 0.55 {
            let u = rng.random_range(0..n);
            if rng.random_bool(0.05) && !deleted.is_empty() {
                let gone = *deleted.choose(&mut rng).unwrap();
                history.push(format!("u{u} retweets deleted {gone}"));
                let res = retweet(&a, &tokens[u], gone).await;
                assert_eq!(
                    res.status,
                    StatusCode::NOT_FOUND,
                    "{}: {}",
                    ctx(&history),
                    res.body
                );
                let res = unretweet(&a, &tokens[u], gone).await;
                assert_eq!(
                    res.status,
                    StatusCode::NOT_FOUND,
                    "{}: {}",
                    ctx(&history),
                    res.body
                );
            } else {
                let s = *pick(&mut rng).unwrap();
                let via: Vec<i64> = (model.retweets.iter())
                    .filter(|(_, (_, o))| *o == s)
                    .map(|(id, _)| *id)
                    .collect();
                let target = match via.choose(&mut rng) {
                    Some(rt) if rng.random_bool(0.3) => *rt,
                    _ => s,
                };
                let had = model.retweet_by(u, s);
                let res = retweet(&a, &tokens[u], target).await;
                let id = res.body["id"].as_i64();
                history.push(format!("u{u} retweets {s} via {target}: {id:?}"));
                let ctx = ctx(&history);
                match had {
                    Some(had) => {
                        assert_eq!(res.status, StatusCode::OK, "{ctx}: {}", res.body);
                        assert_eq!(id, Some(had), "{ctx}: {}", res.body);
                    }
                    None => assert_eq!(res.status, StatusCode::CREATED, "{ctx}: {}", res.body),
                }
                assert_eq!(res.body["retweeted_tweet"]["id"], s, "{ctx}: {}", res.body);
                assert_eq!(res.body["retweeted_tweet"]["has_retweeted"], true, "{ctx}");
                let id = id.unwrap();
                model.retweets.insert(id, (u, s));
                model.ever.insert(id, (u, s));
                assert_eq!(
                    res.body["retweeted_tweet"]["retweets_count"],
                    model.retweets_count(s),
                    "{ctx}: {}",
                    res.body
                );
            }
        } else if roll < 0.63 {
            // At once: all but one of a status's retweeters undo it, others retweet it.
            let s = *pick(&mut rng).unwrap();
            let mut undo: Vec<usize> = (model.retweets.values())
                .filter(|(_, o)| *o == s)
                .map(|(u, _)| *u)
                .collect();
            if !undo.is_empty() {
                undo.remove(rng.random_range(0..undo.len()));
            }
            let new: Vec<usize> = (0..n)
                .filter(|u| model.retweet_by(*u, s).is_none() && rng.random_bool(0.5))
                .collect();
            let undos = futures_util::future::join_all(undo.iter().map(|u| {
                let token = &tokens[*u];
                let a = &a;
                async move { unretweet_deleted(a, token, s).await }
            }));
            let retweets = futures_util::future::join_all(new.iter().map(|u| {
                let token = &tokens[*u];
                let a = &a;
                async move { retweet(a, token, s).await }
            }));
            let (undone, made) = futures_util::future::join(undos, retweets).await;
            history.push(format!(
                "at once on {s}: {undo:?} unretweet, {new:?} retweet"
            ));
            let ctx = ctx(&history);
            assert!(undone.iter().all(|d| *d == 1), "{ctx}: {undone:?}");
            for u in undo {
                let had = model.retweet_by(u, s).unwrap();
                model.retweets.remove(&had);
            }
            for (u, res) in new.into_iter().zip(made) {
                assert_eq!(res.status, StatusCode::CREATED, "{ctx}: {}", res.body);
                let id = res.body["id"].as_i64().unwrap();
                model.retweets.insert(id, (u, s));
                model.ever.insert(id, (u, s));
            }
        } else if roll < 0.9 {
            let (u, s) = match model
                .retweets
                .values()
                .copied()
                .collect::<Vec<_>>()
                .choose(&mut rng)
            {
                Some(pair) if rng.random_bool(0.8) => *pair,
                _ => (rng.random_range(0..n), *live.choose(&mut rng).unwrap()),
            };
            let had = model.retweet_by(u, s);
            let deleted_now = unretweet_deleted(&a, &tokens[u], s).await;
            history.push(format!("u{u} unretweets {s}: {had:?}"));
            assert_eq!(deleted_now, i64::from(had.is_some()), "{}", ctx(&history));
            if let Some(had) = had {
                model.retweets.remove(&had);
            }
        } else {
            let s = *pick(&mut rng).unwrap();
            let author = model.originals[&s];
            let res = a
                .delete(&format!("/api/tweets/{s}/"), Some(&tokens[author]))
                .await;
            history.push(format!("u{author} deletes {s}"));
            assert_eq!(
                res.status,
                StatusCode::OK,
                "{}: {}",
                ctx(&history),
                res.body
            );
            model.originals.remove(&s);
            model.retweets.retain(|_, (_, o)| *o != s);
            deleted.push(s);
        }
        if rng.random_bool(0.5) {
            a.drain().await;
        }
        if step % 6 == 5 {
            a.drain().await;
            if step % 18 == 17 {
                a.flush_cache().await;
            }
            let ctx = format!("{}, follows {:?}", ctx(&history), model.follows);
            check_feeds(
                &[&a, &b],
                &tokens,
                &model,
                &mut held,
                &mut seen,
                (&ctx, true),
            )
            .await;
        }
    }
    a.drain().await;
    // Late follows: their backfill brings the followee's tweets and retweets (at their own
    // times, below what the reader held), each status still once. A backfill copies the
    // followee's newest `cache_list_limit` (8) tweets, so only followees with at most that
    // many live tweets and retweets are followed late (the model expects all of them).
    for _ in 0..4 {
        let (r, w) = (rng.random_range(0..n), rng.random_range(0..n));
        if r != w && model.timeline(w).len() <= 8 && model.follows.insert((r, w)) {
            a.follow(&tokens[r], model.users[w]).await;
            history.push(format!("u{r} follows u{w}"));
        }
    }
    a.drain().await;
    let ctx = format!(
        "{setup}, end: {}, follows {:?}",
        history.join("; "),
        model.follows
    );
    let late = format!("{ctx}, after the late follows");
    check_feeds(
        &[&a, &b],
        &tokens,
        &model,
        &mut held,
        &mut seen,
        (&late, false),
    )
    .await;
    for round in ["warm", "flushed"] {
        let ctx = format!("{ctx}, {round}");
        check_feeds(
            &[&a, &b],
            &tokens,
            &model,
            &mut held,
            &mut seen,
            (&ctx, true),
        )
        .await;
        for (u, user) in model.users.iter().enumerate() {
            let mut got = page_all(&b, &format!("/api/tweets/?user_id={user}"), None, 3).await;
            got.sort_unstable();
            assert_eq!(got, model.timeline(u), "{ctx}: u{u}'s timeline");
            assert_eq!(
                tweets_count(&b, *user).await,
                got.len() as i64,
                "{ctx}: u{u}"
            );
        }
        for &s in model.originals.keys() {
            let want = model.retweets_count(s);
            assert_eq!(retweets_of(&b, s, None).await.0, want, "{ctx}: tweet {s}");
            assert_eq!(
                retweets_in_postgres(&a, s).await,
                (want, want),
                "{ctx}: tweet {s}"
            );
        }
        a.flush_cache().await;
    }
    // With Redis down: a third process reads Postgres only.
    let proxy = Proxy::start().await;
    let c = TestApp::with(db, |c| {
        history_config(c, batch_jobs, pull);
        c.redis_url = proxy.url();
    })
    .await;
    proxy.set_up(false);
    check_feeds(
        &[&c],
        &tokens,
        &model,
        &mut held,
        &mut seen,
        (&format!("{ctx}, Redis down"), true),
    )
    .await;
    proxy.set_up(true);
    eprintln!("{setup}: {seen:?}");
}

/// A pulled author's tweet (hybrid timelines: read from the author at read time, no newsfeed
/// rows) retweeted by an account its reader follows, by fan-out or by the backfill of a later
/// follow: the reader's newsfeed shows it once.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_pulled_tweet_retweeted_by_a_followee_shows_once(db: PgPool) {
    let app = TestApp::with(db, |c| {
        c.fanout_pull_above = 2;
        c.fanout_pull_below = Some(1);
        c.fanout_pull_settle_ms = 10;
    })
    .await;
    let (star, ts) = app.quick_user("star").await;
    let (bob, tb) = app.quick_user("bob").await;
    let (cat, tc) = app.quick_user("cat").await;
    let (_, tr) = app.quick_user("rita").await; // follows star, bob; cat later
    for i in 0..3 {
        let (_, fan) = app.quick_user(&format!("fan{i}")).await;
        app.follow(&fan, star).await;
    }
    app.follow(&tr, star).await;
    app.follow(&tr, bob).await;
    app.drain().await;
    // The first compose above the threshold makes the star a pull source, the next one starts
    // the settle time (both fanned out); the third is pulled.
    app.tweets(&ts, "pushed", 2).await;
    app.drain().await;
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let s = app.tweet(&ts, "pulled").await["id"].as_i64().unwrap();
    let t = app.tweet(&ts, "pulled too").await["id"].as_i64().unwrap();
    app.drain().await;
    let pulled: Vec<bool> =
        sqlx::query_scalar("select pulled from tweets where id = any($1) order by id")
            .bind(vec![s, t])
            .fetch_all(app.db())
            .await
            .unwrap();
    assert_eq!(pulled, vec![true, true], "the star's tweets are pulled");
    // Fan-out: bob's retweet of s reaches rita, who pulls s.
    let res = retweet(&app, &tb, s).await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    // Backfill: cat retweets t, then rita follows cat.
    let res = retweet(&app, &tc, t).await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    app.drain().await;
    app.follow(&tr, cat).await;
    app.drain().await;
    for round in ["warm", "flushed"] {
        let got = feed(&app, &tr, 3).await;
        let statuses: Vec<i64> = got.iter().map(Entry::status).collect();
        for id in [s, t] {
            assert_eq!(
                statuses.iter().filter(|x| **x == id).count(),
                1,
                "{round}: tweet {id} (s {s} by bob's fan-out, t {t} by cat's backfill): {got:?}"
            );
        }
        app.flush_cache().await;
    }
}

async fn relation(app: &TestApp, token: &str, target: i64, action: &str) -> Value {
    let uri = format!("/api/users/{target}/{action}/");
    app.post_expecting(StatusCode::OK, &uri, Some(token), json!({}))
        .await
}

/// The actors of `token`'s "retweeted your tweet" notifications, newest first.
async fn retweeted_by(app: &TestApp, token: &str) -> Vec<i64> {
    let res = app
        .get("/api/notifications/?page_size=50", Some(token))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    (res.body["results"].as_array().unwrap().iter())
        .filter(|n| n["verb"] == "retweeted your tweet")
        .map(|n| n["actor"]["id"].as_i64().unwrap())
        .collect()
}

/// Muting X hides X's retweets and the retweets of X's tweets from the muter's newsfeed (on
/// another process, at once, at any page size, and from Postgres), and X's retweet of the
/// muter's tweet from the muter's notifications; unmuting brings them all back in place.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_muted_accounts_retweets_are_hidden(db: PgPool) {
    let (a, b) = two_processes(db).await;
    let (_, tv) = a.quick_user("viv").await; // the muter: follows xavier and yola
    let (x, tx) = a.quick_user("xavier").await; // a followee who retweets
    let (y, ty) = a.quick_user("yola").await; // a followee who retweets mallory
    let (m, tm) = a.quick_user("mallory").await; // not followed
    let (_, tz) = a.quick_user("zed").await; // not followed
    a.follow(&tv, x).await;
    a.follow(&tv, y).await;
    let v1 = a.tweet(&tv, "viv's").await["id"].as_i64().unwrap();
    let z1 = a.tweet(&tz, "zed's").await["id"].as_i64().unwrap();
    let m1 = a.tweet(&tm, "mallory's").await["id"].as_i64().unwrap();
    let x1 = a.tweet(&tx, "xavier's").await["id"].as_i64().unwrap();
    let y1 = a.tweet(&ty, "yola's").await["id"].as_i64().unwrap();
    a.drain().await;
    let xr = new_retweet(&a, &tx, z1).await;
    let yr = new_retweet(&a, &ty, m1).await;
    a.drain().await;
    let tweets = |entries: &[Entry]| entries.iter().map(|e| e.tweet).collect::<Vec<_>>();
    let all = feed(&b, &tv, 2).await;
    assert_eq!(tweets(&all), vec![yr, xr, y1, x1, v1]);

    assert_eq!(relation(&a, &tv, x, "mute").await["muting"], true);
    // xavier's retweet of viv's own tweet: no entry (viv's newsfeed shows it), and no
    // notification while xavier is muted.
    let xv = retweet(&a, &tx, v1).await;
    assert_eq!(xv.status, StatusCode::CREATED, "{}", xv.body);
    a.drain().await;
    assert_eq!(retweeted_by(&b, &tv).await, Vec::<i64>::new(), "muted");
    for page_size in [1, 2, 5] {
        let got = tweets(&feed(&b, &tv, page_size).await);
        assert_eq!(
            got,
            vec![yr, y1, v1],
            "page size {page_size}: xavier's retweet"
        );
    }
    assert_eq!(relation(&a, &tv, m, "mute").await["muting"], true);
    for round in ["at once", "flushed"] {
        for page_size in [1, 3] {
            let got = tweets(&feed(&b, &tv, page_size).await);
            assert_eq!(
                got,
                vec![y1, v1],
                "{round}, {page_size}: a retweet of mallory's"
            );
            let ids: Vec<i64> = page_tweets(&a, "/api/newsfeeds/", Some(&tv), page_size)
                .await
                .iter()
                .map(|t| t["id"].as_i64().unwrap())
                .collect();
            assert_eq!(ids, vec![y1, v1], "{round}, {page_size}");
        }
        b.flush_cache().await;
    }
    // Unmuting brings them back, in place.
    assert_eq!(relation(&b, &tv, x, "unmute").await["muting"], false);
    assert_eq!(relation(&b, &tv, m, "unmute").await["muting"], false);
    let want: Vec<Entry> = all.iter().map(|e| e.counted(v1, 1)).collect();
    assert_eq!(feed(&a, &tv, 2).await, want);
    assert_eq!(feed(&b, &tv, 1).await, want);
    assert_eq!(retweeted_by(&a, &tv).await, vec![x]);
}

/// A like, a comment and a reply aimed at a retweet go to the tweet it retweets (Twitter's and
/// Mastodon's rule: a client shows that tweet's counts on a retweet's item), and a cancel of
/// the like through the retweet takes it back.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_like_comment_or_reply_to_a_retweet_goes_to_its_tweet(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, ta) = app.quick_user("ann").await;
    let (_, tb) = app.quick_user("bob").await;
    let (_, tc) = app.quick_user("cat").await;
    let original = app.tweet(&ta, "the tweet").await["id"].as_i64().unwrap();
    let rt = new_retweet(&app, &tb, original).await;
    let like = json!({"content_type": "tweet", "object_id": rt});
    let res = app.post("/api/likes/", Some(&tc), like.clone()).await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    let res = app
        .post(
            "/api/comments/",
            Some(&tc),
            json!({"tweet_id": rt, "content": "nice"}),
        )
        .await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    assert_eq!(res.body["tweet_id"], original, "{}", res.body);
    let reply = app
        .post(
            "/api/tweets/",
            Some(&tc),
            json!({"content": "a reply", "in_reply_to_tweet_id": rt}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    assert_eq!(
        reply.body["in_reply_to_tweet_id"], original,
        "{}",
        reply.body
    );
    for round in ["warm", "flushed"] {
        let tweet = detail(&app, original, Some(&tc)).await;
        assert_eq!(
            (
                &tweet["likes_count"],
                &tweet["comments_count"],
                &tweet["replies_count"],
                &tweet["has_liked"]
            ),
            (&json!(1), &json!(1), &json!(1), &json!(true)),
            "{round}: {tweet}"
        );
        let retweet = detail(&app, rt, Some(&tc)).await;
        assert_eq!(retweet["likes_count"], 0, "{round}: {retweet}");
        assert_eq!(retweet["comments_count"], 0, "{round}: {retweet}");
        assert_eq!(retweet["retweeted_tweet"]["likes_count"], 1, "{round}");
        app.flush_cache().await;
    }
    let res = app.post("/api/likes/cancel/", Some(&tc), like).await;
    assert!(res.status.is_success(), "{}", res.body);
    let tweet = detail(&app, original, Some(&tc)).await;
    assert_eq!(
        (&tweet["likes_count"], &tweet["has_liked"]),
        (&json!(0), &json!(false))
    );
}

/// An unfollow takes the unfollowed account's entries out of the newsfeed; a tweet one of them
/// showed (by a retweet, or by itself) that another followee still brings by a retweet comes
/// back as a new entry on top, which a refresh from what the client holds returns.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn an_unfollow_shows_the_next_retweet_of_what_it_took_away(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, tx) = app.quick_user("xav").await;
    let (ann, ta) = app.quick_user("ann").await;
    let (bob, tb) = app.quick_user("bob").await;
    let (_, tr) = app.quick_user("rita").await;
    app.follow(&tr, ann).await;
    app.follow(&tr, bob).await;
    let s = app.tweet(&tx, "by someone rita does not follow").await["id"]
        .as_i64()
        .unwrap();
    let t = app.tweet(&ta, "ann's own").await["id"].as_i64().unwrap();
    let ann_s = new_retweet(&app, &ta, s).await;
    new_retweet(&app, &tb, s).await;
    new_retweet(&app, &tb, t).await;
    app.drain().await;
    let before = feed(&app, &tr, 10).await;
    let statuses: Vec<(i64, i64)> = before.iter().map(|e| (e.tweet, e.status())).collect();
    assert_eq!(statuses, vec![(ann_s, s), (t, t)], "{before:?}");
    let res = app
        .post(
            &format!("/api/friendships/{ann}/unfollow/"),
            Some(&tr),
            json!({}),
        )
        .await;
    assert!(res.status.is_success(), "{}", res.body);
    app.drain().await;
    for round in ["warm", "flushed"] {
        let after = feed(&app, &tr, 10).await;
        let shown: Vec<(i64, i64)> = after.iter().map(|e| (e.author, e.status())).collect();
        assert_eq!(shown, vec![(bob, t), (bob, s)], "{round}: {after:?}");
        assert!(after.iter().all(|e| e.at > before[0].at), "{round}: on top");
        let refreshed = refresh(&app, &tr, &before[0].at).await;
        assert_eq!(refreshed, after, "{round}");
        app.flush_cache().await;
    }
}

/// Waits (up to 10 s) until some transaction of this test's database waits for a lock of
/// `kind` (`pg_locks.locktype`; `None`: any).
async fn wait_for_lock_wait(db: &PgPool, kind: Option<&str>) {
    for _ in 0..1000 {
        let waiting: i64 = sqlx::query_scalar(
            // This test's database only: `pg_locks` lists every database's, and a lock wait of
            // a test running beside this one let the script go on before the undo waited (the
            // test then hung in a cycle through its own script, seen under load).
            "select count(*) from pg_locks l join pg_stat_activity a on a.pid = l.pid
             where not l.granted and a.datname = current_database()
               and ($1::text is null or l.locktype = $1)",
        )
        .bind(kind)
        .fetch_one(db)
        .await
        .expect("pg_locks");
        if waiting > 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("nobody waited for a {kind:?} lock");
}

/// An undo's reveal meets a candidate that was retweeted after the undo took the candidates'
/// followers locks, while an unfollow of that candidate (which holds its followers lock
/// exclusively, then moves its users' counts) waits for the undo's author's row: the undo must
/// not wait in that cycle (Postgres kills one side: a 500), but roll back and try again.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn an_undo_meeting_a_new_retweeters_unfollow_tries_again(db: PgPool) {
    let app = TestApp::new(db.clone()).await;
    let (_, to) = app.quick_user("olga").await;
    let (ann, ta) = app.quick_user("ann").await;
    let (cat, tc) = app.quick_user("cat").await;
    let (_, tr) = app.quick_user("rita").await;
    app.follow(&tr, ann).await;
    app.follow(&tr, cat).await;
    let s = app.tweet(&to, "the status").await["id"].as_i64().unwrap();
    let by_ann = new_retweet(&app, &ta, s).await;
    app.drain().await;
    let before = feed(&app, &tr, 10).await;
    assert_eq!(before.iter().map(|e| e.tweet).collect::<Vec<_>>(), [by_ann]);

    // Ann's row held: her undo takes the candidates' locks (olga's and ann's) and waits.
    let mut row = db.begin().await.unwrap();
    sqlx::query("select 1 from users where id = $1 for update")
        .bind(ann)
        .execute(&mut *row)
        .await
        .unwrap();
    let undo = unretweet(&app, &ta, s);
    let (app_, db_, tc) = (&app, &db, &tc);
    let script = async move {
        let (app, db) = (app_, db_);
        wait_for_lock_wait(db, None).await;
        // Cat retweets it meanwhile: a candidate whose lock the undo does not hold.
        let by_cat = new_retweet(app, tc, s).await;
        // An unfollow of cat begins: cat's followers lock, exclusively.
        let mut unfollow = db.begin().await.unwrap();
        sqlx::query("select pg_advisory_xact_lock(hashtextextended('followers:' || $1, 0))")
            .bind(cat)
            .execute(&mut *unfollow)
            .await
            .unwrap();
        row.commit().await.unwrap();
        // The undo reaches cat's lock (in its reveal, or first thing in its next try).
        wait_for_lock_wait(db, Some("advisory")).await;
        // The unfollow moves its users' counts: ann's row, which a waiting reveal holds.
        sqlx::query("update users set followers_count = followers_count where id = $1")
            .bind(ann)
            .execute(&mut *unfollow)
            .await
            .unwrap();
        unfollow.commit().await.unwrap();
        by_cat
    };
    // A broken assumption about the undo's lock order is a cycle through this script: fail
    // instead of hanging (it once hung CI for 30 minutes).
    let both = futures_util::future::join(undo, script);
    let (undone, by_cat) = tokio::time::timeout(std::time::Duration::from_secs(60), both)
        .await
        .expect("the undo and the script waited for each other");
    assert_eq!(undone.status, StatusCode::OK, "{}", undone.body);
    assert_eq!(undone.body["deleted"], 1, "{}", undone.body);
    app.drain().await;
    for round in ["warm", "flushed"] {
        let after = feed(&app, &tr, 10).await;
        let shown: Vec<i64> = after.iter().map(|e| e.tweet).collect();
        assert_eq!(shown, [by_cat], "{round}: cat's retweet is the next one");
        assert!(after[0].at > before[0].at, "{round}: on top");
        app.flush_cache().await;
    }
}

/// Runs `write` with this process's cache steps skipped, as a process stopped right after its
/// commits would (the outbox rows stay for the relay).
async fn with_cache_steps_skipped<T>(
    app: &TestApp,
    write: impl std::future::Future<Output = T>,
) -> T {
    app.state
        .cache
        .set_after_commit(chirp::cache::AfterCommit::Crash);
    let out = write.await;
    app.state
        .cache
        .set_after_commit(chirp::cache::AfterCommit::Apply);
    out
}

/// Asserts that `token`'s newsfeed shows `expected` (`(tweet, status)`, newest first) before
/// the relay applies the skipped cache steps, after it, and after a flush.
async fn assert_shown_through_the_relay(app: &TestApp, token: &str, expected: &[(i64, i64)]) {
    for round in ["before the relay", "after the relay", "flushed"] {
        let after = feed(app, token, 10).await;
        let shown: Vec<(i64, i64)> = after.iter().map(|e| (e.tweet, e.status())).collect();
        assert_eq!(shown, expected, "{round}: {after:?}");
        if round == "before the relay" {
            app.relay().await;
        } else {
            app.flush_cache().await;
        }
    }
}

/// An unfollow whose cache step never ran (its process stopped after the commit) leaves the
/// retweet it took away in the cached newsfeed until the relay; a follow that brings the same
/// tweet back meanwhile must not be merged beside it (the history checker found the status
/// twice on one page). The removal's mark makes the follow's merge drop the list instead.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_removal_that_has_not_reached_the_cache_lets_no_status_in_twice(db: PgPool) {
    let app = TestApp::new(db).await;
    let (olga, to) = app.quick_user("olga").await;
    let (fred, tf) = app.quick_user("fred").await;
    let (_, tr) = app.quick_user("rita").await;
    app.follow(&tr, fred).await;
    let s = app.tweet(&to, "the status").await["id"].as_i64().unwrap();
    let by_fred = new_retweet(&app, &tf, s).await;
    app.drain().await;
    let before = feed(&app, &tr, 10).await;
    assert_eq!(
        before.iter().map(|e| e.tweet).collect::<Vec<_>>(),
        [by_fred]
    );

    let res = app
        .post(
            &format!("/api/friendships/{fred}/unfollow/"),
            Some(&tr),
            json!({}),
        )
        .await;
    assert!(res.status.is_success(), "{}", res.body);
    with_cache_steps_skipped(&app, app.drain()).await; // the unmerge commits, no cache step
    app.follow(&tr, olga).await;
    app.drain().await; // the backfill brings the tweet itself
    assert_shown_through_the_relay(&app, &tr, &[(s, s)]).await;
}

/// As above for an undo whose cache step never ran: another followee's later retweet of the
/// same tweet must not be merged beside the undone one.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn an_undo_that_has_not_reached_the_cache_lets_no_status_in_twice(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, to) = app.quick_user("olga").await;
    let (fred, tf) = app.quick_user("fred").await;
    let (gus, tg) = app.quick_user("gus").await;
    let (_, tr) = app.quick_user("rita").await;
    app.follow(&tr, fred).await;
    app.follow(&tr, gus).await;
    let s = app.tweet(&to, "the status").await["id"].as_i64().unwrap();
    let by_fred = new_retweet(&app, &tf, s).await;
    app.drain().await;
    let before = feed(&app, &tr, 10).await;
    assert_eq!(
        before.iter().map(|e| e.tweet).collect::<Vec<_>>(),
        [by_fred]
    );

    let undone = with_cache_steps_skipped(&app, unretweet_deleted(&app, &tf, s)).await;
    assert_eq!(undone, 1);
    let by_gus = new_retweet(&app, &tg, s).await;
    app.drain().await;
    assert_shown_through_the_relay(&app, &tr, &[(by_gus, s)]).await;
}

/// As above with a second unfollow whose cache step did run between the two: its removal must
/// not vouch for a list that still lacks the first one.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_later_removal_does_not_vouch_for_one_that_has_not_reached_the_cache(db: PgPool) {
    let app = TestApp::new(db).await;
    let (olga, to) = app.quick_user("olga").await;
    let (fred, tf) = app.quick_user("fred").await;
    let (gus, tg) = app.quick_user("gus").await;
    let (_, tr) = app.quick_user("rita").await;
    app.follow(&tr, fred).await;
    app.follow(&tr, gus).await;
    let s = app.tweet(&to, "the status").await["id"].as_i64().unwrap();
    let t = app.tweet(&to, "another").await["id"].as_i64().unwrap();
    let by_fred = new_retweet(&app, &tf, s).await;
    let by_gus = new_retweet(&app, &tg, t).await;
    app.drain().await;
    let before = feed(&app, &tr, 10).await;
    assert_eq!(
        before.iter().map(|e| e.tweet).collect::<Vec<_>>(),
        [by_gus, by_fred]
    );
    let unfollow = |who: i64| {
        let uri = format!("/api/friendships/{who}/unfollow/");
        let app = &app;
        let tr = &tr;
        async move {
            let res = app.post(&uri, Some(tr), json!({})).await;
            assert!(res.status.is_success(), "{}", res.body);
        }
    };
    unfollow(fred).await;
    with_cache_steps_skipped(&app, app.drain()).await; // fred's unmerge, no cache step
    unfollow(gus).await;
    app.drain().await; // gus's unmerge reaches the cache
    app.follow(&tr, olga).await;
    app.drain().await; // the backfill brings both tweets themselves
    assert_shown_through_the_relay(&app, &tr, &[(t, t), (s, s)]).await;
}

/// A follow's backfill locks the tweets it copies before the follower's head, the order of
/// every writer: taken the other way round, it held the head and waited for a retweet's row
/// while that retweet's undo held the row and waited for the head (a deadlock, a 500 for the
/// undo; the history checker's third 10-minute run on 2026-11-29).
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_backfill_locks_the_tweets_it_copies_before_the_followers_head(db: PgPool) {
    let app = TestApp::new(db.clone()).await;
    let (_, to) = app.quick_user("olga").await;
    let (fred, tf) = app.quick_user("fred").await;
    let (rita, tr) = app.quick_user("rita").await;
    let s = app.tweet(&to, "the status").await["id"].as_i64().unwrap();
    let by_fred = new_retweet(&app, &tf, s).await;
    app.tweet(&tr, "rita's own").await; // rita's newsfeed has a head
    app.drain().await;
    app.follow(&tr, fred).await;

    // Rita's head held: the backfill waits for it.
    let mut head = db.begin().await.unwrap();
    sqlx::query("select 1 from feed_heads where user_id = $1 for update")
        .bind(rita)
        .execute(&mut *head)
        .await
        .unwrap();
    let backfill = app.drain();
    let probe = async {
        wait_for_lock_wait(&db, None).await;
        // What an undo takes first: the retweet's row. The backfill holds it already.
        let mut undo = db.begin().await.unwrap();
        let taken = sqlx::query("select 1 from tweets where id = $1 for update nowait")
            .bind(by_fred)
            .execute(&mut *undo)
            .await;
        drop(undo);
        head.commit().await.unwrap();
        taken.is_ok()
    };
    let (_, undo_got_the_row) = futures_util::future::join(backfill, probe).await;
    assert!(
        !undo_got_the_row,
        "the backfill waits for the head without holding the rows it will copy"
    );
    let shown: Vec<i64> = feed(&app, &tr, 10).await.iter().map(|e| e.tweet).collect();
    assert_eq!(shown[0], by_fred);
}

/// A reply's delete locks the tweet it answers before it deletes any newsfeed row, the order
/// of an unfollow's unmerge (the tweets it reveals, then newsfeed rows): taken at the end, when
/// the count moves, the two deadlocked (a 500 for the delete; the history checker's 10-minute
/// run on 2026-11-29). The unmerge is played by a transaction in its order.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_replys_delete_locks_what_it_answers_before_any_newsfeed_row(db: PgPool) {
    let app = TestApp::new(db.clone()).await;
    let (_, to) = app.quick_user("olga").await;
    let (_, tr) = app.quick_user("rita").await;
    let p = app.tweet(&to, "the question").await["id"].as_i64().unwrap();
    let res = app
        .post(
            "/api/tweets/",
            Some(&tr),
            json!({"content": "the answer", "in_reply_to_tweet_id": p}),
        )
        .await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    let c = res.body["id"].as_i64().unwrap();
    app.drain().await;

    let mut unmerge = db.begin().await.unwrap();
    sqlx::query("select 1 from tweets where id = $1 for no key update")
        .bind(p)
        .execute(&mut *unmerge)
        .await
        .unwrap();
    let uri = format!("/api/tweets/{c}/");
    let delete = app.delete(&uri, Some(&tr));
    let script = async {
        wait_for_lock_wait(&db, None).await;
        sqlx::query("delete from newsfeeds where tweet_id = $1")
            .bind(c)
            .execute(&mut *unmerge)
            .await
            .unwrap();
        unmerge.commit().await.unwrap();
    };
    let (deleted, ()) = futures_util::future::join(delete, script).await;
    assert!(deleted.status.is_success(), "{}", deleted.body);
    let answered = detail(&app, p, None).await;
    assert_eq!(answered["replies_count"], 0, "{answered}");
}

/// A write asked for again on another process after its first process stopped between the
/// commit and the cache step (a client's retry after a timeout): the second answer (the
/// existing retweet, like or follow; `deleted: 0` for an undo) promises the write, so both
/// processes show it at once, not only after the relay takes the first one's outbox row. Found by the history checker's
/// 10-minute run (seed 13287291949698396313: "retweet … is not shown on node 1").
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_write_asked_again_after_its_process_stopped_shows_everywhere_at_once(db: PgPool) {
    let (a, b) = two_processes(db).await;
    let (olga, to) = a.quick_user("olga").await;
    let (_, tf) = a.quick_user("fred").await;
    let (_, tg) = a.quick_user("gus").await;
    let s = a.tweet(&to, "the status").await["id"].as_i64().unwrap();
    a.drain().await;
    let detail = format!("/api/tweets/{s}/");
    let profile = format!("/api/users/{olga}/");
    // What both processes show: `field` of the tweet as fred sees it, or of olga's profile.
    let shown = |field: &'static str, want: Value| {
        let (a, b, detail, profile, tf) = (&a, &b, &detail, &profile, &tf);
        async move {
            for (name, app) in [("a", a), ("b", b)] {
                let body = if field == "followers_count" {
                    app.get(profile, None).await.body
                } else {
                    app.get(detail, Some(tf)).await.body
                };
                assert_eq!(body[field], want, "{field} on {name}: {body}");
            }
        }
    };
    // Both processes hold the tweet as fred sees it (counts and his liked set).
    shown("has_retweeted", json!(false)).await;
    shown("has_liked", json!(false)).await;
    shown("followers_count", json!(0)).await;

    // Each write commits on `a`, whose process stops before the cache step; it is asked for
    // again on `b`, and after each answer both processes show it.
    let first = with_cache_steps_skipped(&a, retweet(&a, &tf, s)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    let again = retweet(&b, &tf, s).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(again.body["id"], first.body["id"]);
    shown("has_retweeted", json!(true)).await;
    shown("retweets_count", json!(1)).await;

    let like = json!({"content_type": "tweet", "object_id": s});
    let liked = with_cache_steps_skipped(&a, a.post("/api/likes/", Some(&tf), like.clone())).await;
    assert_eq!(liked.status, StatusCode::CREATED, "{}", liked.body);
    let again = b.post("/api/likes/", Some(&tf), like.clone()).await;
    assert!(again.status.is_success(), "{}", again.body);
    shown("has_liked", json!(true)).await;
    shown("likes_count", json!(1)).await;

    let follow = format!("/api/friendships/{olga}/follow/");
    let followed = with_cache_steps_skipped(&a, a.post(&follow, Some(&tg), json!({}))).await;
    assert!(followed.status.is_success(), "{}", followed.body);
    let again = b.post(&follow, Some(&tg), json!({})).await;
    assert_eq!(again.body["duplicate"], true, "{}", again.body);
    shown("followers_count", json!(1)).await;

    // The undos likewise: the second answer (nothing left to delete) promises the undo.
    let undone = with_cache_steps_skipped(&a, unretweet(&a, &tf, s)).await;
    assert_eq!(undone.body["deleted"], 1, "{}", undone.body);
    assert_eq!(unretweet(&b, &tf, s).await.body["deleted"], 0);
    shown("has_retweeted", json!(false)).await;
    shown("retweets_count", json!(0)).await;

    let cancel = "/api/likes/cancel/";
    let cancelled = with_cache_steps_skipped(&a, a.post(cancel, Some(&tf), like.clone())).await;
    assert_eq!(cancelled.body["deleted"], 1, "{}", cancelled.body);
    assert_eq!(b.post(cancel, Some(&tf), like).await.body["deleted"], 0);
    shown("has_liked", json!(false)).await;
    shown("likes_count", json!(0)).await;

    let unfollow = format!("/api/friendships/{olga}/unfollow/");
    let unfollowed = with_cache_steps_skipped(&a, a.post(&unfollow, Some(&tg), json!({}))).await;
    assert_eq!(unfollowed.body["deleted"], 1, "{}", unfollowed.body);
    assert_eq!(
        b.post(&unfollow, Some(&tg), json!({})).await.body["deleted"],
        0
    );
    shown("followers_count", json!(0)).await;
}

/// An unmerge decides "the friendship is gone" in the statement that deletes, not only in its
/// check: a follow that came back while the unmerge waited between the two (here for a tweet
/// it reveals, which the test holds) keeps every entry, also one fanned out after the follow.
/// Before, the unmerge deleted the new entry too and the follow's backfill brought it back on
/// top: a client that held it got it again from its refresh (the history checker's 10-minute
/// run on 2026-11-29, at 138 s: a tweet twice on a user stream).
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn an_unmerge_takes_nothing_once_the_follow_is_back(db: PgPool) {
    let app = TestApp::new(db.clone()).await;
    let (xan, tx) = app.quick_user("xan").await;
    let (_, ty) = app.quick_user("yul").await;
    let (_, tf) = app.quick_user("fay").await;
    app.follow(&tf, xan).await;
    let t1 = app
        .tweet(&tx, "retweeted by someone fay does not follow")
        .await["id"]
        .as_i64()
        .unwrap();
    new_retweet(&app, &ty, t1).await;
    app.drain().await;
    let res = (app.post(
        &format!("/api/friendships/{xan}/unfollow/"),
        Some(&tf),
        json!({}),
    ))
    .await;
    assert!(res.status.is_success(), "{}", res.body);

    // The tweet it would reveal held: the unmerge checks the friendship, then waits.
    let mut held = db.begin().await.unwrap();
    sqlx::query("select 1 from tweets where id = $1 for update")
        .bind(t1)
        .execute(&mut *held)
        .await
        .unwrap();
    let unmerge = app.drain();
    let (app_, db_, tx_, tf_) = (&app, &db, &tx, &tf);
    let script = async move {
        let (app, db) = (app_, db_);
        wait_for_lock_wait(db, None).await;
        app.follow(tf_, xan).await;
        let t2 = app.tweet(tx_, "after the follow").await["id"]
            .as_i64()
            .unwrap();
        // Its fan-out runs beside the unmerge (the follow's backfill waits for the pair).
        let backfill = app.drain();
        let fanout = async {
            wait_for_lock_wait(db, Some("advisory")).await;
            app.drain().await;
        };
        let held_feed = async {
            fanout.await;
            let page = feed(app, tf_, 10).await;
            held.commit().await.unwrap();
            page
        };
        let (_, page) = futures_util::future::join(backfill, held_feed).await;
        (t2, page)
    };
    let both = futures_util::future::join(unmerge, script);
    let (_, (t2, page)) = tokio::time::timeout(std::time::Duration::from_secs(60), both)
        .await
        .expect("the unmerge and the script waited for each other");
    app.drain().await;
    let shown: Vec<i64> = page.iter().map(|e| e.tweet).collect();
    assert_eq!(shown, [t2, t1], "what the client holds: {page:?}");
    for round in ["warm", "flushed"] {
        let after = feed(&app, &tf, 10).await;
        let places: Vec<_> = after.iter().map(Entry::place).collect();
        let held: Vec<_> = page.iter().map(Entry::place).collect();
        assert_eq!(places, held, "{round}: every entry stays where it was");
        let refreshed = refresh(&app, &tf, &page[0].at).await;
        assert!(refreshed.is_empty(), "{round}: {refreshed:?}");
        app.flush_cache().await;
    }
}
