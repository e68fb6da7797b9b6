//! Mutes and blocks (issue 40): from the moment one answers, on every process, no page of the
//! viewer's newsfeed, list or circle timelines, no stream and no notification shows the
//! account, whatever the page size, cursor direction or cache state; unmuting brings it all
//! back. Blocks also remove both follows and refuse the blocked account.

use std::collections::HashSet;

use axum::http::{Method, StatusCode};
use chirp::cache::held::NearId;
use rand::Rng;
use rand::seq::IndexedRandom;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{
    Ev, Stream, TestApp, eventually, seeded_rng, tweet_ids, two_processes, urlencode,
};

async fn relation(app: &TestApp, token: &str, target: i64, action: &str) -> Value {
    let uri = format!("/api/users/{target}/{action}/");
    app.post_expecting(StatusCode::OK, &uri, Some(token), json!({}))
        .await
}

/// Every item of a timeline, newest first, paged with `created_at__lt` at `page_size`; checks
/// that every page but the last is full.
async fn page_down(app: &TestApp, base: &str, token: &str, page_size: usize) -> Vec<i64> {
    let sep = if base.contains('?') { '&' } else { '?' };
    let mut uri = format!("{base}{sep}page_size={page_size}");
    let mut all = Vec::new();
    loop {
        let res = app.get(&uri, Some(token)).await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.body);
        let results = res.body["results"].as_array().expect("results").clone();
        all.extend(tweet_ids(&res.body));
        if !res.body["has_next_page"].as_bool().expect("has_next_page") {
            return all;
        }
        assert_eq!(results.len(), page_size, "a partial page before the end");
        let last = results.last().expect("a last item")["created_at"]
            .as_str()
            .expect("created_at")
            .to_owned();
        uri = format!(
            "{base}{sep}page_size={page_size}&created_at__lt={}",
            urlencode(&last)
        );
    }
}

/// The items newer than the `from`-th newest (a refresh from it), newest first.
async fn refresh_from(app: &TestApp, base: &str, token: &str, from: &Value) -> Vec<i64> {
    let sep = if base.contains('?') { '&' } else { '?' };
    let at = from["created_at"].as_str().expect("created_at");
    let uri = format!("{base}{sep}created_at__gt={}", urlencode(at));
    let res = app.get(&uri, Some(token)).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    tweet_ids(&res.body)
}

/// What `viewer` must see of their newsfeed now, from Postgres: its rows but those of hidden
/// authors, newest first.
async fn visible_feed(db: &PgPool, viewer: i64) -> Vec<i64> {
    sqlx::query_scalar(
        "select n.tweet_id from newsfeeds n join tweets t on t.id = n.tweet_id
         where n.user_id = $1
           and t.user_id not in (select target_id from mutes where user_id = $1
                                 union all select target_id from blocks where user_id = $1
                                 union all select user_id from blocks where target_id = $1)
         order by n.created_at desc",
    )
    .bind(viewer)
    .fetch_all(db)
    .await
    .expect("model")
}

/// What `viewer` must see of list `list`'s timeline now, from Postgres.
async fn visible_list(db: &PgPool, viewer: i64, list: i64) -> Vec<i64> {
    sqlx::query_scalar(
        "select f.tweet_id from list_feeds f join tweets t on t.id = f.tweet_id
         where f.list_id = $2
           and t.user_id not in (select target_id from mutes where user_id = $1
                                 union all select target_id from blocks where user_id = $1
                                 union all select user_id from blocks where target_id = $1)
         order by f.created_at desc",
    )
    .bind(viewer)
    .bind(list)
    .fetch_all(db)
    .await
    .expect("model")
}

