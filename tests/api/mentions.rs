//! Mentions (issue 41, ../shared/API.md v3 "Replies, threads and mentions"): `@username`
//! resolved when posted (and edited), `mentions` hydrated as the users are now on every path
//! (detail, pages warm, flushed, on a second process whose memory held the old user, with
//! Redis down) against a model of random histories, the `mentioned you` notification (not
//! for mutes and blocks), `statuses/filter`'s `follow`, and a retweet's original.

use std::collections::HashMap;

use axum::http::{Method, StatusCode};
use rand::Rng;
use rand::seq::IndexedRandom;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::helpers::{Proxy, Stream, TestApp, page_tweets, seeded_rng, two_processes};

/// `(id, username)` of each of a Tweet's `mentions`.
fn mentions(tweet: &Value) -> Vec<(i64, String)> {
    tweet["mentions"]
        .as_array()
        .unwrap_or_else(|| panic!("no mentions: {tweet}"))
        .iter()
        .map(|u| {
            (
                u["id"].as_i64().expect("id"),
                u["username"].as_str().expect("username").to_owned(),
            )
        })
        .collect()
}

async fn detail(app: &TestApp, id: i64) -> Value {
    let res = app.get(&format!("/api/tweets/{id}/"), None).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    res.body
}

async fn rename(app: &TestApp, id: i64, token: &str, nickname: &str) {
    let uri = format!("/api/users/{id}/");
    let body = json!({ "nickname": nickname });
    let res = app
        .request(Method::PATCH, &uri, Some(token), Some(body))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
}

