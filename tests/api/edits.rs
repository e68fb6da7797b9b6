//! Edits (issue 40): from the moment `PATCH /api/tweets/{id}/` answers, no process serves the
//! old text anywhere: the detail, every timeline page (cached, cold or past the cached window),
//! each process's near cache and the streams (an `edit` event) agree with Postgres; a reader
//! that loaded the old text can not put it back; bad edits change nothing.

use std::collections::HashMap;

use axum::http::{Method, StatusCode};
use chirp::cache::AfterCommit;
use chirp::cache::held::NearId;
use rand::Rng;
use rand::seq::IndexedRandom;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{Stream, TestApp, eventually, page_tweets, seeded_rng, two_processes};

async fn edit(app: &TestApp, token: &str, tweet: i64, content: &str) -> (StatusCode, Value) {
    let uri = format!("/api/tweets/{tweet}/");
    let res = app
        .request(
            Method::PATCH,
            &uri,
            Some(token),
            Some(json!({"content": content})),
        )
        .await;
    (res.status, res.body)
}

/// Every tweet of a timeline as `(id, [content, edited_at])`, paged down with
/// `created_at__lt` at `page_size`.
async fn texts(app: &TestApp, base: &str, token: &str, page_size: usize) -> Vec<(i64, Value)> {
    (page_tweets(app, base, Some(token), page_size).await.iter())
        .map(|t| {
            let id = t["id"].as_i64().expect("id");
            (id, json!([t["content"], t["edited_at"]]))
        })
        .collect()
}

/// `[content, edited_at]` of each of `ids` in Postgres, in order.
async fn stored(app: &TestApp, ids: &[i64]) -> Vec<(i64, Value)> {
    let mut out = Vec::new();
    for id in ids {
        let (content, edited_at): (String, Option<chrono::DateTime<chrono::Utc>>) =
            sqlx::query_as("select content, edited_at from tweets where id = $1")
                .bind(id)
                .fetch_one(app.db())
                .await
                .expect("the tweet");
        let edited_at = edited_at.map(|t| chirp::time::format(&t));
        out.push((*id, json!([content, edited_at])));
    }
    out
}