fn holds_hidden(app: &TestApp, user: i64) -> bool {
    let near = app.state.cache.near_objects().expect("cache on");
    near.get(&app.state.cache, &NearId::Hidden(user)).is_some()
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_mute_on_one_process_hides_the_account_at_once_on_another_and_unmute_restores_it(
    db: PgPool,
) {
    let (a, b) = two_processes(db.clone()).await;
    let (alice, at) = a.signup("alice").await;
    let (bob, bt) = a.signup("bob").await;
    let (carol, ct) = a.signup("carol").await;
    let (dave, dt) = a.signup("dave").await;
    for who in [bob, carol, dave] {
        a.follow(&at, who).await;
    }
    let list = a.new_list(&at, "friends").await;
    for who in [bob, carol] {
        a.add_to_list(&at, list, who).await;
    }
    for i in 0..6 {
        a.tweet(&bt, &format!("bob {i}")).await;
        a.tweet(&ct, &format!("carol {i}")).await;
        a.tweet(&dt, &format!("dave {i}")).await;
    }
    a.tweet(&at, "alice's own").await;
    a.drain().await;
    let feed = "/api/newsfeeds/";
    let list_uri = format!("/api/lists/{list}/timeline/");
    let everything = page_down(&b, feed, &at, 5).await;
    assert_eq!(everything.len(), 19);
    assert_eq!(page_down(&b, &list_uri, &at, 4).await.len(), 12);
    // b holds alice's hidden set (empty) in memory: the mute must evict it.
    eventually("b holds alice's hidden set", async || {
        b.get(feed, Some(&at)).await;
        holds_hidden(&b, alice)
    })
    .await;

    let res = relation(&a, &at, bob, "mute").await;
    assert_eq!(res, json!({"success": true, "muting": true}));
    // No pause: on b, at once, every page size, both cursor directions, and the list.
    let bobs: HashSet<i64> = sqlx::query_scalar("select id from tweets where user_id = $1")
        .bind(bob)
        .fetch_all(&db)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let model = visible_feed(&db, alice).await;
    assert_eq!(model.len(), 13);
    for page_size in [1, 2, 5, 13, 20] {
        assert_eq!(
            page_down(&b, feed, &at, page_size).await,
            model,
            "page_size {page_size}"
        );
        assert_eq!(
            page_down(&a, feed, &at, page_size).await,
            model,
            "page_size {page_size}"
        );
    }
    let first = b.get(&format!("{feed}?page_size=20"), Some(&at)).await.body;
    let oldest = first["results"].as_array().unwrap().last().unwrap().clone();
    let refreshed = refresh_from(&b, feed, &at, &oldest).await;
    assert_eq!(
        refreshed,
        model[..model.len() - 1],
        "a refresh shows no muted tweet"
    );
    assert_eq!(
        page_down(&b, &list_uri, &at, 4).await,
        visible_list(&db, alice, list).await
    );
    assert!(
        page_down(&b, &list_uri, &at, 1)
            .await
            .iter()
            .all(|t| !bobs.contains(t))
    );
    // The same with Redis empty (the Postgres fallback and the cold load agree).
    b.flush_cache().await;
    assert_eq!(page_down(&b, feed, &at, 3).await, model);
    // The mute is private to alice: bob's and carol's own views do not change.
    let res = b.get("/api/mutes/", Some(&at)).await;
    assert_eq!(res.body["results"][0]["id"], bob, "{}", res.body);
    let res = b.get("/api/mutes/", Some(&bt)).await;
    assert_eq!(res.body["results"], json!([]), "{}", res.body);
    // Muting again changes nothing; a muted account's profile timeline still shows.
    assert_eq!(relation(&b, &at, bob, "mute").await["muting"], true);
    let res = b
        .get(&format!("/api/tweets/?user_id={bob}"), Some(&at))
        .await;
    assert_eq!(res.body["results"].as_array().unwrap().len(), 6);

    let res = relation(&b, &at, bob, "unmute").await;
    assert_eq!(res, json!({"success": true, "muting": false}));
    for app in [&a, &b] {
        assert_eq!(
            page_down(app, feed, &at, 4).await,
            everything,
            "older ones come back too"
        );
        assert_eq!(page_down(app, &list_uri, &at, 5).await.len(), 12);
    }
    assert_eq!(relation(&a, &at, bob, "unmute").await["muting"], false);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_block_removes_both_follows_refuses_the_blocked_account_and_hides_both_ways(db: PgPool) {
    let (a, b) = two_processes(db.clone()).await;
    let (alice, at) = a.signup("alice").await;
    let (bob, bt) = a.signup("bob").await;
    a.follow(&at, bob).await;
    a.follow(&bt, alice).await;
    let hers = a.tweet(&at, "alice writes").await["id"].as_i64().unwrap();
    a.drain().await;
    let his = a.tweet(&bt, "bob writes").await["id"].as_i64().unwrap();
    a.drain().await;
    assert_eq!(
        tweet_ids(&b.get("/api/newsfeeds/", Some(&bt)).await.body),
        [his, hers]
    );

    let res = relation(&a, &at, bob, "block").await;
    assert_eq!(res, json!({"success": true, "blocking": true}));
    // At once on b: hidden both ways, before any unmerge job ran.
    assert_eq!(
        tweet_ids(&b.get("/api/newsfeeds/", Some(&bt)).await.body),
        [his]
    );
    assert_eq!(
        tweet_ids(&b.get("/api/newsfeeds/", Some(&at)).await.body),
        [hers]
    );
    // Both follows are gone, with exact counts.
    for (user, token) in [(alice, &at), (bob, &bt)] {
        let res = b.get(&format!("/api/users/{user}/"), Some(token)).await;
        assert_eq!(res.body["followers_count"], 0, "{}", res.body);
        assert_eq!(res.body["followings_count"], 0, "{}", res.body);
    }
    // bob may not follow alice, like or comment on her tweet; her tweet and timeline are 404.
    let res = b
        .post(
            &format!("/api/friendships/{alice}/follow/"),
            Some(&bt),
            json!({}),
        )
        .await;
    assert_eq!(res.status, StatusCode::FORBIDDEN, "{}", res.body);
    let like = json!({"content_type": "tweet", "object_id": hers});
    let res = b.post("/api/likes/", Some(&bt), like.clone()).await;
    assert_eq!(res.status, StatusCode::FORBIDDEN, "{}", res.body);
    let comment = json!({"tweet_id": hers, "content": "hey"});
    let res = b.post("/api/comments/", Some(&bt), comment).await;
    assert_eq!(res.status, StatusCode::FORBIDDEN, "{}", res.body);
    let res = b.get(&format!("/api/tweets/{hers}/"), Some(&bt)).await;
    assert_eq!(res.status, StatusCode::NOT_FOUND, "{}", res.body);
    let res = b
        .get(&format!("/api/tweets/?user_id={alice}"), Some(&bt))
        .await;
    assert_eq!(res.status, StatusCode::NOT_FOUND, "{}", res.body);
    let res = b
        .get(&format!("/api/comments/?tweet_id={hers}"), Some(&bt))
        .await;
    assert_eq!(res.status, StatusCode::NOT_FOUND, "{}", res.body);
    // Others still see her; she still sees bob's tweet detail (she blocked him, not he her).
    assert_eq!(
        b.get(&format!("/api/tweets/{hers}/"), None).await.status,
        StatusCode::OK
    );
    assert_eq!(
        b.get(&format!("/api/tweets/{his}/"), Some(&at))
            .await
            .status,
        StatusCode::OK
    );
    // Nothing was written by the refused requests.
    let likes: i64 = sqlx::query_scalar("select count(*) from tweet_likes")
        .fetch_one(&db)
        .await
        .unwrap();
    let comments: i64 = sqlx::query_scalar("select count(*) from comments")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!((likes, comments), (0, 0));
    // The lists are private to their owner.
    let res = b.get("/api/blocks/", Some(&at)).await;
    assert_eq!(res.body["results"][0]["id"], bob, "{}", res.body);
    assert_eq!(
        b.get("/api/blocks/", Some(&bt)).await.body["results"],
        json!([])
    );
    assert_eq!(
        b.get("/api/blocks/", None).await.status,
        StatusCode::UNAUTHORIZED
    );
    // The unmerge jobs take the rows out; pages stay the same.
    a.drain().await;
    assert_eq!(
        tweet_ids(&b.get("/api/newsfeeds/", Some(&bt)).await.body),
        [his]
    );

    assert_eq!(relation(&b, &at, bob, "unblock").await["blocking"], false);
    a.follow(&bt, alice).await;
    a.drain().await;
    // The follow's backfill puts her tweet at the top (as for any new followee).
    assert_eq!(
        tweet_ids(&a.get("/api/newsfeeds/", Some(&bt)).await.body),
        [hers, his]
    );
    assert_eq!(
        b.get(&format!("/api/tweets/{hers}/"), Some(&bt))
            .await
            .status,
        StatusCode::OK
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn bad_mutes_and_blocks_are_refused_and_change_nothing(db: PgPool) {
    let app = TestApp::new(db.clone()).await;
    let (alice, at) = app.signup("alice").await;
    for action in ["mute", "unmute", "block", "unblock"] {
        let res = app
            .post(
                &format!("/api/users/{alice}/{action}/"),
                Some(&at),
                json!({}),
            )
            .await;
        assert_eq!(
            res.status,
            StatusCode::BAD_REQUEST,
            "{action}: {}",
            res.body
        );
        let res = app
            .post(
                &format!("/api/users/999999/{action}/"),
                Some(&at),
                json!({}),
            )
            .await;
        assert_eq!(res.status, StatusCode::NOT_FOUND, "{action}: {}", res.body);
        let res = app
            .post(&format!("/api/users/{alice}/{action}/"), None, json!({}))
            .await;
        assert_eq!(
            res.status,
            StatusCode::UNAUTHORIZED,
            "{action}: {}",
            res.body
        );
    }
    let rows: i64 = sqlx::query_scalar(
        "select ((select count(*) from mutes) + (select count(*) from blocks)
              + (select sum(hidden_version) from users))::bigint",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(rows, 0);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_muted_accounts_notifications_leave_the_listing_and_the_unread_count(db: PgPool) {
    let app = TestApp::new(db.clone()).await;
    let (alice, at) = app.signup("alice").await;
    let (bob, bt) = app.signup("bob").await;
    let (carol, ct) = app.signup("carol").await;
    let tweet = app.tweet(&at, "like me").await["id"].as_i64().unwrap();
    app.like(&bt, "tweet", tweet).await;
    app.like(&ct, "tweet", tweet).await;
    let actors = |body: &Value| -> Vec<i64> {
        (body["results"].as_array().unwrap().iter())
            .map(|n| n["actor"]["id"].as_i64().unwrap())
            .collect()
    };
    let res = app.get("/api/notifications/", Some(&at)).await;
    assert_eq!(actors(&res.body), [carol, bob]);
    relation(&app, &at, bob, "mute").await;
    let res = app.get("/api/notifications/", Some(&at)).await;
    assert_eq!(actors(&res.body), [carol]);
    let res = app.get("/api/notifications/unread-count/", Some(&at)).await;
    assert_eq!(res.body["unread_count"], 1, "{}", res.body);
    // Nor can it be read or changed by its id.
    let hidden_id: i64 = sqlx::query_scalar(
        "select id from notifications where recipient_id = $1 and actor_id = $2",
    )
    .bind(alice)
    .bind(bob)
    .fetch_one(&db)
    .await
    .unwrap();
    let uri = format!("/api/notifications/{hidden_id}/");
    let res = app
        .request(Method::PUT, &uri, Some(&at), Some(json!({"unread": false})))
        .await;
    assert_eq!(res.status, StatusCode::NOT_FOUND, "{}", res.body);
    // Marking all read counts what the unread count showed.
    let res = app
        .post_expecting(
            StatusCode::OK,
            "/api/notifications/mark-all-as-read/",
            Some(&at),
            json!({}),
        )
        .await;
    assert_eq!(res["marked_count"], 1, "{res}");
    relation(&app, &at, bob, "unmute").await;
    let res = app.get("/api/notifications/", Some(&at)).await;
    assert_eq!(actors(&res.body), [carol, bob]);
    let res = app.get("/api/notifications/unread-count/", Some(&at)).await;
    assert_eq!(
        res.body["unread_count"], 0,
        "marked while muted: {}",
        res.body
    );
}

/// The model-based check over random histories: mutes, unmutes, blocks and unblocks either
/// way, posts and follows, on either process, with Redis flushed now and then; after each
/// write answers, every page of the viewer's newsfeed and list timeline, at a random page size,
/// on a random process, equals Postgres's rows without the hidden accounts' (the cached page,
/// the cold load and the Postgres fallback against one model).
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn over_random_histories_every_page_equals_the_visible_rows(db: PgPool) {
    let (seed, mut rng) = seeded_rng("CHIRP_BLOCKS_SEED", "mutes and blocks history");
    let (a, b) = two_processes(db.clone()).await;
    let (viewer, vt) = a.signup("viewer").await;
    let mut others = Vec::new();
    for i in 0..4 {
        let (id, token) = a.signup(&format!("other{i}")).await;
        a.follow(&vt, id).await;
        others.push((id, token));
    }
    let list = a.new_list(&vt, "all").await;
    for (id, _) in &others {
        a.add_to_list(&vt, list, *id).await;
    }
    for round in 0..3 {
        for (_, token) in &others {
            a.tweet(token, &format!("warm-up {round}")).await;
        }
    }
    a.drain().await;
    let list_uri = format!("/api/lists/{list}/timeline/");
    for step in 0..30 {
        let app = if rng.random_bool(0.5) { &a } else { &b };
        let (other, ot) = others.choose(&mut rng).expect("others");
        let what = match rng.random_range(0..10) {
            0 | 1 => {
                relation(app, &vt, *other, ["mute", "unmute"][rng.random_range(0..2)]).await;
                "mute/unmute"
            }
            2 => {
                relation(
                    app,
                    &vt,
                    *other,
                    ["block", "unblock"][rng.random_range(0..2)],
                )
                .await;
                "block/unblock by the viewer"
            }
            3 => {
                relation(
                    app,
                    ot,
                    viewer,
                    ["block", "unblock"][rng.random_range(0..2)],
                )
                .await;
                "block/unblock of the viewer"
            }
            4 => {
                let res = app
                    .post(
                        &format!("/api/friendships/{other}/follow/"),
                        Some(&vt),
                        json!({}),
                    )
                    .await;
                assert!(
                    [StatusCode::CREATED, StatusCode::FORBIDDEN].contains(&res.status),
                    "{}",
                    res.body
                );
                "follow"
            }
            5 => {
                a.flush_cache().await;
                "flush"
            }
            _ => {
                app.tweet(ot, &format!("step {step}")).await;
                "post"
            }
        };
        a.drain().await;
        let reader = if rng.random_bool(0.5) { &a } else { &b };
        let page_size = rng.random_range(1..8);
        let context = format!("seed {seed}, step {step} ({what}), page_size {page_size}");
        let feed = page_down(reader, "/api/newsfeeds/", &vt, page_size).await;
        assert_eq!(feed, visible_feed(&db, viewer).await, "newsfeed, {context}");
        let listed = page_down(reader, &list_uri, &vt, page_size).await;
        assert_eq!(
            listed,
            visible_list(&db, viewer, list).await,
            "list, {context}"
        );
    }
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_mute_on_one_process_silences_the_account_on_streams_of_another_and_unmute_restores(
    db: PgPool,
) {
    let (a, b) = two_processes(db).await;
    let (_, vt) = a.signup("viewer").await;
    let (bob, bt) = a.signup("bob").await;
    let (carol, ct) = a.signup("carol").await;
    a.follow(&vt, bob).await;
    a.follow(&vt, carol).await;
    let filter = format!("/api/streaming/statuses/filter/?follow={bob},{carol}");
    let mut filtered = Stream::open(&b, &filter, &vt, None).await;
    let mut feed = Stream::open(&b, "/api/streaming/user/", &vt, None).await;
    eventually("both processes subscribed", async || {
        a.state.subscriber.subscribed() && b.state.subscriber.subscribed()
    })
    .await;
    let before = a.tweet(&bt, "bob before").await["id"].as_i64().unwrap();
    a.drain().await;
    assert_eq!(stream_ids(&filtered.tweets_until(before).await), [before]);
    assert_eq!(stream_ids(&feed.tweets_until(before).await), [before]);

    let since_at = created_at_of(&a, before).await;
    relation(&a, &vt, bob, "mute").await;
    // Nothing of bob's: neither new tweets nor the delete of one the viewer had.
    let res = a.delete(&format!("/api/tweets/{before}/"), Some(&bt)).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let muted = a.tweet(&bt, "bob muted").await["id"].as_i64().unwrap();
    let shown = a.tweet(&ct, "carol shown").await["id"].as_i64().unwrap();
    a.drain().await;
    for stream in [&mut filtered, &mut feed] {
        let events = stream.tweets_until(shown).await;
        assert_eq!(stream_ids(&events), [shown]);
        assert!(
            events.iter().all(|e| e.kind != "delete"),
            "a muted account's delete"
        );
    }
    // A resume from before the mute's tweets replays only what is visible.
    let since = format!("/api/streaming/user/?since={}", urlencode(&since_at));
    let mut resumed = Stream::open(&b, &since, &vt, None).await;
    assert_eq!(stream_ids(&resumed.tweets_until(shown).await), [shown]);

    relation(&b, &vt, bob, "unmute").await;
    let back = a.tweet(&bt, "bob back").await["id"].as_i64().unwrap();
    a.drain().await;
    assert_eq!(stream_ids(&filtered.tweets_until(back).await), [back]);
    assert_eq!(stream_ids(&feed.tweets_until(back).await), [back]);
    let _ = muted;
}

fn stream_ids(events: &[Ev]) -> Vec<i64> {
    (events.iter())
        .filter(|e| e.kind == "tweet")
        .map(|e| e.data["tweet"]["id"].as_i64().expect("id"))
        .collect()
}

async fn created_at_of(app: &TestApp, tweet: i64) -> String {
    let res = app.get(&format!("/api/tweets/{tweet}/"), None).await;
    res.body["created_at"]
        .as_str()
        .expect("created_at")
        .to_owned()
}
