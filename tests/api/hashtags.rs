//! Hashtags and trends (issue 41, ../shared/API.md v3 "Hashtags and trending"): `hashtags` on
//! every Tweet, the cached hashtag timeline with the same cursors and fallback as the others
//! (exact refresh included), and trends that equal a model of the history.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use axum::http::{Method, StatusCode};
use rand::Rng;
use rand::seq::IndexedRandom;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{
    TestApp, eventually, hold_user_row, lock_waiters, page_all, seeded_rng, tweet_ids, urlencode,
};

/// The tweets of tag `tag`, paged down at `page_size`.
async fn tagged(app: &TestApp, tag: &str, page_size: usize) -> Vec<i64> {
    page_all(
        app,
        &format!("/api/hashtags/{tag}/tweets/"),
        None,
        page_size,
    )
    .await
}

async fn edit(app: &TestApp, token: &str, tweet: i64, content: &str) -> Value {
    let res = app
        .request(
            Method::PATCH,
            &format!("/api/tweets/{tweet}/"),
            Some(token),
            Some(json!({"content": content})),
        )
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    res.body
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn tweets_carry_their_hashtags_and_each_tag_lists_its_tweets(db: PgPool) {
    let app = TestApp::new(db).await;
    let (ann, ta) = app.quick_user("ann").await;
    let (_, tb) = app.quick_user("bob").await;
    let first = app
        .tweet(&ta, "Hello #Rust and #rust, #Tokio! #42 a#b")
        .await;
    assert_eq!(first["hashtags"], json!(["rust", "tokio"]));
    let first = first["id"].as_i64().unwrap();
    let second = app.tweet(&tb, "#tokio too").await["id"].as_i64().unwrap();
    let plain = app.tweet(&tb, "no tags").await;
    assert_eq!(plain["hashtags"], json!([]));

    for round in ["cold", "warm", "flushed"] {
        if round == "flushed" {
            app.flush_cache().await;
        }
        assert_eq!(tagged(&app, "RUST", 20).await, vec![first], "{round}");
        assert_eq!(
            tagged(&app, "%23tokio", 20).await,
            vec![second, first],
            "{round}"
        );
        assert_eq!(
            tagged(&app, "tokio", 1).await,
            vec![second, first],
            "{round}"
        );
        // The spliced (cached) objects carry them too.
        let page = app.get(&format!("/api/tweets/?user_id={ann}"), None).await;
        assert_eq!(
            page.body["results"][0]["hashtags"],
            json!(["rust", "tokio"])
        );
        let detail = app.get(&format!("/api/tweets/{first}/"), None).await;
        assert_eq!(detail.body["hashtags"], json!(["rust", "tokio"]), "{round}");
    }
    // A tag no tweet used: an empty page; a path that is no tag: 404.
    let none = app.get("/api/hashtags/nothing/tweets/", None).await;
    assert_eq!(none.status, StatusCode::OK);
    assert_eq!(none.body, json!({"has_next_page": false, "results": []}));
    assert_eq!(
        app.get("/api/hashtags/42/tweets/", None).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        app.get("/api/hashtags/a-b/tweets/", None).await.status,
        StatusCode::NOT_FOUND
    );
    let bad = app
        .get("/api/hashtags/rust/tweets/?created_at__lt=x", None)
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
}

/// An edit moves a tweet between tags (its `hashtags` and the tags' timelines, cached or not);
/// a delete takes it out of every tag.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn edits_and_deletes_move_a_tweet_between_tags(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, ta) = app.quick_user("ann").await;
    let id = app.tweet(&ta, "#a #b").await["id"].as_i64().unwrap();
    let other = app.tweet(&ta, "another #c").await["id"].as_i64().unwrap();
    for tag in ["a", "b", "c"] {
        tagged(&app, tag, 20).await; // cached (c's list too: the edit lists the tweet below it)
    }
    let edited = edit(&app, &ta, id, "#b #C").await;
    assert_eq!(edited["hashtags"], json!(["b", "c"]));
    for round in ["warm", "flushed"] {
        assert_eq!(tagged(&app, "a", 20).await, Vec::<i64>::new(), "{round}");
        assert_eq!(tagged(&app, "b", 20).await, vec![id], "{round}");
        assert_eq!(tagged(&app, "c", 20).await, vec![other, id], "{round}");
        app.flush_cache().await;
    }
    for tag in ["b", "c"] {
        tagged(&app, tag, 20).await; // cached again
    }
    let deleted = app.delete(&format!("/api/tweets/{id}/"), Some(&ta)).await;
    assert_eq!(deleted.status, StatusCode::OK, "{}", deleted.body);
    assert_eq!(tagged(&app, "a", 20).await, Vec::<i64>::new());
    assert_eq!(tagged(&app, "b", 20).await, Vec::<i64>::new());
    assert_eq!(tagged(&app, "c", 20).await, vec![other]);
}