fn holds_tweet(app: &TestApp, id: i64) -> bool {
    let near = app.state.cache.near_objects().expect("cache on");
    near.get(&app.state.cache, &NearId::Tweet(id)).is_some()
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn an_edit_on_one_process_is_never_stale_on_another(db: PgPool) {
    let (a, b) = two_processes(db.clone()).await;
    let (alice, at) = a.signup("alice").await;
    let (_, bt) = a.signup("bob").await;
    a.follow(&bt, alice).await;
    let list = a.new_list(&bt, "reads").await;
    a.add_to_list(&bt, list, alice).await;
    let ids = a.tweets(&at, "alice", 7).await;
    a.drain().await;
    let target = ids[3];
    let feed = "/api/newsfeeds/";
    let mine = format!("/api/tweets/?user_id={alice}");
    let listed = format!("/api/lists/{list}/timeline/");
    let detail = format!("/api/tweets/{target}/");
    let mut user_stream = Stream::open(&b, "/api/streaming/user/", &bt, None).await;
    let mut filtered =
        Stream::open(&b, "/api/streaming/statuses/filter/?track=alice", &bt, None).await;
    eventually("both processes subscribed", async || {
        a.state.subscriber.subscribed() && b.state.subscriber.subscribed()
    })
    .await;
    // Warm: Redis and b's memory hold the tweet object.
    for app in [&a, &b] {
        texts(app, feed, &bt, 3).await;
        texts(app, &mine, &bt, 3).await;
        texts(app, &listed, &bt, 3).await;
    }
    eventually("b holds the tweet in memory", async || {
        b.get(&detail, Some(&bt)).await;
        holds_tweet(&b, target)
    })
    .await;
    let before = b.get(&detail, None).await.body;
    assert_eq!(before["edited_at"], Value::Null);
    let v0 = chirp::tweets::rows_by_ids(a.db(), &[target])
        .await
        .unwrap()
        .remove(0);
    let author = chirp::users::load_many(a.db(), &a.state.cache, &[alice])
        .await
        .unwrap()[&alice]
        .clone();

    let (status, body) = edit(&a, &at, target, "  edited by alice  ").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["content"], "edited by alice");
    assert_eq!(body["id"], target);
    assert_eq!(body["created_at"], before["created_at"], "its time stays");
    let edited_at = body["edited_at"].clone();
    assert!(edited_at.is_string(), "{body}");
    let want = stored(&a, &ids).await;
    assert_eq!(want[3].1, json!(["edited by alice", edited_at]));
    // No pause: on both processes, at once, every page size and timeline, and the detail.
    let newest_first: Vec<(i64, Value)> = want.iter().rev().cloned().collect();
    for app in [&b, &a] {
        let res = app.get(&detail, Some(&bt)).await.body;
        assert_eq!(res["content"], "edited by alice", "{res}");
        assert_eq!(res["edited_at"], edited_at);
        for page_size in [1, 3, 7] {
            assert_eq!(texts(app, feed, &bt, page_size).await, newest_first);
            assert_eq!(texts(app, &mine, &bt, page_size).await, newest_first);
            assert_eq!(texts(app, &listed, &bt, page_size).await, newest_first);
        }
    }
    // The same from Postgres alone.
    b.flush_cache().await;
    assert_eq!(texts(&b, feed, &bt, 2).await, newest_first);
    // Both streams got the edited tweet.
    for stream in [&mut user_stream, &mut filtered] {
        let ev = loop {
            let ev = stream
                .next(std::time::Duration::from_secs(5))
                .await
                .expect("an edit event");
            if ev.kind == "edit" {
                break ev;
            }
        };
        assert_eq!(ev.data["tweet"]["id"], target);
        assert_eq!(ev.data["tweet"]["content"], "edited by alice");
        assert_eq!(ev.data["tweet"]["edited_at"], edited_at);
    }

    // A late stream event of the text as it was (a fan-out batch that read it before the
    // edit) carries the edited tweet instead.
    let stale = chirp::tweets::Tweet::new(v0.record.clone(), author.into(), &v0.counts, false);
    chirp::streams::publish_created(
        &a.state.cache,
        &stale,
        &v0.record,
        Some((0, v0.record.created_at)),
        false,
    )
    .await;
    let late = filtered
        .next(std::time::Duration::from_secs(5))
        .await
        .expect("the late event");
    assert_eq!(late.kind, "tweet");
    assert_eq!(
        late.data["tweet"]["content"], "edited by alice",
        "{:?}",
        late.data
    );

    // A second edit; the history lists all three texts, oldest first.
    let (status, body) = edit(&b, &at, target, "second edit").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["edited_at"].as_str() > edited_at.as_str());
    let history = a.get(&format!("/api/tweets/{target}/history/"), None).await;
    assert_eq!(history.status, StatusCode::OK, "{}", history.body);
    let versions = history.body["versions"].as_array().expect("versions");
    let texts_of: Vec<&str> = versions
        .iter()
        .map(|v| v["content"].as_str().expect("content"))
        .collect();
    assert_eq!(texts_of, ["alice3", "edited by alice", "second edit"]);
    assert_eq!(versions[0]["created_at"], before["created_at"]);
    assert_eq!(versions[1]["created_at"], edited_at);
    assert_eq!(versions[2]["created_at"], body["edited_at"]);
    assert_eq!(
        a.get(&detail, None).await.body["content"],
        "second edit",
        "a's memory too"
    );
    let unknown = a.get("/api/tweets/999999/history/", None).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn bad_edits_are_refused_and_change_nothing(db: PgPool) {
    let app = TestApp::new(db.clone()).await;
    let (_, at) = app.signup("alice").await;
    let (bob, bt) = app.signup("bob").await;
    let id = app.tweet(&at, "original").await["id"].as_i64().unwrap();
    let old = app.tweet(&at, "old one").await["id"].as_i64().unwrap();
    sqlx::query("update tweets set created_at = created_at - interval '61 minutes' where id = $1")
        .bind(old)
        .execute(&db)
        .await
        .unwrap();
    let too_long = "x".repeat(281);
    let cases: [(i64, Option<&str>, Value, StatusCode); 7] = [
        (
            id,
            Some(&bt),
            json!({"content": "hijack"}),
            StatusCode::FORBIDDEN,
        ),
        (
            id,
            None,
            json!({"content": "anon"}),
            StatusCode::UNAUTHORIZED,
        ),
        (
            999_999,
            Some(&at),
            json!({"content": "x"}),
            StatusCode::NOT_FOUND,
        ),
        (
            id,
            Some(&at),
            json!({"content": "   "}),
            StatusCode::BAD_REQUEST,
        ),
        (
            id,
            Some(&at),
            json!({"content": too_long}),
            StatusCode::BAD_REQUEST,
        ),
        (id, Some(&at), json!({}), StatusCode::BAD_REQUEST),
        (
            old,
            Some(&at),
            json!({"content": "too late"}),
            StatusCode::BAD_REQUEST,
        ),
    ];
    for (tweet, token, body, status) in cases {
        let uri = format!("/api/tweets/{tweet}/");
        let res = app
            .request(Method::PATCH, &uri, token, Some(body.clone()))
            .await;
        assert_eq!(res.status, status, "{body}: {}", res.body);
        assert!(res.body.is_object(), "a JSON error: {}", res.body);
    }
    let late = edit(&app, &at, old, "too late").await.1;
    assert!(
        late.to_string().contains("within an hour"),
        "a clear reason: {late}"
    );
    for (tweet, text) in [(id, "original"), (old, "old one")] {
        let res = app.get(&format!("/api/tweets/{tweet}/"), None).await.body;
        assert_eq!(res["content"], text);
        assert_eq!(res["edited_at"], Value::Null);
        let history = app
            .get(&format!("/api/tweets/{tweet}/history/"), None)
            .await;
        assert_eq!(history.body["versions"].as_array().map(Vec::len), Some(1));
    }
    let edits: i64 = sqlx::query_scalar("select count(*) from tweet_edits")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(edits, 0);
    // The same text again is no new version.
    let (status, body) = edit(&app, &at, id, "original").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["edited_at"], Value::Null);
    // A blocked account gets 404 for the blocker's history, as for the tweet.
    let block = format!("/api/users/{bob}/block/");
    app.post_expecting(StatusCode::OK, &block, Some(&at), json!({}))
        .await;
    let res = app
        .get(&format!("/api/tweets/{id}/history/"), Some(&bt))
        .await;
    assert_eq!(res.status, StatusCode::NOT_FOUND, "{}", res.body);
}

