//! `chirp import` on small files written by the test.

use std::io::Write;

use axum::http::StatusCode;
use chirp::config::ImportArgs;
use flate2::write::GzEncoder;
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{TestApp, page_all};

fn tweet(id: u64, author: u64, at: &str, text: &str, reply_to: Option<u64>) -> String {
    json!({
        "id_str": id.to_string(), "id": 7.9e17, "created_at": at, "text": text,
        "user": {"id_str": author.to_string(), "screen_name": format!("a{author}")},
        "in_reply_to_status_id_str": reply_to.map(|r| r.to_string()),
        "_id": {"$oid": "x"}
    })
    .to_string()
}

struct Files {
    dir: std::path::PathBuf,
}

impl Files {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(crate::helpers::unique_prefix().replace(':', "_"));
        std::fs::create_dir_all(&dir).unwrap();
        Files { dir }
    }

    fn write(&self, name: &str, content: &str) -> std::path::PathBuf {
        let path = self.dir.join(name);
        if name.ends_with(".gz") {
            let mut gz = GzEncoder::new(
                std::fs::File::create(&path).unwrap(),
                flate2::Compression::fast(),
            );
            gz.write_all(content.as_bytes()).unwrap();
            gz.finish().unwrap();
        } else {
            std::fs::write(&path, content).unwrap();
        }
        path
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn an_import_loads_graph_tweets_and_complete_feeds_once(db: PgPool) {
    let app = TestApp::new(db).await;
    let files = Files::new();
    // 10 and 11 follow 20; 10 follows 30; a duplicate, a self-follow and a malformed line.
    let follows = files.write(
        "graph.txt",
        "10 20\n11 20\n10 30\n10 20\n30 30\nnot an edge\n",
    );
    let same_second = "Wed Nov 09 06:57:54 +0000 2016";
    let tweets = [
        tweet(1001, 500, same_second, "busiest author, first", None),
        tweet(1002, 500, same_second, "busiest author, second", None),
        tweet(
            1003,
            600,
            "Thu Nov 10 08:00:00 +0000 2016",
            "other author",
            None,
        ),
        tweet(
            1004,
            700,
            "Thu Nov 10 09:00:00 +0000 2016",
            "a reply",
            Some(1001),
        ),
        tweet(
            1005,
            800,
            "Fri Nov 11 09:00:00 +0000 2016",
            "reply to outside",
            Some(9),
        ),
        // 20's reply to 30's tweet: 10 follows both and gets it, 11 follows only 20.
        tweet(
            1007,
            500,
            "Sat Nov 12 09:00:00 +0000 2016",
            "busiest author, a reply",
            Some(1003),
        ),
        "{\"id_str\": \"1006\", \"text\": \"no author or date\"}".to_owned(),
        "{ broken json".to_owned(),
    ]
    .join("\n");
    let tweets = files.write("tweets.jsonl.gz", &tweets);
    let tokens = files.dir.join("tokens.tsv");
    let args = ImportArgs {
        follows: Some(follows),
        tweets: vec![tweets],
        reset: false,
        tokens_out: Some(tokens.clone()),
        tokens: 5,
        circles: None,
    };

    let summary = chirp::import::run(app.db(), &args).await.unwrap();
    // Vacuumed, not only analyzed: the visibility map lets the followers' index-only scans
    // skip the heap (an ANALYZE alone leaves `relallvisible` at 0).
    let all_visible: Vec<(String, i32)> = sqlx::query_as(
        "select relname::text, relallvisible from pg_class
         where relname in ('friendships', 'newsfeeds', 'tweets', 'users') order by relname",
    )
    .fetch_all(app.db())
    .await
    .unwrap();
    assert!(
        all_visible.len() == 4 && all_visible.iter().all(|(_, pages)| *pages > 0),
        "{all_visible:?}"
    );
    assert_eq!(
        (
            summary.duplicate_edges,
            summary.self_follows,
            summary.skipped_edges.count
        ),
        (1, 1, 1)
    );
    assert_eq!(summary.skipped_tweets.count, 2);
    assert!(
        summary.skipped_tweets.examples[0].contains("tweets.jsonl.gz:7"),
        "{:?}",
        summary.skipped_tweets.examples
    );
    let tables: Vec<(String, i64)> = summary.tables.clone();
    assert!(tables.contains(&("users".into(), 4)), "{tables:?}");
    assert!(tables.contains(&("friendships".into(), 3)));
    assert!(
        tables.contains(&("tweets".into(), 6)),
        "1001, 1002, 1003, the replies and the reply to an outside tweet"
    );
    assert!(tables.contains(&("comments".into(), 0)));

    // The busiest author (500) got the most-followed account (20, two followers).
    let owner: i64 = sqlx::query_scalar("select user_id from tweets where id = 1001")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(owner, 20);
    let name: String = sqlx::query_scalar("select username from users where id = 20")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(name, "u20");
    let distinct: i64 = sqlx::query_scalar("select count(distinct created_at) from tweets")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(distinct, 6, "same-second tweets got unique timestamps");

    // Feeds are complete at once: 10 follows 20 (two tweets) and 30.
    let token = std::fs::read_to_string(&tokens).unwrap();
    assert_eq!(token.lines().count(), 2, "only 10 and 11 follow someone");
    let ten = token
        .lines()
        .find(|l| l.starts_with("10\t"))
        .unwrap()
        .split('\t')
        .nth(1)
        .unwrap()
        .to_owned();
    let feed = page_all(&app, "/api/newsfeeds/", Some(&ten), 1).await;
    let expected_len: i64 = sqlx::query_scalar(
        "select count(*) from tweets t where t.user_id = 10
            or exists (select 1 from friendships f where f.from_user_id = 10 and f.to_user_id = t.user_id)",
    )
    .fetch_one(app.db())
    .await
    .unwrap();
    assert_eq!(feed.len() as i64, expected_len);
    assert_eq!(&feed[feed.len() - 2..], &[1002, 1001]);
    assert!(feed.contains(&1007) && feed.contains(&1004), "{feed:?}");
    let eleven = token
        .lines()
        .find(|l| l.starts_with("11\t"))
        .unwrap()
        .split('\t')
        .nth(1)
        .unwrap()
        .to_owned();
    let feed = page_all(&app, "/api/newsfeeds/", Some(&eleven), 2).await;
    assert_eq!(
        feed,
        vec![1005, 1002, 1001],
        "its own, and no reply to an account it does not follow"
    );
    // Replies stay replies, counted on what they answer.
    let detail = app.get("/api/tweets/1001/", None).await.body;
    assert_eq!(
        (
            detail["comments_count"].clone(),
            detail["replies_count"].clone()
        ),
        (json!(0), json!(1))
    );
    let reply = app.get("/api/tweets/1004/", None).await.body;
    assert_eq!(
        (
            reply["in_reply_to_tweet_id"].clone(),
            reply["in_reply_to_user_id"].clone()
        ),
        (json!(1001), json!(20))
    );
    let context = app.get("/api/tweets/1001/context/", None).await.body;
    assert_eq!(context["descendants"][0]["id"], 1004, "{context}");
    let outside = app.get("/api/tweets/1005/", None).await.body;
    assert_eq!(outside["in_reply_to_tweet_id"], json!(null));
    let profile = app.get("/api/users/20/", None).await.body;
    assert_eq!(
        (
            profile["followers_count"].clone(),
            profile["tweets_count"].clone()
        ),
        (json!(2), json!(3))
    );
    assert_eq!(
        app.post(
            "/api/accounts/login/",
            None,
            json!({"username": "u20", "password": "!"})
        )
        .await
        .status,
        StatusCode::BAD_REQUEST
    );

    // Again, without --reset: nothing is added.
    let args = ImportArgs {
        tokens_out: None,
        ..args
    };
    let again = chirp::import::run(app.db(), &args).await.unwrap();
    let same: Vec<_> = again
        .tables
        .iter()
        .filter(|t| t.0 != "auth_tokens")
        .collect();
    let before: Vec<_> = tables.iter().filter(|t| t.0 != "auth_tokens").collect();
    assert_eq!(same, before);
    // New sign-ups get ids above the imported ones.
    let (id, _) = app.signup("newcomer").await;
    assert!(id > 30);
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_failed_import_changes_nothing_and_says_why(db: PgPool) {
    let app = TestApp::new(db).await;
    let files = Files::new();
    let follows = files.write("graph.txt", "1 2\n");
    let tweets = files.write(
        "t.jsonl",
        &tweet(5, 9, "Wed Nov 09 06:57:54 +0000 2016", "hi", None),
    );
    let missing = ImportArgs {
        follows: Some(files.dir.join("nope.txt")),
        tweets: vec![tweets.clone()],
        reset: false,
        tokens_out: None,
        tokens: 1,
        circles: None,
    };
    let err = chirp::import::run(app.db(), &missing).await.unwrap_err();
    assert!(format!("{err:#}").contains("nope.txt"), "{err:#}");

    // Fails after loading everything, at the token file: rolled back.
    let unwritable = ImportArgs {
        follows: Some(follows),
        tweets: vec![tweets],
        reset: true,
        tokens_out: Some(files.dir.join("no/such/dir/tokens.tsv")),
        tokens: 1,
        circles: None,
    };
    app.signup("existing").await;
    let err = chirp::import::run(app.db(), &unwritable).await.unwrap_err();
    assert!(format!("{err:#}").contains("tokens.tsv"), "{err:#}");
    let (users, tweets): (i64, i64) =
        sqlx::query_as("select (select count(*) from users), (select count(*) from tweets)")
            .fetch_one(app.db())
            .await
            .unwrap();
    assert_eq!(
        (users, tweets),
        (1, 0),
        "the database is as it was, reset included"
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_reset_import_also_empties_notifications_and_chat(db: PgPool) {
    let app = TestApp::new(db).await;
    let (alice, ta) = app.signup("alice").await;
    let (bob, tb) = app.signup("bob").await;
    app.follow(&ta, bob).await; // notifies bob
    let room = app
        .post(
            "/api/chat/channels/",
            Some(&tb),
            json!({"member_ids": [alice]}),
        )
        .await;
    let room = room.body["id"].as_i64().expect("a channel");
    let sent = app
        .post(
            &format!("/api/chat/channels/{room}/messages/"),
            Some(&tb),
            json!({"content": "before the reset"}),
        )
        .await;
    assert_eq!(sent.status, StatusCode::CREATED);
    let files = Files::new();
    let args = ImportArgs {
        follows: Some(files.write("graph.txt", "1 2\n")),
        tweets: vec![],
        reset: true,
        tokens_out: None,
        tokens: 1,
        circles: None,
    };
    chirp::import::run(app.db(), &args)
        .await
        .expect("the reset import");
    let left: (i64, i64, i64, i64) = sqlx::query_as(
        "select (select count(*) from users), (select count(*) from notifications),
                (select count(*) from chat_channels), (select count(*) from chat_messages)",
    )
    .fetch_one(app.db())
    .await
    .unwrap();
    assert_eq!(left, (2, 0, 0, 0), "only the imported graph is left");
}

/// Imported tweets are listed under their hashtags, as posted ones are; a reset import empties
/// the tags of what was there before.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn an_import_lists_tweets_under_their_hashtags(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, token) = app.signup("alice").await;
    app.tweet(&token, "before the reset #Old #news").await;
    let files = Files::new();
    let at = |h: u32| format!("Thu Nov 10 0{h}:00:00 +0000 2016");
    let tweets = [
        tweet(2001, 500, &at(1), "#News of the day #news", None),
        tweet(2002, 600, &at(2), "more #news &#38; #tech", None),
        tweet(2003, 600, &at(3), "nothing tagged, #42", None),
    ]
    .join("\n");
    let args = ImportArgs {
        follows: Some(files.write("graph.txt", "500 600\n")),
        tweets: vec![files.write("tweets.jsonl.gz", &tweets)],
        reset: true,
        tokens_out: None,
        tokens: 1,
        circles: None,
    };
    chirp::import::run(app.db(), &args)
        .await
        .expect("the import");
    assert_eq!(
        page_all(&app, "/api/hashtags/news/tweets/", None, 1).await,
        vec![2002, 2001]
    );
    assert_eq!(
        page_all(&app, "/api/hashtags/tech/tweets/", None, 5).await,
        vec![2002]
    );
    assert_eq!(
        page_all(&app, "/api/hashtags/old/tweets/", None, 5).await,
        Vec::<i64>::new()
    );
    let detail = app.get("/api/tweets/2002/", None).await;
    assert_eq!(detail.body["hashtags"], json!(["news", "tech"]));
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn an_import_keeps_coordinates_and_the_place_box(db: PgPool) {
    let app = TestApp::new(db).await;
    let files = Files::new();
    let follows = files.write("graph.txt", "10 20\n");
    let at = "Wed Nov 09 06:57:54 +0000 2016";
    let mut placed: serde_json::Value =
        serde_json::from_str(&tweet(2001, 500, at, "from Anchorage", None)).unwrap();
    placed["coordinates"] = json!({"type": "Point", "coordinates": [-149.9, 61.2]});
    placed["place"] = json!({
        "full_name": "Anchorage, AK",
        "bounding_box": {"type": "Polygon", "coordinates": [[
            [-150.035259, 61.043884], [-150.035259, 61.426201],
            [-149.48233, 61.426201], [-149.48233, 61.043884]
        ]]}
    });
    let mut odd: serde_json::Value = serde_json::from_str(&tweet(
        2002,
        500,
        at,
        "a place without a box, bad point",
        None,
    ))
    .unwrap();
    odd["coordinates"] = json!({"type": "Point", "coordinates": [200.0, 1.0]});
    odd["place"] = json!({"full_name": "Back\\slash \"quoted\"\ttab\nline",
        "bounding_box": {"coordinates": [[[1.0, 2.0], [3.0, 4.0]]]}});
    let tweets = files.write(
        "tweets.jsonl",
        &format!("{placed}\n{odd}\n{}\n", tweet(2003, 500, at, "plain", None)),
    );
    let args = ImportArgs {
        follows: Some(follows),
        tweets: vec![tweets],
        reset: false,
        tokens_out: None,
        tokens: 0,
        circles: None,
    };
    chirp::import::run(app.db(), &args).await.unwrap();
    let detail = app.get("/api/tweets/2001/", None).await;
    assert_eq!(detail.status, StatusCode::OK, "{}", detail.body);
    assert_eq!(detail.body["coordinates"], json!([-149.9, 61.2]));
    assert_eq!(
        detail.body["place"],
        json!({"full_name": "Anchorage, AK", "bbox": [-150.035259, 61.043884, -149.48233, 61.426201]})
    );
    // A bad point is dropped; a name with COPY's special characters arrives intact.
    let odd = app.get("/api/tweets/2002/", None).await;
    assert_eq!(odd.body["coordinates"], json!(null));
    assert_eq!(
        odd.body["place"],
        json!({"full_name": "Back\\slash \"quoted\"\ttab\nline", "bbox": [1.0, 2.0, 3.0, 4.0]})
    );
    let plain = app.get("/api/tweets/2003/", None).await;
    assert_eq!(plain.status, StatusCode::OK, "{}", plain.body);
    assert_eq!(
        (&plain.body["coordinates"], &plain.body["place"]),
        (&json!(null), &json!(null))
    );
}

/// Every index and key definition of a table, as the catalog prints them.
async fn definitions(db: &PgPool, table: &str) -> Vec<String> {
    sqlx::query_scalar(
        "select pg_get_indexdef(indexrelid) from pg_index where indrelid = $1::regclass
         union all
         select conname || ' ' || pg_get_constraintdef(oid) from pg_constraint
         where conrelid = $1::regclass
         order by 1",
    )
    .bind(table)
    .fetch_all(db)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_reset_import_loads_without_indexes_and_rebuilds_exactly_the_migrations_ones(db: PgPool) {
    let app = TestApp::new(db).await;
    let before = [
        definitions(app.db(), "friendships").await,
        definitions(app.db(), "newsfeeds").await,
    ];
    assert!(before[0].len() >= 5 && before[1].len() >= 3, "{before:?}");
    let files = Files::new();
    let follows = files.write("graph.txt", "10 20\n11 20\n10 30\n");
    let tweets = files.write(
        "tweets.jsonl",
        &[
            tweet(1, 500, "Wed Nov 09 06:57:54 +0000 2016", "one", None),
            tweet(2, 600, "Wed Nov 09 07:57:54 +0000 2016", "two", None),
        ]
        .join("\n"),
    );
    let args = ImportArgs {
        follows: Some(follows),
        tweets: vec![tweets],
        reset: true,
        tokens_out: None,
        tokens: 0,
        circles: None,
    };
    let summary = chirp::import::run(app.db(), &args).await.unwrap();
    assert!(
        summary
            .phases
            .iter()
            .any(|(name, _)| name == "build indexes"),
        "{:?}",
        summary.phases
    );
    let after = [
        definitions(app.db(), "friendships").await,
        definitions(app.db(), "newsfeeds").await,
    ];
    assert_eq!(before, after);
    // The rebuilt keys work: a second follow of the same pair is refused.
    let duplicate = sqlx::query(
        "insert into friendships (from_user_id, to_user_id, created_at) values (10, 20, now())",
    )
    .execute(app.db())
    .await;
    assert!(duplicate.is_err());
    let rows: i64 = sqlx::query_scalar("select count(*) from newsfeeds")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(rows, 5, "two authors' own rows and three followers' rows");
}

/// A v1.1 retweet: `tweet`'s fields and the original embedded as `retweeted_status`.
fn retweet(id: u64, author: u64, at: &str, original: &str) -> String {
    let mut value: serde_json::Value =
        serde_json::from_str(&tweet(id, author, at, "RT @x: …", None)).unwrap();
    value["retweeted_status"] = serde_json::from_str(original).unwrap();
    value.to_string()
}

/// Retweets in the data stay retweets: their originals come from the embedded
/// `retweeted_status`, each account keeps one retweet of a tweet, the counts are exact, and no
/// newsfeed lists a tweet twice (also with `--reset`, whose bulk load runs without indexes).
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn an_import_keeps_retweets_once_per_account_and_newsfeed(db: PgPool) {
    let app = TestApp::new(db).await;
    let files = Files::new();
    let at = |h: u32| format!("Thu Nov 10 0{h}:00:00 +0000 2016");
    let original = tweet(3001, 500, &at(1), "the original", None);
    let lines = [
        retweet(3002, 600, &at(2), &original),
        retweet(3003, 700, &at(3), &original),
        // A retweet of a retweet names the original in v1.1; one naming a retweet is dropped.
        retweet(3004, 800, &at(4), &retweet(3002, 600, &at(2), &original)),
        tweet(3005, 600, &at(5), "plain", None),
    ]
    .join("\n");
    // 10 follows everyone: the original and both retweets reach its newsfeed, the tweet once.
    let follows = "10 20\n10 30\n10 40\n10 50\n11 20\n12 30\n";
    let tokens = files.dir.join("tokens.tsv");
    for reset in [true, false] {
        let args = ImportArgs {
            follows: Some(files.write("graph.txt", follows)),
            tweets: vec![files.write("tweets.jsonl.gz", &lines)],
            reset,
            tokens_out: (!reset).then(|| tokens.clone()),
            tokens: 3,
            circles: None,
        };
        let summary = chirp::import::run(app.db(), &args)
            .await
            .expect("the import");
        assert_eq!(summary.dropped_retweets, 1, "reset {reset}");
        let rows: Vec<(i64, Option<i64>, String)> = sqlx::query_as(
            "select id, retweeted_tweet_id, content from tweets where id between 3001 and 3005
             order by id",
        )
        .fetch_all(app.db())
        .await
        .unwrap();
        let expected: Vec<(i64, Option<i64>, String)> = vec![
            (3001, None, "the original".into()),
            (3002, Some(3001), String::new()),
            (3003, Some(3001), String::new()),
            (3005, None, "plain".into()),
        ];
        assert_eq!(rows, expected, "reset {reset}");
        let repeats: i64 = sqlx::query_scalar(
            "select count(*) from (select 1 from newsfeeds
                                   group by user_id, coalesce(status_id, tweet_id)
                                   having count(*) > 1) r",
        )
        .fetch_one(app.db())
        .await
        .unwrap();
        assert_eq!(repeats, 0, "reset {reset}");
    }
    let original = app.get("/api/tweets/3001/", None).await;
    assert_eq!(original.body["retweets_count"], 2, "{}", original.body);
    let retweet = app.get("/api/tweets/3003/", None).await;
    assert_eq!(retweet.status, StatusCode::OK);
    assert_eq!(
        retweet.body["retweeted_tweet"]["id"], 3001,
        "{}",
        retweet.body
    );
    // Every newsfeed lists the tweet at most once, through the API too.
    let tokens = std::fs::read_to_string(&tokens).unwrap();
    assert!(tokens.lines().count() >= 3, "{tokens}");
    for line in tokens.lines() {
        let (reader, token) = line.split_once('\t').unwrap();
        let feed = page_all(&app, "/api/newsfeeds/", Some(token), 2).await;
        let mut seen = std::collections::HashSet::new();
        for id in feed {
            let status = if (3002..=3003).contains(&id) {
                3001
            } else {
                id
            };
            assert!(seen.insert(status), "reader {reader} lists {status} twice");
        }
    }
}

/// v1.1 `entities.user_mentions` (of the extended tweet when there is one) become the mentions
/// of the accounts whose authors are in the data, in order, once each; others are left out,
/// and nobody is notified.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn an_import_keeps_the_mentions_of_the_datas_authors(db: PgPool) {
    let app = TestApp::new(db).await;
    let files = Files::new();
    let at = |h: u32| format!("Thu Nov 10 0{h}:00:00 +0000 2016");
    let mentioning = |id: u64, author: u64, h: u32, ids: &[u64], extended: bool| {
        let mut value: serde_json::Value =
            serde_json::from_str(&tweet(id, author, &at(h), "@someone hello", None)).unwrap();
        let entities = json!({"user_mentions": ids.iter()
            .map(|m| json!({"id_str": m.to_string(), "screen_name": format!("a{m}")}))
            .collect::<Vec<_>>()});
        if extended {
            value["entities"] = json!({"user_mentions": [{"id_str": "500"}]});
            value["extended_tweet"] =
                json!({"full_text": "@a700 @a600 the whole text", "entities": entities});
        } else {
            value["entities"] = entities;
        }
        value.to_string()
    };
    let lines = [
        tweet(4001, 600, &at(1), "by 600", None),
        tweet(4002, 700, &at(2), "by 700", None),
        mentioning(4003, 500, 3, &[600, 999, 600, 700], false),
        mentioning(4004, 500, 4, &[700, 600], true),
    ]
    .join("\n");
    let args = ImportArgs {
        follows: Some(files.write("graph.txt", "10 20\n10 30\n20 30\n")),
        tweets: vec![files.write("tweets.jsonl", &lines)],
        reset: true,
        tokens_out: None,
        tokens: 1,
        circles: None,
    };
    chirp::import::run(app.db(), &args)
        .await
        .expect("the import");
    let author_of = async |id: u64| {
        let res = app.get(&format!("/api/tweets/{id}/"), None).await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.body);
        res.body["user"]["id"].as_i64().unwrap()
    };
    let (of600, of700) = (author_of(4001).await, author_of(4002).await);
    for (id, want) in [(4003, vec![of600, of700]), (4004, vec![of700, of600])] {
        let res = app.get(&format!("/api/tweets/{id}/"), None).await;
        let got: Vec<i64> = res.body["mentions"]
            .as_array()
            .unwrap_or_else(|| panic!("{}", res.body))
            .iter()
            .map(|u| u["id"].as_i64().unwrap())
            .collect();
        assert_eq!(got, want, "{id}: {}", res.body);
    }
    let notified: i64 = sqlx::query_scalar("select count(*) from notifications")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(notified, 0);
}
