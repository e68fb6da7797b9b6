//! Replies and threads (issue 41, ../shared/API.md v3 "Replies, threads and mentions"): the
//! reply fields and the exact `replies_count`, the newsfeed rule (a reader sees a reply only if
//! they follow both people) equal in fan-out, backfill, cached pages and Postgres pages, and the
//! cached context view against a model of random threads.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use axum::http::StatusCode;
use rand::Rng;
use rand::seq::IndexedRandom;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{Proxy, TestApp, page_all, seeded_rng, two_processes, urlencode};

/// Posts a reply to `to`; the response.
async fn reply(app: &TestApp, token: &str, to: i64, content: &str) -> crate::helpers::Res {
    app.post(
        "/api/tweets/",
        Some(token),
        json!({"content": content, "in_reply_to_tweet_id": to}),
    )
    .await
}

/// Posts a reply to `to` that must succeed; its id.
async fn reply_id(app: &TestApp, token: &str, to: i64) -> i64 {
    let res = reply(app, token, to, "a reply").await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    res.body["id"].as_i64().expect("id")
}

async fn replies_count(app: &TestApp, id: i64) -> Value {
    let res = app.get(&format!("/api/tweets/{id}/"), None).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    res.body["replies_count"].clone()
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_reply_names_what_it_answers_and_is_counted_on_it(db: PgPool) {
    let app = TestApp::new(db).await;
    let (ann, ta) = app.quick_user("ann").await;
    let (_, tb) = app.quick_user("bob").await;
    let (_, tc) = app.quick_user("cat").await;
    let first = app.tweet(&ta, "first").await;
    assert_eq!(first["in_reply_to_tweet_id"], Value::Null);
    assert_eq!(first["in_reply_to_user_id"], Value::Null);
    assert_eq!(first["replies_count"], 0);
    let first = first["id"].as_i64().unwrap();
    assert_eq!(replies_count(&app, first).await, 0); // cached with its counts

    let res = reply(&app, &tb, first, "an answer").await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    assert_eq!(res.body["in_reply_to_tweet_id"], first);
    assert_eq!(res.body["in_reply_to_user_id"], ann);
    let answer = res.body["id"].as_i64().unwrap();
    // A form post too, and a reply to the reply.
    let form = app
        .send(
            axum::http::Request::post("/api/tweets/")
                .header("authorization", format!("Token {tc}"))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(axum::body::Body::from(format!(
                    "content=deeper&in_reply_to_tweet_id={answer}"
                )))
                .unwrap(),
        )
        .await;
    assert_eq!(form.status, StatusCode::CREATED, "{}", form.body);
    assert_eq!(form.body["in_reply_to_tweet_id"], answer);
    for round in ["warm", "flushed"] {
        assert_eq!(replies_count(&app, first).await, 1, "{round}");
        assert_eq!(replies_count(&app, answer).await, 1, "{round}");
        // The spliced objects of a page carry the fields.
        let page = app.get(&format!("/api/tweets/?user_id={ann}"), None).await;
        assert_eq!(page.body["results"][0]["replies_count"], 1, "{round}");
        let detail = app.get(&format!("/api/tweets/{answer}/"), None).await;
        assert_eq!(detail.body["in_reply_to_tweet_id"], first, "{round}");
        assert_eq!(detail.body["in_reply_to_user_id"], ann, "{round}");
        app.flush_cache().await;
    }

    // Refused replies change nothing.
    let rows = |app: &TestApp| {
        let db = app.db().clone();
        async move {
            sqlx::query_scalar::<_, i64>("select count(*) from tweets")
                .fetch_one(&db)
                .await
                .unwrap()
        }
    };
    let before = rows(&app).await;
    for (to, status) in [
        (json!(first + 1000), StatusCode::BAD_REQUEST),
        (json!("x"), StatusCode::BAD_REQUEST),
        (json!(-1), StatusCode::BAD_REQUEST),
    ] {
        let res = app
            .post(
                "/api/tweets/",
                Some(&tb),
                json!({"content": "no", "in_reply_to_tweet_id": to}),
            )
            .await;
        assert_eq!(res.status, status, "{}", res.body);
        assert!(
            res.body["errors"]["in_reply_to_tweet_id"].is_array(),
            "names the field: {}",
            res.body
        );
    }
    // A block either way: 403.
    let res = app
        .post(&format!("/api/users/{ann}/block/"), Some(&tc), json!({}))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let refused = reply(&app, &tc, first, "blocked").await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    assert_eq!(rows(&app).await, before);
    assert_eq!(replies_count(&app, first).await, 1);

    // Deleting the reply uncounts it; deleting the replied-to tweet keeps the reply's ids.
    let res = app
        .delete(&format!("/api/tweets/{answer}/"), Some(&tb))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(replies_count(&app, first).await, 0);
    let second = reply_id(&app, &tb, first).await;
    assert_eq!(replies_count(&app, first).await, 1);
    let res = app
        .delete(&format!("/api/tweets/{first}/"), Some(&ta))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let detail = app.get(&format!("/api/tweets/{second}/"), None).await;
    assert_eq!(detail.body["in_reply_to_tweet_id"], first);
    let gone = reply(&app, &tb, first, "too late").await;
    assert_eq!(gone.status, StatusCode::BAD_REQUEST, "{}", gone.body);
}

/// 64 repliers at once, and half of them deleting again: `replies_count` is exact, written
/// through and after a flush.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn replies_count_is_exact_under_concurrent_repliers(db: PgPool) {
    let (a, b) = two_processes(db).await;
    let (_, ta) = a.quick_user("ann").await;
    let id = a.tweet(&ta, "reply to me").await["id"].as_i64().unwrap();
    assert_eq!(replies_count(&b, id).await, 0);
    let mut tokens = Vec::new();
    for i in 0..64 {
        tokens.push(a.quick_user(&format!("rep{i}")).await.1);
    }
    let posted = futures_util::future::join_all(tokens.iter().enumerate().map(|(i, t)| {
        let app = if i % 2 == 0 { &a } else { &b };
        async move { reply_id(app, t, id).await }
    }))
    .await;
    assert_eq!(replies_count(&a, id).await, 64);
    assert_eq!(replies_count(&b, id).await, 64);
    futures_util::future::join_all(posted.iter().zip(&tokens).step_by(2).map(|(r, t)| {
        let b = &b;
        async move {
            let res = b.delete(&format!("/api/tweets/{r}/"), Some(t)).await;
            assert_eq!(res.status, StatusCode::OK, "{}", res.body);
        }
    }))
    .await;
    assert_eq!(replies_count(&a, id).await, 32);
    assert_eq!(replies_count(&b, id).await, 32);
    a.flush_cache().await;
    assert_eq!(replies_count(&b, id).await, 32);
    // A cache step that did not confirm in time (96 writes at once; on a cluster each WAITs for
    // a replica) leaves its row to the relay, by design: every row left must apply.
    a.relay().await;
    assert_eq!(a.outbox_rows().await, 0);
}