/// A tag's tweets are exact (as a circle's): a post that took its time first but committed
/// after a newer one with the same tag by someone else (it waited for its author's row) still
/// comes above the newer one, so a client that refreshed from the newer one gets it, from the
/// cached list and from Postgres alike.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_tagged_post_that_commits_late_still_reaches_a_refreshing_client(db: PgPool) {
    let app = Arc::new(TestApp::new(db).await);
    let (ann, ta) = app.quick_user("ann").await;
    let (_, tb) = app.quick_user("bob").await;
    app.tweet(&tb, "first #late").await;
    let uri = "/api/hashtags/late/tweets/";

    let holder = hold_user_row(&app, ann).await;
    let late = tokio::spawn({
        let (app, ta) = (app.clone(), ta.clone());
        async move { app.tweet(&ta, "late #late").await["id"].as_i64().unwrap() }
    });
    lock_waiters(&app, 1).await;
    let on_time = app.tweet(&tb, "on time #late").await["id"]
        .as_i64()
        .unwrap();
    let page = app.get(uri, None).await;
    assert_eq!(tweet_ids(&page.body)[0], on_time);
    let newest = page.body["results"][0]["created_at"]
        .as_str()
        .unwrap()
        .to_owned();
    holder.commit().await.unwrap();
    let late = late.await.unwrap();

    let refresh = format!("{uri}?created_at__gt={}", urlencode(&newest));
    let cached = app.get(&refresh, None).await;
    assert_eq!(tweet_ids(&cached.body), vec![late], "{}", cached.body);
    app.flush_cache().await;
    assert_eq!(tweet_ids(&app.get(&refresh, None).await.body), vec![late]);
}