/// A reader that loaded the old text before the edit, or an older edit's write that reaches
/// Redis late (a crashed cache step applied by the relay), can not put the old text back.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn no_late_writer_puts_back_an_older_text(db: PgPool) {
    let (a, b) = two_processes(db).await;
    let (_, at) = a.signup("alice").await;
    let id = a.tweet(&at, "v0").await["id"].as_i64().unwrap();
    let detail = format!("/api/tweets/{id}/");
    let v0 = chirp::tweets::rows_by_ids(a.db(), &[id])
        .await
        .unwrap()
        .remove(0);
    assert_eq!(edit(&a, &at, id, "v1").await.0, StatusCode::OK);
    let v1 = chirp::tweets::rows_by_ids(a.db(), &[id])
        .await
        .unwrap()
        .remove(0);
    let later = chirp::model::TweetRecord {
        content: "a later edit".to_owned(),
        edit_version: 9,
        ..v1.record.clone()
    };
    // The cache step of the second edit never runs; the relay applies it late.
    a.state.cache.set_after_commit(AfterCommit::Crash);
    assert_eq!(edit(&a, &at, id, "v2").await.0, StatusCode::OK);
    a.state.cache.set_after_commit(AfterCommit::Apply);
    a.relay().await;
    // Then the first edit's write arrives again, and a reader stores what it loaded before
    // the edits.
    a.state
        .cache
        .apply_best_effort(&[chirp::cache::Update::TweetEdited { tweet: v1.record }])
        .await;
    a.state
        .cache
        .put_tweets(&[(v0.record, v0.counts)], &[])
        .await;
    for app in [&a, &b] {
        let res = app.get(&detail, None).await.body;
        assert_eq!(res["content"], "v2", "{res}");
        // And once more, from what that read cached.
        assert_eq!(app.get(&detail, None).await.body["content"], "v2");
    }
    // A deleted tweet's tombstone is final for every version.
    assert_eq!(a.delete(&detail, Some(&at)).await.status, StatusCode::OK);
    a.state
        .cache
        .apply_best_effort(&[chirp::cache::Update::TweetEdited { tweet: later }])
        .await;
    assert_eq!(a.raw_get(&a.keys().tweet(id)).await.as_deref(), Some("-"));
    assert_eq!(b.get(&detail, None).await.status, StatusCode::NOT_FOUND);
}