/// Random follows, tweets and replies (to tweets of anyone, oneself included), some deleted,
/// and late follows whose backfill copies replies: every reader's newsfeed holds exactly its own
/// tweets and its followees' tweets, a reply only if the reader followed the replied-to user
/// too (or is them) when the reply's rows were written (its fan-out, or the backfill), and it is the same warm (cached), after a flush (Postgres fills) and read
/// through the Postgres fallback with Redis down. Run with the one-tweet fan-out
/// (`fanout_batch_jobs = 1`) and with the batched one.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn the_reply_rule_is_the_same_in_every_fan_out_and_every_read(db: PgPool) {
    let (seed, mut rng) = seeded_rng("CHIRP_REPLIES_SEED", "reply rule");
    let proxy = Proxy::start().await;
    for batch_jobs in [1, 16] {
        let app = TestApp::with(db.clone(), |c| {
            c.fanout_batch_jobs = batch_jobs;
            c.redis_url = proxy.url();
        })
        .await;
        let mut users = Vec::new();
        for i in 0..7 {
            users.push(app.quick_user(&format!("user{batch_jobs}x{i}")).await);
        }
        let mut follows: BTreeSet<(usize, usize)> = BTreeSet::new();
        for r in 0..users.len() {
            for a in 0..users.len() {
                if r != a && rng.random_bool(0.45) {
                    app.follow(&users[r].1, users[a].0).await;
                    follows.insert((r, a));
                }
            }
        }
        app.drain().await;
        // tweet id -> (author index, replied-to author index)
        let mut tweets: BTreeMap<i64, (usize, Option<usize>)> = BTreeMap::new();
        for step in 0..60 {
            let author = rng.random_range(0..users.len());
            let ids: Vec<i64> = tweets.keys().copied().collect();
            let to =
                (rng.random_bool(0.6) && !ids.is_empty()).then(|| *ids.choose(&mut rng).unwrap());
            let body = match to {
                Some(to) => json!({"content": format!("r{step}"), "in_reply_to_tweet_id": to}),
                None => json!({"content": format!("t{step}")}),
            };
            let res = app.post("/api/tweets/", Some(&users[author].1), body).await;
            assert_eq!(res.status, StatusCode::CREATED, "seed {seed}: {}", res.body);
            let id = res.body["id"].as_i64().unwrap();
            tweets.insert(id, (author, to.map(|t| tweets[&t].0)));
            if rng.random_bool(0.1) {
                let victim = *tweets
                    .keys()
                    .copied()
                    .collect::<Vec<_>>()
                    .choose(&mut rng)
                    .unwrap();
                let owner = &users[tweets[&victim].0].1;
                let res = app
                    .delete(&format!("/api/tweets/{victim}/"), Some(owner))
                    .await;
                assert_eq!(res.status, StatusCode::OK, "{}", res.body);
                tweets.remove(&victim);
            }
            if step % 10 == 9 {
                app.drain().await;
            }
        }
        app.drain().await;
        // Late follows: their backfill copies the followee's tweets under the same rule, with
        // the follows as they are then (a fan-out used those of its time).
        let initial = follows.clone();
        for _ in 0..4 {
            let (r, a) = (
                rng.random_range(0..users.len()),
                rng.random_range(0..users.len()),
            );
            if r != a && !follows.contains(&(r, a)) {
                app.follow(&users[r].1, users[a].0).await;
                follows.insert((r, a));
            }
        }
        app.drain().await;
        let expected = |r: usize| -> Vec<i64> {
            let mut ids: Vec<i64> = tweets
                .iter()
                .filter(|(_, (author, to))| {
                    // The follows its rows were written under: the fan-out's, or the backfill's.
                    let then = match initial.contains(&(r, *author)) {
                        true => &initial,
                        false => &follows,
                    };
                    *author == r
                        || (follows.contains(&(r, *author))
                            && to.is_none_or(|to| {
                                to == *author || to == r || then.contains(&(r, to))
                            }))
                })
                .map(|(id, _)| *id)
                .collect();
            ids.sort_unstable_by(|x, y| y.cmp(x));
            ids
        };
        for round in ["cold", "warm", "flushed", "postgres"] {
            if round == "flushed" {
                app.flush_cache().await;
            }
            if round == "postgres" {
                proxy.set_up(false);
            }
            for (r, (_, token)) in users.iter().enumerate() {
                let mut got = page_all(&app, "/api/newsfeeds/", Some(token), 4).await;
                got.sort_unstable_by(|x, y| y.cmp(x));
                let want = expected(r);
                let odd: Vec<_> = want
                    .iter()
                    .chain(&got)
                    .filter(|id| want.contains(id) != got.contains(id))
                    .map(|id| (id, tweets.get(id)))
                    .collect();
                assert_eq!(
                    got, want,
                    "seed {seed}, batch jobs {batch_jobs}, reader {r}, {round}: {odd:?}, follows {follows:?}"
                );
            }
            if round == "postgres" {
                proxy.set_up(true);
                assert!(app.recover().await);
            }
        }
    }
}