/// Invariants over a random history of concurrent posts, edits and deletes on a few tags, with
/// clients that refresh each tag while the writes run: a refresh never returns a tweet the
/// client holds, and once the writes end a last refresh leaves each client holding exactly
/// the tag's tweets (no tweet skipped); every tag's timeline, paged down at random sizes from
/// the cached lists and again from Postgres, is the model's (tweets whose current text has the
/// tag, newest first).
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn tag_timelines_over_random_histories(db: PgPool) {
    const TAGS: [&str; 4] = ["red", "green", "blue", "gold"];
    let (_, mut rng) = seeded_rng("CHIRP_TAGS_SEED", "hashtag history");
    let app = Arc::new(TestApp::new(db).await);
    let mut users = Vec::new();
    for name in ["ann", "bob", "cid", "dee"] {
        users.push(app.quick_user(name).await.1);
    }
    let content = |rng: &mut rand::rngs::StdRng| {
        let tags: Vec<&str> = TAGS
            .iter()
            .filter(|_| rng.random_bool(0.4))
            .copied()
            .collect();
        let mut text = String::from("x");
        for t in tags {
            text.push_str(&format!(" #{}", t.to_uppercase()));
        }
        text
    };
    let mut tweets: BTreeMap<i64, Posted> = BTreeMap::new();
    // each tag's client: what it holds, and the newest `created_at` it holds
    let mut held: HashMap<&str, (BTreeSet<i64>, Option<String>)> = HashMap::new();
    for tag in TAGS {
        held.insert(tag, (BTreeSet::new(), None));
    }

    for round in 0..6 {
        // Writes, concurrent with each other and with a refresh of every tag.
        let mut writes = Vec::new();
        for _ in 0..rng.random_range(4..10) {
            let token = users.choose(&mut rng).unwrap().clone();
            let text = content(&mut rng);
            let app = app.clone();
            writes.push(tokio::spawn(async move {
                let tweet = app.tweet(&token, &text).await;
                let at = tweet["created_at"].as_str().unwrap().to_owned();
                let tags: BTreeSet<String> = chirp::hashtags::parse(&text).into_iter().collect();
                (
                    tweet["id"].as_i64().unwrap(),
                    Posted {
                        token,
                        at,
                        tags: tags.clone(),
                        kept: tags,
                    },
                )
            }));
        }
        let mut clients = std::mem::take(&mut held);
        let app2 = app.clone();
        let reads = tokio::spawn(async move {
            for tag in TAGS {
                let client = clients.get_mut(tag).unwrap();
                refresh(&app2, tag, client).await;
            }
            clients
        });
        for w in writes {
            let (id, posted) = w.await.unwrap();
            tweets.insert(id, posted);
        }
        held = reads.await.unwrap();
        // An edit or a delete of a random tweet (its tag rows move or go).
        let ids: Vec<i64> = tweets.keys().copied().collect();
        if let Some(&id) = ids.choose(&mut rng) {
            let token = tweets[&id].token.clone();
            if rng.random_bool(0.5) {
                let text = format!("{} edited", content(&mut rng));
                edit(&app, &token, id, &text).await;
                let tweet = tweets.get_mut(&id).unwrap();
                tweet.tags = chirp::hashtags::parse(&text).into_iter().collect();
                tweet.kept = tweet.kept.intersection(&tweet.tags).cloned().collect();
            } else {
                let res = app
                    .delete(&format!("/api/tweets/{id}/"), Some(&token))
                    .await;
                assert_eq!(res.status, StatusCode::OK, "{}", res.body);
                tweets.remove(&id);
                for client in held.values_mut() {
                    client.0.remove(&id);
                }
            }
        }
        if round % 3 == 2 {
            app.flush_cache().await;
        }
    }
    // The model's timeline of a tag: tweets whose text has it now, newest first.
    let expected = |tag: &str| -> Vec<i64> {
        let mut listed: Vec<(&String, i64)> = tweets
            .iter()
            .filter(|(_, t)| t.tags.contains(tag))
            .map(|(id, t)| (&t.at, *id))
            .collect();
        listed.sort_unstable_by(|a, b| b.cmp(a));
        listed.into_iter().map(|(_, id)| id).collect()
    };
    for tag in TAGS {
        let client = held.get_mut(tag).unwrap();
        refresh(&app, tag, client).await;
        // A tag an edit added lists its tweet at the tweet's own time, which a client that
        // refreshed past it does not get (docs/API.md); every tweet that had the tag since it
        // was posted reached the client.
        for (id, tweet) in &tweets {
            if tweet.kept.contains(tag) {
                assert!(
                    client.0.contains(id),
                    "#{tag}: {id} never reached a refreshing client"
                );
            }
        }
        let page_size = rng.random_range(1..6);
        assert_eq!(
            tagged(&app, tag, page_size).await,
            expected(tag),
            "#{tag} cached"
        );
    }
    app.flush_cache().await;
    for tag in TAGS {
        assert_eq!(
            tagged(&app, tag, 3).await,
            expected(tag),
            "#{tag} from Postgres"
        );
    }
}

/// A tweet of the random history, as the model knows it.
struct Posted {
    token: String,
    /// Its `created_at`, as answered (fixed width: sorts as the times do).
    at: String,
    /// The tags of its text now.
    tags: BTreeSet<String>,
    /// The tags it has had since it was posted (no edit took them away).
    kept: BTreeSet<String>,
}