/// `(verb, actor id, target id)` of `token`'s notifications, newest first.
async fn notifications(app: &TestApp, token: &str) -> Vec<(String, i64, i64)> {
    let res = app
        .get("/api/notifications/?page_size=100", Some(token))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    res.body["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|n| {
            (
                n["verb"].as_str().expect("verb").to_owned(),
                n["actor"]["id"].as_i64().expect("actor"),
                n["target_id"].as_i64().expect("target"),
            )
        })
        .collect()
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_tweet_mentions_whom_its_text_named_when_posted_as_they_are_now(db: PgPool) {
    let app = TestApp::new(db).await;
    let (ann, ta) = app.quick_user("ann").await;
    let (bob, tb) = app.quick_user("bob").await;
    let (cat, _) = app.quick_user("cat").await;
    app.follow(&tb, ann).await;
    let posted = app
        .tweet(
            &ta,
            "hi @Bob and @cat, not @nobody nor mail@bob.com, @bob again, @dan later",
        )
        .await;
    let id = posted["id"].as_i64().unwrap();
    let want = vec![(bob, "bob".to_owned()), (cat, "cat".to_owned())];
    assert_eq!(mentions(&posted), want, "{posted}");
    assert_eq!(
        posted["content"].as_str().unwrap().len(),
        70,
        "the text as written"
    );
    // An account taking a name after the post is not mentioned by it.
    let (dan, td) = app.quick_user("dan").await;
    app.drain().await;
    for round in ["cold", "warm", "flushed"] {
        assert_eq!(mentions(&detail(&app, id).await), want, "{round}: detail");
        for (uri, token) in [
            (format!("/api/tweets/?user_id={ann}"), None),
            ("/api/newsfeeds/".to_owned(), Some(tb.as_str())),
        ] {
            let page = page_tweets(&app, &uri, token, 5).await;
            assert_eq!(mentions(&page[0]), want, "{round}: {uri}");
        }
        if round == "warm" {
            app.flush_cache().await;
        }
    }
    // A profile edit shows in the mentions of cached pages too, as in the author's.
    let detail_before = detail(&app, id).await;
    assert_eq!(detail_before["mentions"][0]["nickname"], Value::Null);
    rename(&app, bob, &tb, "Robert").await;
    let page = page_tweets(&app, "/api/newsfeeds/", Some(&tb), 5).await;
    assert_eq!(page[0]["mentions"][0]["nickname"], "Robert", "{}", page[0]);
    assert_eq!(detail(&app, id).await["mentions"][0]["nickname"], "Robert");

    // An edit resolves the names again: dan exists now.
    let res = app
        .request(
            Method::PATCH,
            &format!("/api/tweets/{id}/"),
            Some(&ta),
            Some(json!({"content": "now @dan and @cat"})),
        )
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let want = vec![(dan, "dan".to_owned()), (cat, "cat".to_owned())];
    assert_eq!(mentions(&res.body), want, "{}", res.body);
    let page = page_tweets(&app, &format!("/api/tweets/?user_id={ann}"), None, 5).await;
    assert_eq!(mentions(&page[0]), want);
    // Notified once each: bob and cat by the post, dan by the edit (cat not again).
    assert_eq!(
        notifications(&app, &td).await,
        vec![("mentioned you".to_owned(), ann, id)]
    );
    assert_eq!(
        notifications(&app, &tb).await,
        vec![("mentioned you".to_owned(), ann, id)]
    );

    // A retweet's original carries its mentions; the retweet (no text) has none.
    let res = app
        .post(&format!("/api/tweets/{id}/retweet/"), Some(&tb), json!({}))
        .await;
    assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
    assert_eq!(mentions(&res.body), vec![]);
    assert_eq!(mentions(&res.body["retweeted_tweet"]), want, "{}", res.body);
    app.drain().await;
    app.flush_cache().await;
    let page = page_tweets(&app, &format!("/api/tweets/?user_id={bob}"), None, 5).await;
    assert_eq!(mentions(&page[0]["retweeted_tweet"]), want, "{}", page[0]);

    // The tweet's delete takes its notifications along.
    let res = app.delete(&format!("/api/tweets/{id}/"), Some(&ta)).await;
    assert!(res.status.is_success(), "{}", res.body);
    assert_eq!(notifications(&app, &td).await, vec![]);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_mention_notifies_unless_the_mentioned_mutes_or_blocks_the_author(db: PgPool) {
    let app = TestApp::new(db).await;
    let (ann, ta) = app.quick_user("ann").await;
    let names = ["bob", "cat", "dan", "eve"];
    let mut users = HashMap::new();
    for name in names {
        users.insert(name, app.quick_user(name).await);
    }
    let post = |uri: String, token: String| {
        let app = &app;
        async move {
            let res = app.post(&uri, Some(&token), json!({})).await;
            assert!(res.status.is_success(), "{uri}: {}", res.body);
        }
    };
    // cat mutes ann, dan blocks ann, ann blocks eve.
    post(format!("/api/users/{ann}/mute/"), users["cat"].1.clone()).await;
    post(format!("/api/users/{ann}/block/"), users["dan"].1.clone()).await;
    post(format!("/api/users/{}/block/", users["eve"].0), ta.clone()).await;
    let tweet = app.tweet(&ta, "@bob @cat @dan @eve @ann").await;
    let id = tweet["id"].as_i64().unwrap();
    // Whom it mentions does not depend on who may see it.
    assert_eq!(tweet["mentions"].as_array().unwrap().len(), 5, "{tweet}");
    assert_eq!(
        notifications(&app, &users["bob"].1).await,
        vec![("mentioned you".to_owned(), ann, id)]
    );
    for name in ["cat", "dan", "eve"] {
        assert_eq!(notifications(&app, &users[name].1).await, vec![], "{name}");
    }
    assert_eq!(notifications(&app, &ta).await, vec![], "not for oneself");
    // Not stored either: an unmute does not bring it back.
    post(format!("/api/users/{ann}/unmute/"), users["cat"].1.clone()).await;
    assert_eq!(notifications(&app, &users["cat"].1).await, vec![]);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn follow_on_statuses_filter_delivers_the_tweets_that_mention_the_account(db: PgPool) {
    let app = TestApp::new(db).await;
    let (bob, _) = app.signup("bob").await;
    let (_, ta) = app.signup("ann").await;
    let (_, tc) = app.signup("cat").await;
    let uri = format!("/api/streaming/statuses/filter/?follow={bob}");
    let mut s = Stream::open(&app, &uri, &tc, None).await;
    app.tweet(&ta, "about @cat only").await;
    let mentioning = app.tweet(&ta, "hello @bob").await;
    let id = mentioning["id"].as_i64().unwrap();
    let events = s.tweets_until(id).await;
    let got: Vec<&Value> = events
        .iter()
        .filter(|e| e.kind == "tweet")
        .map(|e| &e.data["tweet"])
        .collect();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["id"], id);
    assert_eq!(got[0]["mentions"][0]["id"], bob, "{}", got[0]);
}

/// What the model knows of a tweet.
#[derive(Debug, Clone)]
struct Posted {
    author: usize,
    /// The users its text named when posted or last edited, resolved then.
    mentioned: Vec<usize>,
}

/// Random histories of posts naming existing, not yet existing and unknown users, renames,
/// sign-ups, edits and follows: every Tweet object on every path mentions exactly whom its
/// text named when it was written, with the users' current nicknames. Checked on the writing
/// process, on a second one whose memory held the users before their renames, after a flush,
/// and with Redis down.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn mentions_follow_the_text_as_written_and_the_users_as_they_are(db: PgPool) {
    let (seed, mut rng) = seeded_rng("CHIRP_MENTIONS_SEED", "mentions history");
    let (a, b) = two_processes(db.clone()).await;
    const NAMES: [&str; 8] = ["amy", "ben", "cid", "dee", "eli", "fay", "gus", "hal"];
    // `users[i]`: (id, token) once signed up; nicknames by index.
    let mut users: Vec<Option<(i64, String)>> = vec![None; NAMES.len()];
    let mut nicknames: Vec<Option<String>> = vec![None; NAMES.len()];
    for i in 0..4 {
        users[i] = Some(a.quick_user(NAMES[i]).await);
    }
    let mut tweets: Vec<(i64, Posted)> = Vec::new();
    let text = |rng: &mut rand::rngs::StdRng, users: &[Option<(i64, String)>]| {
        let mut words = vec!["hey".to_owned()];
        let mut named = Vec::new();
        for _ in 0..rng.random_range(0..4) {
            let word = match rng.random_range(0..10) {
                0 => "@nobody".to_owned(),
                1 => "x@amy.com".to_owned(),
                _ => {
                    let i = rng.random_range(0..NAMES.len());
                    if users[i].is_some() && !named.contains(&i) {
                        named.push(i);
                    }
                    let name = if rng.random_bool(0.3) {
                        NAMES[i].to_uppercase()
                    } else {
                        NAMES[i].to_owned()
                    };
                    format!("@{name},")
                }
            };
            words.push(word);
        }
        (words.join(" "), named)
    };
    for step in 0..60 {
        let signed: Vec<usize> = (0..NAMES.len()).filter(|i| users[*i].is_some()).collect();
        let &who = signed.choose(&mut rng).expect("users");
        let (who_id, who_token) = users[who].clone().expect("signed up");
        match rng.random_range(0..10) {
            0..=4 => {
                let (content, named) = text(&mut rng, &users);
                let res = a
                    .post(
                        "/api/tweets/",
                        Some(&who_token),
                        json!({ "content": content }),
                    )
                    .await;
                assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
                let id = res.body["id"].as_i64().expect("id");
                tweets.push((
                    id,
                    Posted {
                        author: who,
                        mentioned: named,
                    },
                ));
            }
            5 => {
                let nickname = format!("{}{step}", NAMES[who]);
                rename(&a, who_id, &who_token, &nickname).await;
                nicknames[who] = Some(nickname);
            }
            6 => {
                if let Some(i) = (0..NAMES.len()).find(|i| users[*i].is_none()) {
                    users[i] = Some(a.quick_user(NAMES[i]).await);
                }
            }
            7 => {
                let own: Vec<usize> = (0..tweets.len())
                    .filter(|t| tweets[*t].1.author == who)
                    .collect();
                if let Some(&t) = own.choose(&mut rng) {
                    let (content, named) = text(&mut rng, &users);
                    let uri = format!("/api/tweets/{}/", tweets[t].0);
                    let body = json!({ "content": format!("{content} (edit {step})") });
                    let res = a
                        .request(Method::PATCH, &uri, Some(&who_token), Some(body))
                        .await;
                    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
                    tweets[t].1.mentioned = named;
                }
            }
            _ => {
                let &other = signed.choose(&mut rng).expect("users");
                let other_id = users[other].as_ref().expect("signed up").0;
                if other != who {
                    let res = a
                        .post(
                            &format!("/api/friendships/{other_id}/follow/"),
                            Some(&who_token),
                            json!({}),
                        )
                        .await;
                    assert!(res.status.is_success(), "{}", res.body);
                }
            }
        }
        // The second process reads now and then: its memory holds users and tweets that the
        // writes above change.
        if step % 7 == 0 {
            for (i, user) in users.iter().enumerate().filter(|(_, u)| u.is_some()) {
                let (id, token) = user.clone().expect("signed up");
                page_tweets(&b, &format!("/api/tweets/?user_id={id}"), None, 4).await;
                page_tweets(&b, "/api/newsfeeds/", Some(&token), 4).await;
                let _ = i;
            }
        }
    }
    a.drain().await;
    let by_id: HashMap<i64, Posted> = tweets.iter().cloned().collect();
    let expected = |posted: &Posted| -> Vec<(i64, String, Value)> {
        posted
            .mentioned
            .iter()
            .map(|i| {
                let id = users[*i].as_ref().expect("mentioned users exist").0;
                let nick = nicknames[*i].clone().map_or(Value::Null, Value::from);
                (id, NAMES[*i].to_owned(), nick)
            })
            .collect()
    };
    let seen = |tweet: &Value| -> Vec<(i64, String, Value)> {
        (tweet["mentions"].as_array())
            .unwrap_or_else(|| panic!("no mentions: {tweet}"))
            .iter()
            .map(|u| {
                (
                    u["id"].as_i64().expect("id"),
                    u["username"].as_str().expect("username").to_owned(),
                    u["nickname"].clone(),
                )
            })
            .collect()
    };
    let check = async |app: &TestApp, ctx: &str| {
        let mut checked = 0;
        for user in users.iter().flatten() {
            let (id, token) = user;
            for uri in [
                format!("/api/tweets/?user_id={id}"),
                "/api/newsfeeds/".to_owned(),
            ] {
                for tweet in page_tweets(app, &uri, Some(token), 3).await {
                    let tid = tweet["id"].as_i64().expect("id");
                    let posted = by_id.get(&tid).expect("a tweet of the history");
                    assert_eq!(
                        seen(&tweet),
                        expected(posted),
                        "seed {seed}, {ctx}: {uri} tweet {tid}: {tweet}"
                    );
                    checked += 1;
                }
            }
        }
        for (tid, posted) in &tweets {
            let tweet = detail(app, *tid).await;
            assert_eq!(
                seen(&tweet),
                expected(posted),
                "seed {seed}, {ctx}: detail {tid}"
            );
        }
        checked
    };
    let mut checked = 0;
    for ctx in ["writer", "second process", "writer again (warm)"] {
        let app = if ctx == "second process" { &b } else { &a };
        checked += check(app, ctx).await;
    }
    a.flush_cache().await;
    checked += check(&b, "flushed").await;
    let proxy = Proxy::start().await;
    let prefix = a.prefix.clone();
    let c = TestApp::with(db, |c| {
        c.redis_url = proxy.url();
        c.redis_prefix = prefix;
    })
    .await;
    proxy.set_up(false);
    checked += check(&c, "Redis down").await;
    proxy.set_up(true);
    let mentioning = tweets
        .iter()
        .filter(|(_, p)| !p.mentioned.is_empty())
        .count();
    eprintln!(
        "seed {seed}: {} tweets, {mentioning} with mentions, {checked} page items checked",
        tweets.len()
    );
    assert!(
        mentioning > 0,
        "seed {seed}: a history without mentions checks nothing"
    );
}