/// The model of a thread forest: parent of each live tweet (`None`: a root).
#[derive(Default)]
struct Forest {
    parent: BTreeMap<i64, Option<i64>>,
    /// Every tweet ever posted with its parent (deleted ones too: the links stay).
    ever: HashMap<i64, Option<i64>>,
}

impl Forest {
    /// Ancestors of `id`, oldest first, cut at a deleted tweet.
    fn ancestors(&self, id: i64) -> Vec<i64> {
        let mut out = Vec::new();
        let mut up = self.ever[&id];
        while let Some(p) = up {
            if !self.parent.contains_key(&p) {
                break;
            }
            out.push(p);
            up = self.parent[&p];
        }
        out.reverse();
        out
    }

    /// Live descendants of `id` reachable through live tweets, oldest (smallest id) first.
    fn descendants(&self, id: i64) -> Vec<i64> {
        let mut out = Vec::new();
        let mut stack = vec![id];
        while let Some(node) = stack.pop() {
            for (&child, &p) in &self.parent {
                if p == Some(node) {
                    out.push(child);
                    stack.push(child);
                }
            }
        }
        out.sort_unstable();
        out
    }
}

/// A tweet's context, its descendants paged forward `page_size` at a time.
async fn context(app: &TestApp, id: i64, page_size: usize) -> (Vec<i64>, Vec<i64>) {
    let ids = |v: &Value| -> Vec<i64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_i64().unwrap())
            .collect()
    };
    let mut uri = format!("/api/tweets/{id}/context/?page_size={page_size}");
    let mut descendants = Vec::new();
    let mut ancestors = None;
    loop {
        let res = app.get(&uri, None).await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.body);
        ancestors.get_or_insert_with(|| ids(&res.body["ancestors"]));
        let page = res.body["descendants"].as_array().unwrap().clone();
        assert!(page.len() <= page_size);
        descendants.extend(ids(&res.body["descendants"]));
        if !res.body["has_next_page"].as_bool().unwrap() {
            break;
        }
        let last = page.last().unwrap()["created_at"]
            .as_str()
            .unwrap()
            .to_owned();
        uri = format!(
            "/api/tweets/{id}/context/?page_size={page_size}&created_at__gt={}",
            urlencode(&last)
        );
    }
    (ancestors.unwrap_or_default(), descendants)
}