/// Refreshes a tag's client (`(held ids, newest created_at)`) with `created_at__gt` (its first
/// page at first), checking that nothing comes back it holds; returns what it got.
async fn refresh(
    app: &TestApp,
    tag: &str,
    client: &mut (BTreeSet<i64>, Option<String>),
) -> Vec<i64> {
    let uri = match &client.1 {
        Some(newest) => format!(
            "/api/hashtags/{tag}/tweets/?created_at__gt={}",
            urlencode(newest)
        ),
        None => format!("/api/hashtags/{tag}/tweets/?page_size=100"),
    };
    let res = app.get(&uri, None).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(res.body["has_next_page"], false, "{}", res.body);
    if let Some(first) = res.body["results"].as_array().unwrap().first() {
        client.1 = Some(first["created_at"].as_str().unwrap().to_owned());
    }
    let got = tweet_ids(&res.body);
    for id in &got {
        assert!(client.0.insert(*id), "#{tag}: {id} delivered again");
    }
    got
}

/// Trends equal a model of a random history (Mastodon's rule, written out again here): accounts
/// post random tags (one account often more than once: it counts once), and each post is moved
/// back to a random age, so the window and the window before it both have uses. The answer
/// is counted again once [`chirp::hashtags::TRENDS_MAX_STALE`] has passed.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn trends_equal_a_model_of_the_history(db: PgPool) {
    const TAGS: [&str; 6] = ["alpha", "beta", "gamma", "delta", "eps", "zeta"];
    // Minutes back: inside the last hour, the hour before, the day, the day before, older.
    const AGES: [i64; 10] = [1, 20, 45, 75, 100, 150, 600, 1500, 2000, 3000];
    let (_, mut rng) = seeded_rng("CHIRP_TRENDS_SEED", "trends history");
    let app = TestApp::new(db).await;
    for window in ["1h", "24h"] {
        let empty = app
            .get(&format!("/api/trends/?window={window}"), None)
            .await;
        assert_eq!(empty.body, json!([]), "{window}");
    }
    let mut users = Vec::new();
    for i in 0..8 {
        users.push(app.quick_user(&format!("user{i}")).await);
    }
    // (user, tag, minutes back) of every use
    let mut uses: Vec<(i64, &str, i64)> = Vec::new();
    for _ in 0..rng.random_range(40..90) {
        let (user, token) = users.choose(&mut rng).unwrap();
        let tags: Vec<&str> = TAGS
            .iter()
            .filter(|_| rng.random_bool(0.35))
            .copied()
            .collect();
        let age = *AGES.choose(&mut rng).unwrap();
        let text = tags
            .iter()
            .map(|t| format!("#{t}"))
            .collect::<Vec<_>>()
            .join(" ");
        let id = app.tweet(token, &format!("post {text}")).await["id"]
            .as_i64()
            .unwrap();
        sqlx::query(
            "update tweet_hashtags set created_at = created_at - make_interval(mins => $2)
             where tweet_id = $1",
        )
        .bind(id)
        .bind(i32::try_from(age).unwrap())
        .execute(app.db())
        .await
        .unwrap();
        uses.extend(tags.into_iter().map(|t| (*user, t, age)));
    }
    tokio::time::sleep(chirp::hashtags::TRENDS_MAX_STALE).await;
    for (window, minutes) in [("1h", 60), ("24h", 24 * 60)] {
        let mut expected: Vec<(f64, i64, &str, i64)> = Vec::new();
        for tag in TAGS {
            let accounts = |from: i64, to: i64| {
                let who: BTreeSet<i64> = (uses.iter())
                    .filter(|(_, t, age)| *t == tag && *age >= from && *age < to)
                    .map(|(u, ..)| *u)
                    .collect();
                who.len() as i64
            };
            let (observed, previous) = (accounts(0, minutes), accounts(minutes, 2 * minutes));
            let tweets = (uses.iter())
                .filter(|(_, t, age)| *t == tag && *age < minutes)
                .count() as i64;
            let expect = previous.max(1) as f64;
            if observed >= 3 && observed as f64 > expect {
                let score = (observed as f64 - expect).powi(2) / expect;
                expected.push((score, observed, tag, tweets));
            }
        }
        expected.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(b.2)));
        let got = app
            .get(&format!("/api/trends/?window={window}"), None)
            .await;
        assert_eq!(got.status, StatusCode::OK, "{}", got.body);
        let got: Vec<(f64, i64, String, i64)> = (got.body.as_array().unwrap().iter())
            .map(|t| {
                (
                    t["score"].as_f64().unwrap(),
                    t["accounts"].as_i64().unwrap(),
                    t["hashtag"].as_str().unwrap().to_owned(),
                    t["tweets"].as_i64().unwrap(),
                )
            })
            .collect();
        let want: Vec<(f64, i64, String, i64)> = (expected.iter())
            .map(|(s, a, t, n)| (*s, *a, (*t).to_owned(), *n))
            .collect();
        assert_eq!(got, want, "{window}: {uses:?}");
    }
    let bad = app.get("/api/trends/?window=2h", None).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    assert!(bad.body["errors"]["window"].is_array(), "{}", bad.body);
}

