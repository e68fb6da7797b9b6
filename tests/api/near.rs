//! The near cache of tweet and user objects, tweet counters and the heads of user, list and
//! circle timelines: pages take them from each process's memory, and a post, a delete, a
//! profile edit, a like or a comment answers only after every process forgot the old value (a
//! list's fan-out or membership job goes on only after that).

use std::sync::atomic::Ordering;

use axum::http::{Method, StatusCode};
use chirp::cache::AfterCommit;
use chirp::cache::held::NearId;
use chirp::cache::near::NearStats;
use chirp::config::Config;
use chirp::timeline::Timeline;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{CountsOf, Proxy, PubSub, TestApp, eventually, token_held_in_memory};

fn stats(app: &TestApp) -> &NearStats {
    &app.state.cache.near_objects().expect("cache on").stats
}

fn holds_tweet(app: &TestApp, id: i64) -> bool {
    holds(app, NearId::Tweet(id))
}

fn holds(app: &TestApp, object: NearId) -> bool {
    let near = app.state.cache.near_objects().expect("cache on");
    near.get(&app.state.cache, &object).is_some()
}

/// Reads `uri` on `app` until its memory holds `object`.
async fn read_until_held(app: &TestApp, uri: &str, object: NearId) {
    read_as_until_held(app, uri, None, object).await;
}

/// Reads `uri` on `app` as `token` (anonymously: `None`) until its memory holds `object`.
async fn read_as_until_held(app: &TestApp, uri: &str, token: Option<&str>, object: NearId) {
    eventually("the object is held in memory", async || {
        let res = app.get(uri, token).await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.body);
        holds(app, object)
    })
    .await;
}

/// Tweet `id` on the first page of `uri`, as `app` answers it to `token`.
async fn tweet_on_page(app: &TestApp, uri: &str, token: Option<&str>, id: i64) -> Value {
    let res = app.get(uri, token).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let results = res.body["results"].as_array().expect("results").iter();
    (results.into_iter())
        .find(|t| t["id"] == id)
        .expect("tweet on the page")
        .clone()
}

/// `field` of tweet `id` on the first page of `uri`, as `app` answers it.
async fn count_on_page(app: &TestApp, uri: &str, id: i64, field: &str) -> i64 {
    let tweet = tweet_on_page(app, uri, None, id).await;
    tweet[field].as_i64().expect("count")
}

/// Reads `uri` on `app` until a read was answered (at least in part) from its memory.
async fn held_in_memory(app: &TestApp, uri: &str) {
    let before = stats(app).hits.load(Ordering::Relaxed);
    eventually("objects are answered from memory", async || {
        let res = app.get(uri, None).await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.body);
        stats(app).hits.load(Ordering::Relaxed) > before
    })
    .await;
}

/// `has_liked` of tweet `id` on the first page of `uri`, as `app` answers it to `token`.
async fn liked_on_page(app: &TestApp, uri: &str, token: &str, id: i64) -> bool {
    let tweet = tweet_on_page(app, uri, Some(token), id).await;
    tweet["has_liked"].as_bool().expect("has_liked")
}

/// Adds tweet `id` to `user`'s liked set in Redis alone, behind every process's back (a
/// process that answers from memory does not see it).
async fn like_in_redis_alone(app: &TestApp, user: i64, id: i64) {
    let key = app.state.cache.keys().expect("cache on").liked(user);
    let added: usize = redis::cmd("SADD")
        .arg(key)
        .arg(id)
        .query_async(&mut app.redis().await)
        .await
        .expect("sadd");
    assert_eq!(added, 1);
}

/// Two processes on one Redis prefix, and a tweet of alice's: `(a, b, alice, her token, tweet)`.
async fn two_processes(db: PgPool) -> (TestApp, TestApp, i64, String, i64) {
    two_processes_with(db, |_| {}).await
}