/// Random threads grown and cut on one process while another reads each tweet's context right
/// after every write: each answer equals the model (ancestors cut at a deleted tweet, the live
/// subtree oldest first, paged without repeats or holes), warm, after a flush and on a process
/// whose Redis is down; unknown tweets are 404, and bad cursors 400.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn the_context_view_is_the_thread_warm_cold_and_right_after_each_write(db: PgPool) {
    let (seed, mut rng) = seeded_rng("CHIRP_REPLIES_SEED", "context");
    let (a, b) = two_processes(db.clone()).await;
    // A third process whose Redis goes down, for the Postgres path.
    let proxy = Proxy::start().await;
    let c = TestApp::with(db, |c| c.redis_url = proxy.url()).await;
    let mut users = Vec::new();
    for i in 0..4 {
        users.push(a.quick_user(&format!("ctx{i}")).await);
    }
    let mut forest = Forest::default();
    let mut author_of: HashMap<i64, usize> = HashMap::new();
    for step in 0..70 {
        let who = rng.random_range(0..users.len());
        let live: Vec<i64> = forest.parent.keys().copied().collect();
        if rng.random_bool(0.15) && !live.is_empty() {
            let victim = *live.choose(&mut rng).unwrap();
            let res = a
                .delete(
                    &format!("/api/tweets/{victim}/"),
                    Some(&users[author_of[&victim]].1),
                )
                .await;
            assert_eq!(res.status, StatusCode::OK, "{}", res.body);
            forest.parent.remove(&victim);
        } else {
            let to =
                (rng.random_bool(0.8) && !live.is_empty()).then(|| *live.choose(&mut rng).unwrap());
            let id = match to {
                Some(to) => reply_id(&a, &users[who].1, to).await,
                None => a.tweet(&users[who].1, &format!("root {step}")).await["id"]
                    .as_i64()
                    .unwrap(),
            };
            forest.parent.insert(id, to);
            forest.ever.insert(id, to);
            author_of.insert(id, who);
        }
        // Right after the write, on the other process (its cached shapes from earlier reads).
        let live: Vec<i64> = forest.parent.keys().copied().collect();
        for &id in live.choose_multiple(&mut rng, 3) {
            let got = context(&b, id, 3).await;
            assert_eq!(
                got,
                (forest.ancestors(id), forest.descendants(id)),
                "seed {seed}, step {step}, tweet {id}"
            );
        }
    }
    for round in ["warm", "flushed", "postgres"] {
        if round == "flushed" {
            b.flush_cache().await;
        }
        if round == "postgres" {
            proxy.set_up(false);
        }
        let reader = if round == "postgres" { &c } else { &b };
        for &id in forest.parent.keys() {
            let got = context(reader, id, 2).await;
            assert_eq!(
                got,
                (forest.ancestors(id), forest.descendants(id)),
                "seed {seed}, {round}, tweet {id}"
            );
        }
    }
    proxy.set_up(true);
    let gone: HashSet<i64> = forest
        .ever
        .keys()
        .filter(|id| !forest.parent.contains_key(id))
        .copied()
        .collect();
    for id in gone.iter().take(3) {
        let res = b.get(&format!("/api/tweets/{id}/context/"), None).await;
        assert_eq!(res.status, StatusCode::NOT_FOUND);
    }
    let any = *forest.parent.keys().next().unwrap();
    for bad in ["created_at__gt=x", "page_size=0", "page_size=101"] {
        let res = b
            .get(&format!("/api/tweets/{any}/context/?{bad}"), None)
            .await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{bad}: {}", res.body);
    }
}