/// A post shows in the trends without waiting for anything but the count's age: three accounts
/// use a new tag after the trends were read (the first read after the ranking's freshness ends
/// may still answer it while the next count runs; a read after that gets the new one).
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_new_tag_trends_once_three_accounts_use_it(db: PgPool) {
    let app = TestApp::new(db).await;
    assert_eq!(app.get("/api/trends/", None).await.body, json!([]));
    for i in 0..3 {
        let (_, token) = app.quick_user(&format!("user{i}")).await;
        app.tweet(&token, "#fresh").await;
        app.tweet(&token, "#fresh again").await; // one account counts once
    }
    eventually("the tag trends", async || {
        app.get("/api/trends/", None).await.body
            == json!([{"hashtag": "fresh", "accounts": 3, "tweets": 6, "score": 4.0}])
    })
    .await;
}

/// The fleet shares one count per window through Redis: a second process answers the ranking
/// the first stored (here one planted in Redis, which no count could give) instead of counting;
/// a lock whose holder never stores a count delays a reader at most a second, after which it
/// counts itself; and without Redis each process counts for itself.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn trends_are_shared_through_redis_and_served_without_it(db: PgPool) {
    let (a, b) = crate::helpers::two_processes(db.clone()).await;
    for i in 0..3 {
        let (_, token) = a.quick_user(&format!("user{i}")).await;
        a.tweet(&token, "#shared").await;
    }
    let want = json!([{"hashtag": "shared", "accounts": 3, "tweets": 3, "score": 4.0}]);
    assert_eq!(a.get("/api/trends/", None).await.body, want);
    let key = format!("{}:{{trends}}:1h", a.prefix);
    assert!(a.raw_get(&key).await.is_some(), "the count is shared");

    let planted = json!([{"hashtag": "planted", "accounts": 9, "tweets": 9, "score": 64.0}]);
    let mut redis = a.redis().await;
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(planted.to_string())
        .arg("PX")
        .arg(5000)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(b.get("/api/trends/", None).await.body, planted);

    // A count in progress elsewhere that never ends: the reader counts itself.
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut redis)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(format!("{key}:lock"))
        .arg(1)
        .arg("PX")
        .arg(60_000)
        .query_async(&mut redis)
        .await
        .unwrap();
    tokio::time::sleep(chirp::hashtags::TRENDS_MAX_STALE).await;
    assert_eq!(a.get("/api/trends/", None).await.body, want);

    let off = TestApp::with(db, |c| c.cache = chirp::config::CacheMode::Off).await;
    assert_eq!(off.get("/api/trends/", None).await.body, want);
}