/// [`two_processes`] with `tweak` applied to the first one's settings.
async fn two_processes_with(
    db: PgPool,
    tweak: impl FnOnce(&mut Config),
) -> (TestApp, TestApp, i64, String, i64) {
    let a = TestApp::with(db.clone(), tweak).await;
    let prefix = a.prefix.clone();
    let b = TestApp::with(db, |c| c.redis_prefix = prefix).await;
    let (alice, token) = a.signup("alice").await;
    let id = a.tweet(&token, "soon gone").await["id"]
        .as_i64()
        .expect("tweet id");
    (a, b, alice, token, id)
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_tweet_deleted_on_one_server_is_gone_at_once_from_another_that_held_it(db: PgPool) {
    let (a, b, _, token, id) = two_processes(db).await;
    let uri = format!("/api/tweets/{id}/");
    held_in_memory(&a, &uri).await;
    held_in_memory(&b, &uri).await;
    assert!(holds_tweet(&b, id));
    let res = a.delete(&uri, Some(&token)).await;
    assert!(res.status.is_success(), "{}", res.body);
    // No pause: the delete answered only after both processes forgot the tweet. (Its deleted
    // counts would send a page to Postgres anyway; the memory must not keep it either.)
    assert!(!holds_tweet(&b, id), "b still holds the deleted tweet");
    assert!(!holds_tweet(&a, id), "a still holds the deleted tweet");
    let res = b.get(&uri, None).await;
    assert_eq!(res.status, StatusCode::NOT_FOUND, "{}", res.body);
    assert_eq!(stats(&a).unconfirmed.load(Ordering::Relaxed), 0);
    assert!(stats(&b).evictions.load(Ordering::Relaxed) >= 1);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_profile_edited_on_one_server_shows_at_once_on_another_that_held_it(db: PgPool) {
    let (a, b, alice, token, _) = two_processes(db).await;
    let listing = format!("/api/tweets/?user_id={alice}");
    // The author in b's memory (hits alone could be the tweet's or its counters').
    read_until_held(&b, &listing, NearId::User(alice)).await;
    assert_eq!(
        b.get(&listing, None).await.body["results"][0]["user"]["nickname"],
        json!(null)
    );
    let edit = json!({"nickname": "Al"});
    let uri = format!("/api/users/{alice}/");
    let res = a
        .request(Method::PATCH, &uri, Some(&token), Some(edit))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert!(
        !holds(&b, NearId::User(alice)),
        "b still holds the old profile"
    );
    let page = b.get(&listing, None).await;
    assert_eq!(page.body["results"][0]["user"]["nickname"], "Al");
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_delete_whose_server_died_before_announcing_it_is_evicted_by_the_relay(db: PgPool) {
    let (a, b, _, token, id) = two_processes(db).await;
    let uri = format!("/api/tweets/{id}/");
    held_in_memory(&b, &uri).await;
    // The deleting process "dies" between its commit and its cache step.
    a.state.cache.set_after_commit(AfterCommit::Crash);
    let res = a.delete(&uri, Some(&token)).await;
    assert!(res.status.is_success(), "{}", res.body);
    a.state.cache.set_after_commit(AfterCommit::Apply);
    assert!(holds_tweet(&b, id), "nothing announced the delete yet");
    assert!(a.relay().await >= 1);
    assert!(!holds_tweet(&b, id), "the relay's eviction did not reach b");
    let res = b.get(&uri, None).await;
    assert_eq!(res.status, StatusCode::NOT_FOUND, "{}", res.body);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn with_the_object_cache_off_nothing_is_held_in_memory(db: PgPool) {
    let app = TestApp::with(db, |c| c.object_cache_secs = 0).await;
    let (_, token) = app.signup("alice").await;
    let id = app.tweet(&token, "hello").await["id"].as_i64().expect("id");
    for _ in 0..3 {
        let res = app.get(&format!("/api/tweets/{id}/"), None).await;
        assert_eq!(res.status, StatusCode::OK);
    }
    let near = app.state.cache.near_objects().expect("cache on");
    assert!(near.is_empty());
    assert_eq!(near.stats.hits.load(Ordering::Relaxed), 0);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_process_cut_off_from_redis_forgets_its_objects_and_misses_no_delete(db: PgPool) {
    let proxy = Proxy::start().await;
    let (a, b, _, token, id) = two_processes_with(db, |c| c.redis_url = proxy.url()).await;
    let uri = format!("/api/tweets/{id}/");
    held_in_memory(&a, &uri).await;
    // A loses Redis (and its subscription): an eviction now can not reach it.
    proxy.set_up(false);
    eventually("a notices the broken subscription", async || {
        a.state.cache.near_objects().expect("cache on").is_empty()
    })
    .await;
    let res = b.delete(&uri, Some(&token)).await;
    assert!(res.status.is_success(), "{}", res.body);
    // A answers from Postgres while Redis is away, and from Redis once it is back: never from
    // the memory that missed the eviction.
    assert_eq!(a.get(&uri, None).await.status, StatusCode::NOT_FOUND);
    proxy.set_up(true);
    assert!(a.recover().await);
    assert_eq!(a.get(&uri, None).await.status, StatusCode::NOT_FOUND);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_warm_page_takes_its_counters_from_memory_not_from_redis(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, token) = app.signup("alice").await;
    let id = app.tweet(&token, "counted").await["id"]
        .as_i64()
        .expect("id");
    let listing = format!("/api/tweets/?user_id={alice}");
    read_until_held(&app, &listing, NearId::Counts(id)).await;
    // Redis now says otherwise (same version, other numbers): a page that asked Redis would
    // show it; this one answers from memory.
    let key = app.counts_key(CountsOf::Tweet(id));
    let mut r = app.redis().await;
    let cached: String = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut r)
        .await
        .expect("get");
    let version = cached.split('|').next().expect("version");
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(format!("{version}|7|7"))
        .query_async(&mut r)
        .await
        .expect("set");
    assert_eq!(count_on_page(&app, &listing, id, "likes_count").await, 0);
    // A like evicts the memory and writes the new counters: the page shows them.
    let (_, bob) = app.signup("bob").await;
    app.like(&bob, "tweet", id).await;
    assert!(
        !holds(&app, NearId::Counts(id)),
        "the like left the old counters in memory"
    );
    assert_eq!(count_on_page(&app, &listing, id, "likes_count").await, 1);
    assert_eq!(count_on_page(&app, &listing, id, "comments_count").await, 0);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_like_and_a_comment_on_one_server_count_at_once_on_another_that_held_the_counters(
    db: PgPool,
) {
    let (a, b, alice, _, id) = two_processes(db).await;
    let listing = format!("/api/tweets/?user_id={alice}");
    read_until_held(&b, &listing, NearId::Counts(id)).await;
    assert_eq!(count_on_page(&b, &listing, id, "likes_count").await, 0);
    let (_, bob) = a.signup("bob").await;
    a.like(&bob, "tweet", id).await;
    // No pause: the like answered only after b forgot the old counters.
    assert!(
        !holds(&b, NearId::Counts(id)),
        "b still holds the old counters"
    );
    assert_eq!(count_on_page(&b, &listing, id, "likes_count").await, 1);
    read_until_held(&b, &listing, NearId::Counts(id)).await;
    a.comment(&bob, id, "first").await;
    assert_eq!(count_on_page(&b, &listing, id, "comments_count").await, 1);
    assert_eq!(count_on_page(&b, &listing, id, "likes_count").await, 1);
    assert_eq!(stats(&a).unconfirmed.load(Ordering::Relaxed), 0);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_like_whose_server_died_before_announcing_it_is_counted_and_shown_to_its_reader_after_the_relay(
    db: PgPool,
) {
    let (a, b, alice, _, id) = two_processes(db).await;
    let listing = format!("/api/tweets/?user_id={alice}");
    let (bob, token) = b.signup("bob").await;
    // b holds the tweet's counters and bob's liked set.
    read_as_until_held(&b, &listing, Some(&token), NearId::Counts(id)).await;
    read_as_until_held(&b, &listing, Some(&token), NearId::Likes(bob)).await;
    let held = [NearId::Counts(id), NearId::Likes(bob)];
    // The liking process "dies" between its commit and its cache step.
    a.state.cache.set_after_commit(AfterCommit::Crash);
    a.like(&token, "tweet", id).await;
    a.state.cache.set_after_commit(AfterCommit::Apply);
    assert!(
        held.iter().all(|o| holds(&b, *o)),
        "nothing announced the like yet"
    );
    assert!(a.relay().await >= 1);
    assert!(
        held.iter().all(|o| !holds(&b, *o)),
        "the relay's eviction did not reach b"
    );
    assert_eq!(count_on_page(&b, &listing, id, "likes_count").await, 1);
    assert!(liked_on_page(&b, &listing, &token, id).await);
}

/// The near-cache id of the head of `user`'s own tweets.
fn posts_head(user: i64) -> NearId {
    NearId::Head(Timeline::UserTweets(user).key())
}

/// Removes every entry but the completeness marker (whose score is -inf) from `timeline`'s list
/// in Redis, behind the near cache's back; returns how many it removed.
async fn empty_in_redis(app: &TestApp, timeline: Timeline) -> usize {
    redis::cmd("ZREMRANGEBYSCORE")
        .arg(app.list_key(timeline))
        .arg("(-inf")
        .arg("+inf")
        .query_async(&mut app.redis().await)
        .await
        .expect("zremrangebyscore")
}

/// The tweet ids on the first page of `uri`, as `app` answers it.
async fn ids_on_page(app: &TestApp, uri: &str) -> Vec<i64> {
    let res = app.get(uri, None).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let results = res.body["results"].as_array().expect("results").iter();
    results.map(|t| t["id"].as_i64().expect("id")).collect()
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_warm_user_timeline_takes_its_entries_from_memory_until_a_new_tweet_evicts_them(
    db: PgPool,
) {
    let app = TestApp::new(db).await;
    let (alice, token) = app.signup("alice").await;
    let first = app.tweet(&token, "first").await["id"].as_i64().expect("id");
    let listing = format!("/api/tweets/?user_id={alice}");
    read_until_held(&app, &listing, posts_head(alice)).await;
    // Redis's list now holds no tweet, only its completeness marker: a page that asked Redis
    // would be empty; this one answers from memory.
    assert_eq!(empty_in_redis(&app, Timeline::UserTweets(alice)).await, 1);
    assert_eq!(ids_on_page(&app, &listing).await, [first]);
    // A new tweet evicts the head before it answers: the page shows it at once.
    let second = app.tweet(&token, "second").await["id"]
        .as_i64()
        .expect("id");
    assert!(
        !holds(&app, posts_head(alice)),
        "the new tweet left the old head in memory"
    );
    assert_eq!(ids_on_page(&app, &listing).await.first(), Some(&second));
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_tweet_posted_or_deleted_on_one_server_shows_at_once_on_another_that_held_the_timeline(
    db: PgPool,
) {
    let (a, b, alice, token, first) = two_processes(db).await;
    let listing = format!("/api/tweets/?user_id={alice}");
    read_until_held(&b, &listing, posts_head(alice)).await;
    assert_eq!(ids_on_page(&b, &listing).await, [first]);
    let second = a.tweet(&token, "second").await["id"].as_i64().expect("id");
    // No pause: the post answered only after b forgot the head.
    assert!(!holds(&b, posts_head(alice)), "b still holds the old head");
    assert_eq!(ids_on_page(&b, &listing).await, [second, first]);
    read_until_held(&b, &listing, posts_head(alice)).await;
    let res = a
        .delete(&format!("/api/tweets/{second}/"), Some(&token))
        .await;
    assert!(res.status.is_success(), "{}", res.body);
    assert!(
        !holds(&b, posts_head(alice)),
        "the delete left the head in b"
    );
    assert_eq!(ids_on_page(&b, &listing).await, [first]);
    assert_eq!(stats(&a).unconfirmed.load(Ordering::Relaxed), 0);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_tweet_whose_server_died_before_announcing_it_shows_after_the_relay(db: PgPool) {
    let (a, b, alice, token, first) = two_processes(db).await;
    let listing = format!("/api/tweets/?user_id={alice}");
    read_until_held(&b, &listing, posts_head(alice)).await;
    // The posting process "dies" between its commit and its cache step.
    a.state.cache.set_after_commit(AfterCommit::Crash);
    let second = a.tweet(&token, "second").await["id"].as_i64().expect("id");
    a.state.cache.set_after_commit(AfterCommit::Apply);
    assert!(
        holds(&b, posts_head(alice)),
        "nothing announced the tweet yet"
    );
    assert!(a.relay().await >= 1);
    assert!(
        !holds(&b, posts_head(alice)),
        "the relay's eviction did not reach b"
    );
    assert_eq!(ids_on_page(&b, &listing).await, [second, first]);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_writer_counts_its_own_process_without_waiting_for_its_acknowledgement(db: PgPool) {
    let (a, b, alice, _, id) = two_processes(db).await;
    let listing = format!("/api/tweets/?user_id={alice}");
    read_until_held(&a, &listing, NearId::Counts(id)).await;
    read_until_held(&b, &listing, NearId::Counts(id)).await;
    let (_, bob) = a.signup("bob").await;
    a.like(&bob, "tweet", id).await;
    assert!(!holds(&b, NearId::Counts(id)), "b still holds the counters");
    assert!(!holds(&a, NearId::Counts(id)), "a still holds the counters");
    assert_eq!(stats(&a).unconfirmed.load(Ordering::Relaxed), 0);
    // Both processes heard the eviction; only b acknowledged it through Redis.
    let mut r = a.redis().await;
    let sets: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:*:acks", a.prefix))
        .query_async(&mut r)
        .await
        .expect("keys");
    assert!(!sets.is_empty(), "no eviction was acknowledged");
    // (One set per eviction: the like's, and one more if the outbox relay's pass came first.)
    for set in sets {
        let acks: usize = redis::cmd("SCARD")
            .arg(&set)
            .query_async(&mut r)
            .await
            .expect("scard");
        assert_eq!(
            acks, 1,
            "the writer acknowledged its own eviction through Redis"
        );
    }
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_page_that_finds_a_deleted_tweet_in_a_held_timeline_reads_the_list_again(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, token) = app.signup("alice").await;
    let kept = app.tweet(&token, "kept").await["id"].as_i64().expect("id");
    let gone = app.tweet(&token, "gone").await["id"].as_i64().expect("id");
    let listing = format!("/api/tweets/?user_id={alice}");
    read_until_held(&app, &listing, posts_head(alice)).await;
    // Where a delete has reached Redis (the tombstone) but not yet this process's memory (its
    // eviction is on its way): the page drops the entry from the list and its held head, and
    // reads the list again, instead of finding the entry in memory on every retry and giving
    // up on the cache. (Postgres keeps the row here, so a page that gave up would show it.)
    let keys = app.state.cache.keys().expect("cache on");
    let _: () = redis::cmd("SET")
        .arg(keys.tweet(gone))
        .arg("-")
        .query_async(&mut app.redis().await)
        .await
        .expect("set");
    let near = app.state.cache.near_objects().expect("cache on");
    near.forget_here(&[NearId::Tweet(gone)]);
    assert_eq!(ids_on_page(&app, &listing).await, [kept]);
    assert!(!holds(&app, NearId::Tweet(gone)));
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_tweet_posted_into_a_circle_on_one_server_shows_at_once_on_another_that_held_it(
    db: PgPool,
) {
    let (a, b, _, token, _) = two_processes(db).await;
    let res = a
        .post("/api/circles/", Some(&token), json!({"name": "near"}))
        .await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    let circle = res.body["id"].as_i64().expect("circle id");
    let post = async |content: &str| {
        let body = json!({"content": content, "circle_id": circle});
        let res = a.post("/api/tweets/", Some(&token), body).await;
        assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
        res.body["id"].as_i64().expect("id")
    };
    let first = post("first").await;
    let uri = format!("/api/circles/{circle}/tweets/");
    let head = NearId::Head(Timeline::Circle(circle).key());
    read_until_held(&b, &uri, head).await;
    let second = post("second").await;
    assert!(!holds(&b, head), "b still holds the circle's old head");
    assert_eq!(ids_on_page(&b, &uri).await, [second, first]);
}

/// `owner`'s new list holding `member`, with the member's tweets copied in (its backfill job
/// run on `app`); returns the list's id and its first page's uri.
async fn list_of(app: &TestApp, owner: &str, member: i64) -> (i64, String) {
    let list = app.new_list(owner, "near").await;
    app.add_to_list(owner, list, member).await;
    app.drain().await;
    (list, format!("/api/lists/{list}/timeline/"))
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_warm_list_timeline_takes_its_entries_from_memory_until_a_members_fan_out_evicts_them(
    db: PgPool,
) {
    let app = TestApp::new(db).await;
    let (alice, token) = app.signup("alice").await;
    let first = app.tweet(&token, "first").await["id"].as_i64().expect("id");
    let (_, owner) = app.signup("owner").await;
    let (list, uri) = list_of(&app, &owner, alice).await;
    let head = NearId::Head(Timeline::List(list).key());
    read_until_held(&app, &uri, head).await;
    // A page that asked Redis would now be empty; this one answers from memory.
    assert_eq!(empty_in_redis(&app, Timeline::List(list)).await, 1);
    assert_eq!(ids_on_page(&app, &uri).await, [first]);
    // The fan-out of alice's next tweet merges it into Redis's list and then evicts the head.
    let second = app.tweet(&token, "second").await["id"]
        .as_i64()
        .expect("id");
    app.drain().await;
    assert!(
        !holds(&app, head),
        "the fan-out left the old head in memory"
    );
    assert_eq!(ids_on_page(&app, &uri).await.first(), Some(&second));
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_list_timeline_held_on_another_server_shows_a_fanned_out_tweet_and_a_removed_member_at_once(
    db: PgPool,
) {
    let (a, b, alice, token, first) = two_processes(db).await;
    let (_, owner) = a.signup("owner").await;
    let (list, uri) = list_of(&a, &owner, alice).await;
    let head = NearId::Head(Timeline::List(list).key());
    read_until_held(&b, &uri, head).await;
    assert_eq!(ids_on_page(&b, &uri).await, [first]);
    // The fan-out job runs on a; its cache step ends only after b forgot the head.
    let second = a.tweet(&token, "second").await["id"].as_i64().expect("id");
    a.drain().await;
    assert!(!holds(&b, head), "b still holds the list's old head");
    assert_eq!(ids_on_page(&b, &uri).await, [second, first]);
    // A member removed: the unmerge job evicts the head the same way.
    read_until_held(&b, &uri, head).await;
    let res = a
        .delete(&format!("/api/lists/{list}/members/{alice}/"), Some(&owner))
        .await;
    assert!(res.status.is_success(), "{}", res.body);
    a.drain().await;
    assert!(!holds(&b, head), "the unmerge left the head in b");
    assert_eq!(ids_on_page(&b, &uri).await, Vec::<i64>::new());
    assert_eq!(stats(&a).unconfirmed.load(Ordering::Relaxed), 0);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_near_cache_smaller_than_a_page_holds_no_more_than_its_capacity_and_pages_stay_exact(
    db: PgPool,
) {
    // A page of five tweets needs twelve values (the head, five tweets and their counters,
    // the author): a memory of six turns its generations on every page.
    let app = TestApp::with(db, |c| c.near_capacity = 6).await;
    let (alice, token) = app.signup("alice").await;
    let mut ids = Vec::new();
    for n in 0..5 {
        let tweet = app.tweet(&token, &format!("tweet {n}")).await;
        ids.insert(0, tweet["id"].as_i64().expect("id"));
    }
    let listing = format!("/api/tweets/?user_id={alice}");
    for _ in 0..6 {
        assert_eq!(ids_on_page(&app, &listing).await, ids);
        let health = app.get("/healthz", None).await;
        let held = health.body["near_objects"]["held"].as_u64().expect("held");
        assert!(held <= 6, "{held} values held in a memory of 6");
    }
    let health = app.get("/healthz", None).await;
    let missed = health.body["near_objects"]["missed"]
        .as_u64()
        .expect("missed");
    assert!(missed > 0, "{}", health.body);
    // A delete still reaches the small memory.
    let gone = ids.remove(2);
    let res = app
        .delete(&format!("/api/tweets/{gone}/"), Some(&token))
        .await;
    assert!(res.status.is_success(), "{}", res.body);
    assert_eq!(ids_on_page(&app, &listing).await, ids);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_readers_likes_come_from_memory_and_a_like_or_cancel_on_another_server_shows_at_once(
    db: PgPool,
) {
    let (a, b, alice, _, id) = two_processes(db).await;
    let (bob, token) = b.signup("bob").await;
    let listing = format!("/api/tweets/?user_id={alice}");
    read_as_until_held(&b, &listing, Some(&token), NearId::Likes(bob)).await;
    // Redis's liked set now says bob liked the tweet (Postgres does not): b answers from its
    // memory, which holds the set as it was.
    like_in_redis_alone(&b, bob, id).await;
    assert!(!liked_on_page(&b, &listing, &token, id).await);
    // A like on a evicts the set everywhere before it answers: b shows it at once.
    a.like(&token, "tweet", id).await;
    assert!(
        !holds(&b, NearId::Likes(bob)),
        "b still holds bob's old likes"
    );
    assert!(liked_on_page(&b, &listing, &token, id).await);
    read_as_until_held(&b, &listing, Some(&token), NearId::Likes(bob)).await;
    assert!(liked_on_page(&b, &listing, &token, id).await);
    assert_eq!(a.unlike(&token, "tweet", id).await, 1);
    assert!(!liked_on_page(&b, &listing, &token, id).await);
    assert_eq!(stats(&a).unconfirmed.load(Ordering::Relaxed), 0);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_tweet_detail_takes_its_readers_likes_from_memory(db: PgPool) {
    let (a, b, _, alice_token, id) = two_processes(db).await;
    // A liked tweet: its detail page asks whether the reader liked it too.
    a.like(&alice_token, "tweet", id).await;
    let (bob, token) = b.signup("bob").await;
    let detail = format!("/api/tweets/{id}/");
    read_as_until_held(&b, &detail, Some(&token), NearId::Likes(bob)).await;
    let has_liked = async || {
        let res = b.get(&detail, Some(&token)).await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.body);
        res.body["has_liked"].as_bool().expect("has_liked")
    };
    // As above: Redis's set says bob liked it, b's memory (rightly) does not.
    like_in_redis_alone(&b, bob, id).await;
    assert!(!has_liked().await);
    a.like(&token, "tweet", id).await;
    assert!(has_liked().await);
}

/// Two processes on one prefix and one Redis server (also under `scripts/test --cluster`: a
/// proxy makes a process use one server): `a` through `direct`, which passes everything, `b`
/// through `proxy`; alice's token and tweet are held in `b`'s memory, her tweets' counters too.
async fn b_behind_a_proxy(
    db: PgPool,
    direct: &Proxy,
    proxy: &Proxy,
) -> (TestApp, TestApp, i64, String, i64) {
    // The default lease: writes wait at most 350 ms for `b`.
    let url = direct.url();
    let a = TestApp::with(db.clone(), |c| {
        c.redis_url = url;
        c.near_lease_ms = 300;
    })
    .await;
    let prefix = a.prefix.clone();
    let url = proxy.url();
    let b = TestApp::with(db, |c| {
        c.redis_prefix = prefix;
        c.redis_url = url;
        c.near_lease_ms = 300;
    })
    .await;
    let (alice, token, id) = alice_held_in_memory_of_b(&a, &b).await;
    (a, b, alice, token, id)
}

/// Alice signs up and tweets on `a`; `b` holds her token, her tweet and its counters in memory.
/// Returns `(alice, her token, the tweet)`.
async fn alice_held_in_memory_of_b(a: &TestApp, b: &TestApp) -> (i64, String, i64) {
    let (alice, token) = a.signup("alice").await;
    let id = a.tweet(&token, "held by b").await["id"]
        .as_i64()
        .expect("tweet id");
    held_in_memory(b, &format!("/api/tweets/{id}/")).await;
    read_until_held(
        b,
        &format!("/api/tweets/?user_id={alice}"),
        NearId::Counts(id),
    )
    .await;
    token_held_in_memory(b, &token).await;
    (alice, token, id)
}

/// A like, a logout and a delete on `a` are seen on `b` the moment they answer, whatever
/// happened to `b`'s subscription.
async fn writes_on_a_are_seen_at_once_on_b(
    a: &TestApp,
    b: &TestApp,
    alice: i64,
    token: &str,
    id: i64,
) {
    let (_, bob) = a.signup("bob").await;
    let started = std::time::Instant::now();
    a.like(&bob, "tweet", id).await;
    let listing = format!("/api/tweets/?user_id={alice}");
    assert_eq!(
        count_on_page(b, &listing, id, "likes_count").await,
        1,
        "b showed the old count"
    );
    let res = a
        .post("/api/accounts/logout/", Some(token), json!({}))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let res = b.get("/api/accounts/login_status/", Some(token)).await;
    assert_ne!(
        res.status,
        StatusCode::OK,
        "b accepted a revoked token: {}",
        res.body
    );
    let (_, carol) = a.signup("carol").await;
    let id2 = a.tweet(&carol, "short-lived").await["id"]
        .as_i64()
        .expect("id");
    let uri = format!("/api/tweets/{id2}/");
    let _ = b.get(&uri, None).await;
    let res = a.delete(&uri, Some(&carol)).await;
    assert!(res.status.is_success(), "{}", res.body);
    assert_eq!(b.get(&uri, None).await.status, StatusCode::NOT_FOUND);
    // Each write waited at most a lease bound for b (about 350 ms), not ACK_WAIT or longer.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// `b`'s subscription (through `proxy`) goes half-open: Redis drops it and `b` is told nothing.
/// Writes on `a` are seen on `b` at once; `b` notices the silence, subscribes again and holds a
/// new lease (a higher term) once the proxy passes again.
async fn half_open_then_back(
    a: &TestApp,
    b: &TestApp,
    proxy: &Proxy,
    alice: i64,
    token: &str,
    id: i64,
) {
    let term = b.state.subscriber.lease().term();
    proxy.set_pubsub(PubSub::HalfOpen);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(b.state.subscriber.subscribed(), "b was told nothing");
    writes_on_a_are_seen_at_once_on_b(a, b, alice, token, id).await;
    proxy.set_pubsub(PubSub::Pass);
    lease_back(b, alice, term).await;
}

/// `b`'s subscription (through `proxy`) stalls: Redis still counts it, `b` hears nothing.
/// Writes on `a` wait at most `b`'s lease and are seen on `b` at once; when the stall ends `b`
/// holds a new lease, and what it hears came in order (the like's eviction before the renewal).
async fn stalled_then_back(
    a: &TestApp,
    b: &TestApp,
    proxy: &Proxy,
    alice: i64,
    token: &str,
    id: i64,
) {
    let term = b.state.subscriber.lease().term();
    proxy.set_pubsub(PubSub::Stall);
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    writes_on_a_are_seen_at_once_on_b(a, b, alice, token, id).await;
    proxy.set_pubsub(PubSub::Pass);
    lease_back(b, alice, term).await;
    let listing = format!("/api/tweets/?user_id={alice}");
    assert_eq!(count_on_page(b, &listing, id, "likes_count").await, 1);
}

/// Waits until `b` holds a lease of a later term than `term` (granted after its lapse).
async fn lease_back(b: &TestApp, alice: i64, term: u64) {
    eventually("b holds a new lease", async || {
        let _ = b.get(&format!("/api/tweets/?user_id={alice}"), None).await;
        let lease = b.state.subscriber.lease();
        lease.held() && lease.term() > term
    })
    .await;
}

/// Review of 2026-11-26, finding 1(a): `b`'s subscription dies silently (Redis dropped it, `b`
/// was told nothing), so `PUBLISH` no longer counts `b` and writers waited for nobody, while
/// `b` kept answering from memory for up to 60 s (a revoked token accepted). Now `b`'s lease
/// runs out without its heartbeats, writers wait for its registration, and `b` subscribes
/// again once it has heard nothing for a few lease lengths.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_half_open_subscription_stops_its_process_answering_from_memory(db: PgPool) {
    let (direct, proxy) = (Proxy::start().await, Proxy::start().await);
    let (a, b, alice, token, id) = b_behind_a_proxy(db, &direct, &proxy).await;
    half_open_then_back(&a, &b, &proxy, alice, &token, id).await;
}

/// History checker seed 13830657338877334502 (at 118 s, right after "node 1 subscription
/// half-open for 899 ms"): a token revoked on node 1 was 200 OK on node 0. Here the writer is
/// the process whose subscription is half-open: `b` logs out at several moments of the fault
/// (its lease held, run out, the proxy passing again while `b` still listens on the dead
/// connection, `b` subscribing again), and `a`, which holds the token in memory, refuses it
/// once the logout answered.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_logout_on_a_process_whose_subscription_is_half_open_is_refused_everywhere(db: PgPool) {
    let (direct, proxy) = (Proxy::start().await, Proxy::start().await);
    let (a, b, _, _, _) = b_behind_a_proxy(db, &direct, &proxy).await;
    // (ms half-open before the logout, ms passing again before it)
    let moments = [
        (0, 0),
        (400, 0),
        (900, 0),
        (900, 200),
        (900, 350),
        (900, 500),
    ];
    for (i, (open, passing)) in moments.into_iter().enumerate() {
        let (_, token) = b.signup(&format!("carol{i}")).await;
        token_held_in_memory(&a, &token).await;
        if i % 2 == 1 {
            // Gone from Redis: `b` brings it back from Postgres for the logout itself.
            a.drop_token_from_redis(&token).await;
        }
        proxy.set_pubsub(PubSub::HalfOpen);
        tokio::time::sleep(std::time::Duration::from_millis(open)).await;
        if passing > 0 {
            proxy.set_pubsub(PubSub::Pass);
            tokio::time::sleep(std::time::Duration::from_millis(passing)).await;
        }
        let what = format!("logout {open} ms into the fault, {passing} ms after it");
        b.logout_refused_on(&a, &token, &what).await;
        proxy.set_pubsub(PubSub::Pass);
        eventually("b holds a lease again", async || {
            let _ = b.get("/api/accounts/login_status/", None).await;
            b.state.subscriber.lease().held()
        })
        .await;
    }
}

/// Review of 2026-11-26, finding 1(b): `b`'s subscription stalls (Redis still counts it, `b`
/// hears nothing). Writers waited 500 ms and answered anyway while `b` kept answering from
/// memory. Now they wait at most `b`'s lease, which runs out; what `b` hears when the stall
/// ends comes in order, evictions before the heartbeat that renews its lease.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_stalled_subscription_stops_its_process_answering_from_memory(db: PgPool) {
    let (direct, proxy) = (Proxy::start().await, Proxy::start().await);
    let (a, b, alice, token, id) = b_behind_a_proxy(db, &direct, &proxy).await;
    stalled_then_back(&a, &b, &proxy, alice, &token, id).await;
}

/// Review of 2026-11-26, findings 1(a) and 1(b), on the Redis Cluster (`scripts/test
/// --cluster`): `a` and `b` as [`b_behind_a_proxy`] sets them up, but `b` reaches the cluster
/// directly and only its subscriber connection, to the master of the `{bus}` slot, goes through
/// `proxy` (`Cache::route_subscriber`). `None` on one server (the tests above cover it).
async fn b_subscribed_through_a_proxy_on_the_cluster(
    db: PgPool,
) -> Option<(TestApp, TestApp, Proxy, i64, String, i64)> {
    let a = TestApp::with(db.clone(), |c| c.near_lease_ms = 300).await;
    if a.state.config.redis_cluster.is_empty() {
        return None;
    }
    let prefix = a.prefix.clone();
    let b = TestApp::with(db, |c| {
        c.redis_prefix = prefix;
        c.near_lease_ms = 300;
    })
    .await;
    // Every process subscribes on the master of the `{bus}` slot: b through the proxy, from
    // its first subscription on (it starts on first use).
    let channel = b.state.cache.topic("objects").expect("cache on");
    let mut redis = b.redis().await;
    let slot = redis
        .slot_of(&channel)
        .await
        .expect("slot")
        .expect("cluster");
    let masters = redis.masters().await.expect("masters").expect("cluster");
    let master = (masters.iter().find(|m| m.serves(slot)))
        .expect("a master")
        .addr
        .clone();
    let proxy = Proxy::to(&format!("redis://{}:{}/", master.0, master.1)).await;
    b.state.cache.route_subscriber(master, proxy.url());
    let (alice, token, id) = alice_held_in_memory_of_b(&a, &b).await;
    Some((a, b, proxy, alice, token, id))
}

/// Finding 1(a) on the Cluster: `b`'s subscription goes half-open. As on one server, writes on
/// `a` are seen on `b` the moment they answer (they wait for `b`'s acknowledgement or its
/// lease), `b`'s lease runs out, and `b` subscribes again and holds a new lease once the proxy
/// passes again.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn on_the_cluster_a_half_open_subscription_stops_its_process_answering_from_memory(
    db: PgPool,
) {
    let Some((a, b, proxy, alice, token, id)) =
        b_subscribed_through_a_proxy_on_the_cluster(db).await
    else {
        return; // one server: a_half_open_subscription_stops_its_process_answering_from_memory
    };
    half_open_then_back(&a, &b, &proxy, alice, &token, id).await;
}

/// Finding 1(b) on the Cluster: `b`'s subscription stalls (the master still counts it, `b`
/// hears nothing). Writes on `a` wait at most `b`'s lease and are seen on `b` at once; when the
/// stall ends `b` hears the evictions before the heartbeat that renews its lease.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn on_the_cluster_a_stalled_subscription_stops_its_process_answering_from_memory(db: PgPool) {
    let Some((a, b, proxy, alice, token, id)) =
        b_subscribed_through_a_proxy_on_the_cluster(db).await
    else {
        return; // one server: a_stalled_subscription_stops_its_process_answering_from_memory
    };
    stalled_then_back(&a, &b, &proxy, alice, &token, id).await;
}

/// Two processes for hand-offs: `b` reaches Redis through a proxy that stays up, `a` the same
/// Redis (one prefix) through `cut`, which the test cuts; `b`'s monitor runs on `monitor_db`
/// (its outbox relay and hand-off listener), and alice, signed up on `b`, has her token held in
/// `b`'s memory.
struct HandOff {
    a: TestApp,
    b: TestApp,
    cut: Proxy,
    _direct: Proxy,
    stop: tokio::sync::watch::Sender<bool>,
    monitor: tokio::task::JoinHandle<()>,
    token: String,
}

impl HandOff {
    /// `lease_ms`: both processes' lease length (`CHIRP_NEAR_LEASE_MS`), so also how long `a`
    /// waits for its hand-off to be applied.
    async fn start(db: PgPool, lease_ms: u64, monitor_db: impl FnOnce(&TestApp) -> PgPool) -> Self {
        let (direct, cut) = (Proxy::start().await, Proxy::start().await);
        let url = direct.url();
        let b = TestApp::with(db.clone(), |c| {
            c.redis_url = url;
            c.near_lease_ms = lease_ms;
        })
        .await;
        let (prefix, url) = (b.prefix.clone(), cut.url());
        let a = TestApp::with(db, |c| {
            c.redis_prefix = prefix;
            c.redis_url = url;
            c.near_lease_ms = lease_ms;
        })
        .await;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let monitor = tokio::spawn(chirp::cache::outbox::monitor(
            b.state.cache.clone(),
            monitor_db(&b),
            stopped,
        ));
        let (_, token) = b.signup("alice").await;
        token_held_in_memory(&b, &token).await;
        HandOff {
            a,
            b,
            cut,
            _direct: direct,
            stop,
            monitor,
            token,
        }
    }

    /// Whether `b`'s monitor listens for hand-offs: an idle connection whose last statement
    /// was the LISTEN.
    async fn b_listens(&self) -> bool {
        sqlx::query_scalar(
            "select exists (select 1 from pg_stat_activity
                            where datname = current_database() and state = 'idle'
                              and query ilike 'listen %chirp_outbox%')",
        )
        .fetch_one(self.b.db())
        .await
        .expect("pg_stat_activity")
    }

    /// Cuts `a` off from Redis, logs alice out on `a`, and asserts that `b` refuses her token
    /// once the logout answered.
    async fn logout_on_a_cut_off(&self) {
        self.cut.set_up(false);
        let res = (self.a)
            .post("/api/accounts/logout/", Some(&self.token), json!({}))
            .await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.body);
        self.assert_b_refuses_the_token().await;
    }

    async fn assert_b_refuses_the_token(&self) {
        let res = (self.b)
            .get("/api/accounts/login_status/", Some(&self.token))
            .await;
        assert_ne!(
            res.status,
            StatusCode::OK,
            "b accepted a revoked token: {}",
            res.body
        );
    }

    async fn stop(self) {
        self.stop.send_replace(true);
        self.monitor.await.expect("monitor");
    }
}

/// Review of 2026-11-26, finding 2: a write whose own Redis step fails (here `a` is cut off
/// from Redis) answered at once, and `b` served the old values from memory until a relay took
/// the row 5 s later. Now `a` hands the row to every process through Postgres; `b`'s monitor
/// applies it (the tombstone, then the revocation everywhere) before `a` answers.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_logout_whose_redis_step_fails_is_handed_off_before_it_answers(db: PgPool) {
    // A lease of 5 s: a waits that long for b's monitor to apply the row before it answers
    // without (with the tests' 1 s, a busy CI run on the cluster once took longer, and a
    // answered correctly but with the row left: b's lease, not its monitor, had covered it).
    let t = HandOff::start(db, 5000, |b| b.state.db.clone()).await;
    // Once b's monitor listens for hand-offs (a fixed 300 ms was too short on a loaded
    // machine), cut a off.
    eventually("b's monitor listens for hand-offs", async || {
        t.b_listens().await
    })
    .await;
    t.logout_on_a_cut_off().await;
    // b's own applied rows (alice's signup) may still wait for b's deleter.
    t.b.state.cache.forgotten().await;
    assert_eq!(
        t.a.outbox_rows().await,
        0,
        "b's monitor applied the handed-off row"
    );
    t.stop().await;
}

/// Finding 2 through a second fault: `b`'s hand-off listener is cut off silently (its Postgres
/// connection half-open: `b` is told nothing), so `b` never hears the row `a` hands off. `a`'s
/// logout answered after one lease bound and `b` went on accepting the revoked token from its
/// memory until a relay took the row seconds later. Now `b` uses Redis and its memory only
/// while its echoes come back on the connection that hears hand-offs ([`chirp::cache::handoff`]):
/// when `a` answers, `b` asks Postgres. Once the connection passes again, `b` relays the row
/// before it uses Redis again, even if a listener it opened meanwhile went half-open unanswered.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_process_whose_hand_off_listener_is_cut_off_refuses_a_revoked_token_when_logout_answers(
    db: PgPool,
) {
    // b's monitor reaches Postgres through a proxy that can leave its LISTEN half-open.
    let (pg, through) = Proxy::to_postgres(&db).await;
    let t = HandOff::start(db, 1000, |_| through).await;
    eventually("b's monitor listens for hand-offs", async || {
        t.b_listens().await
    })
    .await;
    pg.set_pubsub(PubSub::HalfOpen);
    eventually("Postgres dropped b's listener", async || {
        !t.b_listens().await
    })
    .await;
    t.logout_on_a_cut_off().await;
    assert!(!t.b.state.cache.available(), "b no longer uses Redis");
    // b hears none of its echoes and listens again; that connection's LISTEN is swallowed and
    // the connection left half-open too (it held b's listener for good, unanswered: found by
    // the history checker). Then the proxy passes again: b listens, relays the row, and uses
    // Redis again.
    eventually("b's second listener went half-open", async || {
        pg.half_opened() >= 2
    })
    .await;
    pg.set_pubsub(PubSub::Pass);
    eventually("b uses Redis again", async || t.b.state.cache.available()).await;
    t.b.state.cache.forgotten().await;
    assert_eq!(t.a.outbox_rows().await, 0, "b's recovery relayed the row");
    t.assert_b_refuses_the_token().await;
    t.stop().await;
}

/// Review of 2026-11-26, finding 12: a fence run by another process (Redis came back with other
/// data, and that process cleared it and started a new epoch) left this process trusting what
/// it had read from the Redis before the fence. Now its epoch check sees the new epoch and its
/// memory is forgotten.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_fence_run_by_another_process_clears_this_ones_memory(db: PgPool) {
    let (a, b, _, _, id) = two_processes(db).await;
    let uri = format!("/api/tweets/{id}/");
    held_in_memory(&b, &uri).await;
    // Redis loses everything; a's recovery fences it (a new epoch).
    a.flush_cache().await;
    assert!(a.recover().await);
    assert!(a.stat("fences") >= 2, "a fenced");
    // b's next epoch check (its monitor's, every second).
    let trusted = chirp::cache::epoch::is_trusted(&b.state.cache, b.db()).await;
    assert!(trusted.expect("epoch check"), "the new epoch is recorded");
    assert!(
        !holds_tweet(&b, id),
        "b kept what it read before another process's fence"
    );
}

/// Review of 2026-11-26, finding 13: a process that is shutting down dropped its subscription
/// but kept answering from memory (requests and jobs still in flight). Now the lease goes with
/// the subscription.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_stopping_process_no_longer_answers_from_memory(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, token) = app.signup("alice").await;
    let id = app.tweet(&token, "held").await["id"].as_i64().expect("id");
    held_in_memory(&app, &format!("/api/tweets/{id}/")).await;
    let _ = app.state.shutdown.send(true);
    eventually("the stopping process forgot its memory", async || {
        !holds_tweet(&app, id)
    })
    .await;
}