/// Random histories of posts, edits, deletes and cache flushes, each through a random process:
/// after each step, every page of the reader's newsfeed and of each author's timeline, at a
/// random page size, and each detail, show exactly the model's text; at the end the reader's
/// stream, folded (tweet events, then edits replacing their text), agrees too.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn over_random_histories_pages_details_and_streams_show_the_current_text(db: PgPool) {
    let (seed, mut rng) = seeded_rng("CHIRP_EDITS_SEED", "edits history");
    let (a, b) = two_processes(db.clone()).await;
    let (_, rt) = a.signup("reader").await;
    let mut authors = Vec::new();
    for i in 0..2 {
        let (id, token) = a.signup(&format!("author{i}")).await;
        a.follow(&rt, id).await;
        authors.push((id, token));
    }
    let mut stream = Stream::open(&b, "/api/streaming/user/", &rt, None).await;
    eventually("both processes subscribed", async || {
        a.state.subscriber.subscribed() && b.state.subscriber.subscribed()
    })
    .await;
    // The model: tweet id → (author index, text), newest last.
    let mut model: Vec<(i64, usize, String)> = Vec::new();
    for step in 0..40 {
        let app = if rng.random_bool(0.5) { &a } else { &b };
        let what = match rng.random_range(0..10) {
            0..=2 => {
                let who = rng.random_range(0..authors.len());
                let text = format!("post {step}");
                let id = app.tweet(&authors[who].1, &text).await["id"]
                    .as_i64()
                    .unwrap();
                model.push((id, who, text));
                "post"
            }
            3..=6 if !model.is_empty() => {
                let i = rng.random_range(0..model.len());
                let text = format!("edit {step}");
                let (status, body) = edit(app, &authors[model[i].1].1, model[i].0, &text).await;
                assert_eq!(status, StatusCode::OK, "seed {seed}: {body}");
                model[i].2 = text;
                "edit"
            }
            7 if !model.is_empty() => {
                let i = rng.random_range(0..model.len());
                let (id, who, _) = model.remove(i);
                let res = app
                    .delete(&format!("/api/tweets/{id}/"), Some(&authors[who].1))
                    .await;
                assert_eq!(res.status, StatusCode::OK, "seed {seed}: {}", res.body);
                "delete"
            }
            8 => {
                a.flush_cache().await;
                "flush"
            }
            _ => "read only",
        };
        a.drain().await;
        let context = format!("seed {seed}, step {step} ({what})");
        let reader = if rng.random_bool(0.5) { &a } else { &b };
        let page_size = rng.random_range(1..6);
        let want: Vec<(i64, String)> = model
            .iter()
            .rev()
            .map(|(id, _, t)| (*id, t.clone()))
            .collect();
        let content_of = |items: Vec<(i64, Value)>| -> Vec<(i64, String)> {
            items
                .into_iter()
                .map(|(id, v)| (id, v[0].as_str().expect("content").to_owned()))
                .collect()
        };
        let feed = content_of(texts(reader, "/api/newsfeeds/", &rt, page_size).await);
        assert_eq!(feed, want, "newsfeed, {context}");
        for (who, (author, _)) in authors.iter().enumerate() {
            let uri = format!("/api/tweets/?user_id={author}");
            let theirs = content_of(texts(reader, &uri, &rt, page_size).await);
            let want: Vec<_> = (model.iter().rev())
                .filter(|(_, w, _)| *w == who)
                .map(|(id, _, t)| (*id, t.clone()))
                .collect();
            assert_eq!(theirs, want, "author {who}'s tweets, {context}");
        }
        if let Some((id, _, text)) = model.choose(&mut rng) {
            let res = reader.get(&format!("/api/tweets/{id}/"), Some(&rt)).await;
            assert_eq!(res.body["content"], text.as_str(), "detail, {context}");
        }
    }
    // The stream: what a client shows after folding its events.
    let mut shown: HashMap<i64, String> = HashMap::new();
    while let Some(ev) = stream.next(std::time::Duration::from_millis(500)).await {
        match ev.kind.as_str() {
            "tweet" | "edit" => {
                let tweet = &ev.data["tweet"];
                let id = tweet["id"].as_i64().expect("id");
                shown.insert(id, tweet["content"].as_str().expect("content").to_owned());
            }
            "delete" => {
                shown.remove(&ev.data["tweet_id"].as_i64().expect("tweet_id"));
            }
            _ => {}
        }
    }
    let want: HashMap<i64, String> = model.into_iter().map(|(id, _, t)| (id, t)).collect();
    assert_eq!(shown, want, "the stream, seed {seed}");
}
