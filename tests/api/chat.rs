//! Chat: exact ordering under concurrent senders, read markers, idempotent sends, long-polls
//! across processes and with Redis down, permissions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::{Value, json};
use sqlx::{Connection, PgPool};

use crate::helpers::{Proxy, TestApp};

async fn channel(app: &TestApp, token: &str, members: &[i64]) -> i64 {
    let res = app
        .post(
            "/api/chat/channels/",
            Some(token),
            json!({"member_ids": members}),
        )
        .await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    res.body["id"].as_i64().expect("id")
}

async fn say(app: &TestApp, token: &str, channel: i64, content: &str) -> Value {
    let res = app
        .post(
            &format!("/api/chat/channels/{channel}/messages/"),
            Some(token),
            json!({"content": content}),
        )
        .await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    res.body
}

fn ids(body: &Value) -> Vec<i64> {
    body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["id"].as_i64().unwrap())
        .collect()
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_poller_sees_every_message_of_concurrent_senders_once_and_in_order(db: PgPool) {
    let app = Arc::new(TestApp::new(db).await);
    let mut users = Vec::new();
    for i in 0..5 {
        users.push(app.quick_user(&format!("talker{i}")).await);
    }
    let members: Vec<i64> = users.iter().map(|u| u.0).collect();
    let room = channel(&app, &users[0].1, &members).await;
    let (_, reader) = app.quick_user("reader").await;
    let res = app
        .post(
            &format!("/api/chat/channels/{room}/members/"),
            Some(&users[0].1),
            json!({"user_id": sqlx::query_scalar::<_, i64>("select id from users where username = 'reader'").fetch_one(app.db()).await.unwrap()}),
        )
        .await;
    assert_eq!(res.status, StatusCode::CREATED);

    let poller = {
        let app = app.clone();
        tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut since = 0;
            while seen.len() < 200 {
                let body = app
                    .get(
                        &format!(
                            "/api/chat/channels/{room}/messages/?since_id={since}&limit=7&wait=5"
                        ),
                        Some(&reader),
                    )
                    .await
                    .body;
                let got = ids(&body);
                if let Some(last) = got.last() {
                    since = *last;
                }
                seen.extend(got);
            }
            seen
        })
    };
    let mut senders = Vec::new();
    for (_, token) in users.clone() {
        let app = app.clone();
        senders.push(tokio::spawn(async move {
            for i in 0..40 {
                say(&app, &token, room, &format!("message {i}")).await;
            }
        }));
    }
    for s in senders {
        s.await.unwrap();
    }
    let seen = tokio::time::timeout(Duration::from_secs(60), poller)
        .await
        .expect("the poller saw 200 messages")
        .unwrap();
    assert_eq!(
        seen,
        (1..=200).collect::<Vec<i64>>(),
        "no gap, no repeat, in order"
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn read_markers_are_one_per_user_and_own_messages_are_never_unread(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.quick_user("alice").await;
    let (bob, tb) = app.quick_user("bob").await;
    let room = channel(&app, &ta, &[bob]).await;
    let uri = format!("/api/chat/channels/{room}/messages/");
    say(&app, &ta, room, "hi bob").await;
    for text in ["one", "two", "three"] {
        say(&app, &tb, room, text).await;
    }
    let list = app.get("/api/chat/channels/", Some(&ta)).await.body;
    assert_eq!(list["results"][0]["unread_count"], json!(3), "{list}");
    assert_eq!(
        list["results"][0]["members"].as_array().map(Vec::len),
        Some(2)
    );

    // Alice's first client checks: everything after her marker (her own message was read).
    let first = app.get(&uri, Some(&ta)).await.body;
    assert_eq!(ids(&first), vec![2, 3, 4]);
    assert_eq!(first["messages"][0]["user"]["id"], json!(bob));
    // Her second client (same user) finds nothing new; `since_id` reads without moving.
    assert_eq!(ids(&app.get(&uri, Some(&ta)).await.body), Vec::<i64>::new());
    assert_eq!(
        ids(&app.get(&format!("{uri}?since_id=1"), Some(&ta)).await.body),
        vec![2, 3, 4]
    );
    say(&app, &tb, room, "four").await;
    say(&app, &tb, room, "five").await;
    let res = app
        .post(
            &format!("/api/chat/channels/{room}/read/"),
            Some(&ta),
            json!({"last_read_id": 5}),
        )
        .await;
    assert_eq!(res.body, json!({"unread_count": 1}));
    assert_eq!(ids(&app.get(&uri, Some(&ta)).await.body), vec![6]);
    // History pages back to message 1, oldest first.
    let old = app
        .get(&format!("{uri}?before_id=4&limit=2"), Some(&tb))
        .await
        .body;
    assert_eq!(
        (ids(&old), old["has_more"].clone()),
        (vec![2, 3], json!(true))
    );
    let _ = alice;
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_retried_send_stores_one_message_and_strangers_get_404s(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, ta) = app.quick_user("alice").await;
    let (bob, _) = app.quick_user("bob").await;
    let (_, tc) = app.quick_user("carol").await;
    let room = channel(&app, &ta, &[bob]).await;
    let uri = format!("/api/chat/channels/{room}/messages/");
    let body = json!({"content": "once", "client_id": "c-1"});
    let (a, b) = tokio::join!(
        app.post(&uri, Some(&ta), body.clone()),
        app.post(&uri, Some(&ta), body.clone())
    );
    assert_eq!(
        (a.status, b.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert_eq!(a.body["id"], b.body["id"]);
    let again = app.post(&uri, Some(&ta), body).await;
    assert_eq!(again.body["id"], a.body["id"]);
    assert_eq!(say(&app, &ta, room, "next").await["id"], json!(2), "no gap");

    for bad in [
        json!({"content": "  "}),
        json!({"content": "x".repeat(2001)}),
        json!({"content": "a\u{0}b"}),
        json!({}),
    ] {
        let res = app.post(&uri, Some(&ta), bad.clone()).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    assert_eq!(app.get(&uri, Some(&tc)).await.status, StatusCode::NOT_FOUND);
    let res = app
        .post(&uri, Some(&tc), json!({"content": "let me in"}))
        .await;
    assert_eq!(res.status, StatusCode::NOT_FOUND);
    let res = app
        .post(
            "/api/chat/channels/",
            Some(&ta),
            json!({"member_ids": [999999]}),
        )
        .await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        app.get(&format!("{uri}?wait=31"), Some(&ta)).await.status,
        StatusCode::BAD_REQUEST
    );
    let res = app
        .post(
            &format!("/api/chat/channels/{room}/leave/"),
            Some(&ta),
            json!({}),
        )
        .await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(app.get(&uri, Some(&ta)).await.status, StatusCode::NOT_FOUND);
    let stored: i64 = sqlx::query_scalar("select count(*) from chat_messages")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(stored, 2);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_long_poll_wakes_when_another_process_sends(db: PgPool) {
    let sender = TestApp::new(db.clone()).await;
    let prefix = sender.prefix.clone();
    let poller = Arc::new(TestApp::with(db, |c| c.redis_prefix = prefix).await);
    let (_, ta) = sender.quick_user("alice").await;
    let (bob, tb) = sender.quick_user("bob").await;
    let room = channel(&sender, &ta, &[bob]).await;
    let waiting = {
        let poller = poller.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let body = poller
                .get(
                    &format!("/api/chat/channels/{room}/messages/?wait=20"),
                    Some(&tb),
                )
                .await
                .body;
            (ids(&body), started.elapsed())
        })
    };
    // Let the poll subscribe and wait, then send from the other process.
    tokio::time::sleep(Duration::from_millis(500)).await;
    say(&sender, &ta, room, "wake up").await;
    let (got, waited) = waiting.await.unwrap();
    assert_eq!(got, vec![1]);
    assert!(
        waited < Duration::from_secs(10),
        "woken, not timed out: {waited:?}"
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn with_redis_down_sends_succeed_and_long_polls_still_return(db: PgPool) {
    let proxy = Proxy::start().await;
    let app = Arc::new(
        TestApp::with(db, |c| {
            c.redis_url = proxy.url();
            c.redis_timeout_ms = 100;
        })
        .await,
    );
    let (_, ta) = app.quick_user("alice").await;
    let (bob, tb) = app.quick_user("bob").await;
    let room = channel(&app, &ta, &[bob]).await;
    proxy.set_up(false);
    let waiting = {
        let app = app.clone();
        tokio::spawn(async move {
            app.get(
                &format!("/api/chat/channels/{room}/messages/?wait=20"),
                Some(&tb),
            )
            .await
            .body
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    say(&app, &ta, room, "while redis is down").await;
    let body = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("returned before its wait ended")
        .unwrap();
    assert_eq!(ids(&body), vec![1]);
}

/// Members of a channel's cached backlog (`None`: not cached).
async fn backlog(app: &TestApp, channel: i64) -> Option<Vec<String>> {
    let key = app.list_key_of(chirp::cache::backlog::backlog_key(channel));
    let mut r = app.redis().await;
    let exists: bool = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(&mut r)
        .await
        .unwrap();
    if !exists {
        return None;
    }
    Some(
        redis::cmd("ZRANGE")
            .arg(&key)
            .arg(0)
            .arg(-1)
            .query_async(&mut r)
            .await
            .unwrap(),
    )
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn polls_use_the_backlog_and_a_flush_between_polls_loses_and_repeats_nothing(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, ta) = app.quick_user("alice").await;
    let (bob, tb) = app.quick_user("bob").await;
    let room = channel(&app, &ta, &[bob]).await;
    let uri = format!("/api/chat/channels/{room}/messages/");
    for i in 0..5 {
        say(&app, &ta, room, &format!("m{i}")).await;
    }
    assert_eq!(
        backlog(&app, room).await,
        None,
        "nothing cached before a poll"
    );
    assert_eq!(
        ids(&app.get(&uri, Some(&tb)).await.body),
        vec![1, 2, 3, 4, 5]
    );
    let cached = backlog(&app, room)
        .await
        .expect("the poll's miss loaded the backlog");
    assert_eq!(
        cached.len(),
        6,
        "five messages and the completeness marker: {cached:?}"
    );
    say(&app, &ta, room, "appended").await;
    assert_eq!(backlog(&app, room).await.map(|b| b.len()), Some(7));
    // A probe: change the row behind Redis's back; the answer still comes from the backlog.
    sqlx::query("update chat_messages set content = 'changed in postgres' where id = 6")
        .execute(app.db())
        .await
        .unwrap();
    let body = app.get(&uri, Some(&tb)).await.body;
    assert_eq!(ids(&body), vec![6]);
    assert_eq!(
        body["messages"][0]["content"],
        json!("appended"),
        "served from Redis"
    );

    app.flush_cache().await;
    say(&app, &ta, room, "after the flush").await;
    say(&app, &ta, room, "and again").await;
    assert_eq!(ids(&app.get(&uri, Some(&tb)).await.body), vec![7, 8]);
    assert_eq!(ids(&app.get(&uri, Some(&tb)).await.body), Vec::<i64>::new());
    assert_eq!(
        ids(&app.get(&format!("{uri}?since_id=0"), Some(&tb)).await.body),
        (1..=8).collect::<Vec<i64>>()
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn cleanup_trims_redis_and_drops_idle_channels_but_history_pages_to_message_1(db: PgPool) {
    let app = TestApp::with(db, |c| c.chat_backlog = 3).await;
    let (_, ta) = app.quick_user("alice").await;
    let (bob, tb) = app.quick_user("bob").await;
    let room = channel(&app, &ta, &[bob]).await;
    let uri = format!("/api/chat/channels/{room}/messages/");
    app.get(&uri, Some(&tb)).await; // loads the (empty, complete) backlog
    for i in 0..10 {
        say(&app, &ta, room, &format!("m{i}")).await;
    }
    assert_eq!(backlog(&app, room).await.map(|b| b.len()), Some(11));
    assert_eq!(
        chirp::chat::cleanup(&app.state.chat).await.unwrap(),
        Some((1, 0))
    );
    let kept = backlog(&app, room).await.expect("still cached");
    assert_eq!(kept.len(), 3, "{kept:?}");
    assert!(kept[0].starts_with("8|"), "the newest three: {kept:?}");

    // Older messages come from Postgres, through polls and history alike.
    assert_eq!(
        ids(&app
            .get(&format!("{uri}?since_id=0&limit=100"), Some(&tb))
            .await
            .body),
        (1..=10).collect::<Vec<i64>>()
    );
    let history = app
        .get(&format!("{uri}?before_id=11&limit=100"), Some(&tb))
        .await
        .body;
    assert_eq!(ids(&history), (1..=10).collect::<Vec<i64>>());

    // Idle: the channel leaves Redis, and nothing is lost.
    sqlx::query("update chat_channels set last_activity_at = now() - interval '2 hours'")
        .execute(app.db())
        .await
        .unwrap();
    assert_eq!(
        chirp::chat::cleanup(&app.state.chat).await.unwrap(),
        Some((0, 1))
    );
    assert_eq!(backlog(&app, room).await, None);
    assert_eq!(ids(&app.get(&uri, Some(&tb)).await.body).len(), 10);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_burst_of_sends_commits_in_a_few_batches_with_exact_ids_retries_and_404s(db: PgPool) {
    let app = Arc::new(TestApp::new(db).await);
    let (_, ta) = app.quick_user("alice").await;
    let (bob, tb) = app.quick_user("bob").await;
    let (_, stranger) = app.quick_user("mallory").await;
    let mut rooms = Vec::new();
    for _ in 0..4 {
        rooms.push(channel(&app, &ta, &[bob]).await);
    }
    // Hold every room's row lock, so the batches in flight wait and every other send queues.
    // (On a connection of its own: the batches in flight may hold every pooled one.)
    let mut blocker = sqlx::PgConnection::connect_with(&app.db().connect_options())
        .await
        .unwrap();
    sqlx::query("begin").execute(&mut blocker).await.unwrap();
    sqlx::query("select 1 from chat_channels where id = any($1) for update")
        .bind(&rooms)
        .execute(&mut blocker)
        .await
        .unwrap();
    let send = |token: String, room: i64, body: Value| {
        let app = app.clone();
        tokio::spawn(async move {
            let res = app
                .post(
                    &format!("/api/chat/channels/{room}/messages/"),
                    Some(&token),
                    body,
                )
                .await;
            (room, res.status, res.body)
        })
    };
    let mut sends = Vec::new();
    for i in 0..40 {
        let token = if (i / 4) % 2 == 0 { &ta } else { &tb };
        let body = json!({"content": format!("burst {i}")});
        sends.push(send(token.clone(), rooms[i % 4], body));
    }
    let retry = json!({"content": "only once", "client_id": "r-1"});
    sends.push(send(ta.clone(), rooms[1], retry.clone()));
    sends.push(send(ta.clone(), rooms[1], retry));
    sends.push(send(stranger, rooms[2], json!({"content": "let me in"})));
    // Every slot's batch waits for the lock; the rest of the burst queues behind them.
    crate::helpers::lock_waiters(&app, chirp::chat::SEND_BATCHES_IN_FLIGHT as i64).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    sqlx::query("rollback").execute(&mut blocker).await.unwrap();

    let mut ids_by_room: std::collections::HashMap<i64, Vec<i64>> = Default::default();
    let mut retried = Vec::new();
    for s in sends {
        let (room, status, body) = s.await.unwrap();
        if body["content"] == json!("let me in") || status == StatusCode::NOT_FOUND {
            assert_eq!(status, StatusCode::NOT_FOUND, "a stranger's send: {body}");
            continue;
        }
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert_eq!(body["channel_id"], json!(room));
        let id = body["id"].as_i64().unwrap();
        if body["content"] == json!("only once") {
            retried.push(id);
        } else {
            ids_by_room.entry(room).or_default().push(id);
        }
    }
    assert_eq!(retried.len(), 2);
    assert_eq!(retried[0], retried[1], "a retry answers the first send");
    ids_by_room.entry(rooms[1]).or_default().push(retried[0]);
    for room in &rooms {
        let mut got = ids_by_room.remove(room).unwrap_or_default();
        got.sort_unstable();
        let n = got.len() as i64;
        assert_eq!(
            got,
            (1..=n).collect::<Vec<i64>>(),
            "room {room}: no gap, no repeat"
        );
        let (last, stored): (i64, i64) = sqlx::query_as(
            "select c.last_message_id, (select count(*) from chat_messages m where m.channel_id = c.id)
             from chat_channels c where c.id = $1",
        )
        .bind(room)
        .fetch_one(app.db())
        .await
        .unwrap();
        assert_eq!((last, stored), (n, n), "room {room}");
        // Each sender's read marker sits on their own newest message of the burst.
        let markers: Vec<(i64, i64)> = sqlx::query_as(
            "select m.last_read_id, (select coalesce(max(x.id), 0) from chat_messages x
                                     where x.channel_id = m.channel_id and x.user_id = m.user_id)
             from chat_members m where m.channel_id = $1",
        )
        .bind(room)
        .fetch_all(app.db())
        .await
        .unwrap();
        assert_eq!(markers.len(), 2);
        for (marker, own_newest) in markers {
            assert!(own_newest > 0, "room {room}: both members sent");
            assert_eq!(marker, own_newest, "room {room}");
        }
    }
    let batches = app
        .state
        .chat
        .sends
        .batches
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        batches <= 2 * chirp::chat::SEND_BATCHES_IN_FLIGHT as u64,
        "43 concurrent sends committed in {batches} transactions, not one each"
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_lost_backlog_append_is_read_from_postgres_and_repaired(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, ta) = app.quick_user("alice").await;
    let (bob, tb) = app.quick_user("bob").await;
    let room = channel(&app, &ta, &[bob]).await;
    let uri = format!("/api/chat/channels/{room}/messages/");
    for i in 1..=3 {
        say(&app, &ta, room, &format!("m{i}")).await;
    }
    assert_eq!(
        ids(&app.get(&format!("{uri}?since_id=0"), Some(&tb)).await.body),
        vec![1, 2, 3]
    );
    assert!(backlog(&app, room).await.is_some(), "the poll loaded it");
    // Message 4 commits, but its append never reaches Redis (a crash or a Redis error right
    // after the commit): the backlog still looks complete, ending at 3.
    say(&app, &ta, room, "lost on its way").await;
    let key = app.list_key_of(chirp::cache::backlog::backlog_key(room));
    let cached = backlog(&app, room).await.unwrap();
    let appended: Vec<&String> = cached.iter().filter(|m| m.starts_with("4|")).collect();
    let mut r = app.redis().await;
    let _: i64 = redis::cmd("ZREM")
        .arg(&key)
        .arg(appended)
        .query_async(&mut r)
        .await
        .unwrap();
    assert!(
        !backlog(&app, room)
            .await
            .unwrap()
            .iter()
            .any(|m| m.starts_with("4|"))
    );

    let body = app.get(&format!("{uri}?since_id=3"), Some(&tb)).await.body;
    assert_eq!(ids(&body), vec![4], "not hidden by the short backlog");
    assert!(
        backlog(&app, room)
            .await
            .unwrap()
            .iter()
            .any(|m| m.starts_with("4|")),
        "put back into the backlog"
    );
    // Served from Redis again: a change behind its back does not show.
    sqlx::query("update chat_messages set content = 'changed in postgres' where id = 4")
        .execute(app.db())
        .await
        .unwrap();
    let body = app.get(&format!("{uri}?since_id=3"), Some(&tb)).await.body;
    assert_eq!(body["messages"][0]["content"], json!("lost on its way"));
    // The marker poll sees it too, and moves past it.
    assert_eq!(ids(&app.get(&uri, Some(&tb)).await.body), vec![1, 2, 3, 4]);
    assert_eq!(ids(&app.get(&uri, Some(&tb)).await.body), Vec::<i64>::new());
}

/// Found by the schema fuzzer (scripts/fuzz-api): a send refused because the caller is not a
/// member stores nothing, and its batch's cache step was an empty pipeline, which redis-rs
/// refuses with a client error, so the process marked Redis down and served every request
/// from Postgres until it answered again. Now nothing goes to Redis and nothing is marked.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_refused_send_does_not_mark_redis_down(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    let (_, tb) = app.signup("bob").await;
    let (carol, _) = app.signup("carol").await;
    let room = channel(&app, &ta, &[alice, carol]).await;
    let res = app
        .post(
            &format!("/api/chat/channels/{room}/messages/"),
            Some(&tb),
            json!({"content": "let me in"}),
        )
        .await;
    assert_eq!(res.status, StatusCode::NOT_FOUND, "{}", res.body);
    let health = app.get("/healthz", None).await.body;
    assert_eq!(health["redis"], "ok", "{health}");
    assert_eq!(health["cache"]["errors"], 0, "{health}");
}

/// A `Channel` carries `last_activity_at` in every answer (the contract's object): at creation
/// it is the channel's `created_at`, and after a message the listing gives that message's time,
/// the listing's cursor.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_channel_carries_its_last_activity_in_every_answer(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    let (bob, _) = app.signup("bob").await;
    let res = app
        .post(
            "/api/chat/channels/",
            Some(&ta),
            json!({"member_ids": [alice, bob]}),
        )
        .await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    assert_eq!(
        res.body["last_activity_at"], res.body["created_at"],
        "{}",
        res.body
    );
    let room = res.body["id"].as_i64().expect("id");
    let said = say(&app, &ta, room, "hello").await;
    let list = app.get("/api/chat/channels/", Some(&ta)).await.body;
    assert_eq!(
        list["results"][0]["last_activity_at"], said["created_at"],
        "{list}"
    );
}
