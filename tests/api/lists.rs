//! Lists: CRUD and membership, list timelines on the cache-aside path, the list jobs, and the
//! import of SNAP circles as lists.

use axum::http::StatusCode;
use chirp::config::ImportArgs;
use chirp::timeline::Timeline;
use serde_json::json;
use sqlx::PgPool;

use rand::Rng;

use crate::helpers::{TestApp, page_all, tweet_ids};

/// The list's tweets as Postgres says, newest first.
async fn truth(app: &TestApp, list: i64) -> Vec<i64> {
    sqlx::query_scalar(
        "select t.id from tweets t join list_members m on m.user_id = t.user_id
         where m.list_id = $1 order by t.created_at desc",
    )
    .bind(list)
    .fetch_all(app.db())
    .await
    .unwrap()
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_list_timeline_pages_across_the_cached_window_into_postgres(db: PgPool) {
    let app = TestApp::with(db, |c| c.cache_list_limit = 5).await;
    let (_, owner) = app.quick_user("owner").await;
    let list = app.new_list(&owner, "writers").await;
    let (outsider, to) = app.quick_user("outsider").await;
    for i in 0..3 {
        let (id, token) = app.quick_user(&format!("member{i}")).await;
        app.add_to_list(&owner, list, id).await;
        for j in 0..4 {
            app.tweet(&token, &format!("member {i} tweet {j}")).await;
        }
    }
    app.tweet(&to, "not in the list").await;
    app.drain().await;
    let expected = truth(&app, list).await;
    assert_eq!(expected.len(), 12);

    let uri = format!("/api/lists/{list}/timeline/");
    let first = app.get(&uri, None).await.body;
    assert_eq!(tweet_ids(&first)[..], expected[..12]);
    let cached = app
        .cached_members(Timeline::List(list))
        .await
        .expect("cached");
    assert_eq!(cached.len(), 5, "trimmed to the list limit: {cached:?}");
    for page_size in [1, 3, 7] {
        assert_eq!(page_all(&app, &uri, None, page_size).await, expected);
    }
    assert!(
        app.stat("fallbacks") > 0,
        "pages past the window came from Postgres"
    );
    assert_eq!(first["results"][0]["user"]["username"], json!("member2"));
    let _ = outsider;
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn adding_a_member_backfills_and_removing_one_takes_their_tweets_out(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, owner) = app.quick_user("owner").await;
    let (alice, ta) = app.quick_user("alice").await;
    let (bob, tb) = app.quick_user("bob").await;
    let list = app.new_list(&owner, "friends").await;
    let uri = format!("/api/lists/{list}/timeline/");
    let old = app.tweet(&ta, "before she was added").await["id"]
        .as_i64()
        .unwrap();
    assert_eq!(
        tweet_ids(&app.get(&uri, None).await.body),
        Vec::<i64>::new()
    );
    assert_eq!(
        app.cached_members(Timeline::List(list)).await,
        Some(vec!["#".to_owned()]),
        "the empty timeline is cached as complete"
    );

    // Added: the backfill brings her earlier tweet into the cached list.
    let added = app.add_to_list(&owner, list, alice).await;
    assert_eq!(added["user"]["id"], json!(alice));
    assert_eq!(
        app.add_to_list(&owner, list, alice).await,
        json!({"success": true, "duplicate": true})
    );
    app.drain().await;
    let cached = app
        .cached_members(Timeline::List(list))
        .await
        .expect("cached");
    assert!(cached.contains(&old.to_string()), "{cached:?}");
    assert_eq!(tweet_ids(&app.get(&uri, None).await.body), vec![old]);

    // Her new tweet is fanned out to the list; bob's (not a member) is not.
    app.add_to_list(&owner, list, bob).await;
    let new = app.tweet(&ta, "after").await["id"].as_i64().unwrap();
    let by_bob = app.tweet(&tb, "bob's").await["id"].as_i64().unwrap();
    app.drain().await;
    assert_eq!(
        tweet_ids(&app.get(&uri, None).await.body),
        vec![by_bob, new, old]
    );

    // Deletes leave the list.
    let res = app
        .delete(&format!("/api/tweets/{by_bob}/"), Some(&tb))
        .await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(tweet_ids(&app.get(&uri, None).await.body), vec![new, old]);

    // Removed: all of her tweets leave, in Postgres and in the cached list.
    let res = app
        .delete(&format!("/api/lists/{list}/members/{alice}/"), Some(&owner))
        .await;
    assert_eq!(res.body, json!({"success": true, "deleted": 1}));
    app.drain().await;
    assert_eq!(
        tweet_ids(&app.get(&uri, None).await.body),
        Vec::<i64>::new()
    );
    let cached = app
        .cached_members(Timeline::List(list))
        .await
        .expect("cached");
    assert!(
        ![old, new].iter().any(|t| cached.contains(&t.to_string())),
        "{cached:?}"
    );
    let detail = app.get(&format!("/api/lists/{list}/"), None).await.body;
    assert_eq!(detail["members_count"], json!(1));
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn only_the_owner_changes_a_list_and_bad_input_changes_nothing(db: PgPool) {
    let app = TestApp::new(db).await;
    let (owner_id, owner) = app.quick_user("owner").await;
    let (other_id, other) = app.quick_user("other").await;
    let list = app.new_list(&owner, "mine").await;

    let res = app
        .post(
            &format!("/api/lists/{list}/members/"),
            Some(&other),
            json!({"user_id": other_id}),
        )
        .await;
    assert_eq!(res.status, StatusCode::FORBIDDEN);
    let res = app
        .delete(&format!("/api/lists/{list}/"), Some(&other))
        .await;
    assert_eq!(res.status, StatusCode::FORBIDDEN);
    let res = app
        .post(
            "/api/lists/999999/members/",
            Some(&owner),
            json!({"user_id": other_id}),
        )
        .await;
    assert_eq!(res.status, StatusCode::NOT_FOUND);
    let res = app
        .post(
            &format!("/api/lists/{list}/members/"),
            Some(&owner),
            json!({"user_id": 999999}),
        )
        .await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    assert!(res.body["errors"]["user_id"].is_array(), "{}", res.body);
    for body in [
        json!({"name": ""}),
        json!({"name": "x".repeat(26)}),
        json!({"name": "ok", "description": "d".repeat(101)}),
        json!({"name": "mine"}),
    ] {
        let res = app.post("/api/lists/", Some(&owner), body.clone()).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{body}: {}", res.body);
    }
    let res = app.post("/api/lists/", None, json!({"name": "anon"})).await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED);

    let mine = app
        .get(&format!("/api/lists/?user_id={owner_id}"), None)
        .await
        .body;
    assert_eq!(mine["results"].as_array().map(Vec::len), Some(1));
    assert_eq!(mine["results"][0]["owner"]["id"], json!(owner_id));
    assert_eq!(mine["results"][0]["members_count"], json!(0));

    app.add_to_list(&owner, list, other_id).await;
    let members = app
        .get(&format!("/api/lists/{list}/members/"), None)
        .await
        .body;
    assert_eq!(members["results"][0]["user"]["id"], json!(other_id));
    let res = app
        .delete(&format!("/api/lists/{list}/"), Some(&owner))
        .await;
    assert_eq!(res.body, json!({"success": true}));
    assert_eq!(
        app.get(&format!("/api/lists/{list}/timeline/"), None)
            .await
            .status,
        StatusCode::NOT_FOUND
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn imported_circles_become_lists_with_filled_timelines(db: PgPool) {
    let app = TestApp::new(db).await;
    let dir = std::env::temp_dir().join(crate::helpers::unique_prefix());
    std::fs::create_dir_all(&dir).unwrap();
    let follows = dir.join("graph.txt");
    std::fs::write(&follows, "10 20\n11 20\n").unwrap();
    let tweets = dir.join("tweets.jsonl");
    let tweet = json!({"id_str": "5001", "created_at": "Wed Nov 09 06:57:54 +0000 2016",
        "text": "imported", "user": {"id_str": "77"}});
    std::fs::write(&tweets, tweet.to_string()).unwrap();
    let circles = dir.join("circles.txt");
    // Ego 10's list "0" holds 20 (the tweet's account) and 11, named twice; a malformed line.
    std::fs::write(&circles, "10\t0\t20\t11\t11\n10\t1\t11\nnot-an-id\t2\t20\n").unwrap();
    let args = ImportArgs {
        follows: Some(follows),
        tweets: vec![tweets],
        reset: false,
        tokens_out: None,
        tokens: 0,
        circles: Some(circles),
    };
    let summary = chirp::import::run(app.db(), &args).await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        (summary.duplicate_members, summary.skipped_circles.count),
        (1, 1)
    );
    let list: i64 = sqlx::query_scalar("select id from lists where owner_id = 10 and name = '0'")
        .fetch_one(app.db())
        .await
        .unwrap();
    let detail = app.get(&format!("/api/lists/{list}/"), None).await.body;
    assert_eq!(detail["members_count"], json!(2));
    assert_eq!(
        tweet_ids(
            &app.get(&format!("/api/lists/{list}/timeline/"), None)
                .await
                .body
        ),
        vec![5001]
    );
}

/// The shared real data directory: `CHIRP_SHARED_DATA`, else `../shared/data` next to the
/// project.
fn shared_data() -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("CHIRP_SHARED_DATA")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data"));
    dir.join("ego-twitter/circles.txt.gz")
        .exists()
        .then_some(dir)
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn the_real_snap_circles_import_as_4065_lists_and_twice_adds_nothing(db: PgPool) {
    let Some(data) = shared_data() else {
        eprintln!(
            "SKIPPED: no shared data (set CHIRP_SHARED_DATA to the directory with ego-twitter/)"
        );
        return;
    };
    let app = TestApp::new(db).await;
    let args = ImportArgs {
        follows: None,
        tweets: Vec::new(),
        reset: false,
        tokens_out: None,
        tokens: 0,
        circles: Some(data.join("ego-twitter/circles.txt.gz")),
    };
    let counts = async || -> (i64, i64, i64, i64) {
        sqlx::query_as(
            "select (select count(*) from lists), (select count(*) from list_members),
                    (select count(distinct owner_id) from lists), (select sum(members_count)::bigint from lists)",
        )
        .fetch_one(app.db())
        .await
        .unwrap()
    };
    let summary = chirp::import::run(app.db(), &args).await.unwrap();
    // 50,853 memberships in the file, 3 of them a member named twice in the same circle.
    assert_eq!(summary.duplicate_members, 3);
    assert_eq!(summary.skipped_circles.count, 0);
    assert_eq!(counts().await, (4065, 50_850, 938, 50_850));
    chirp::import::run(app.db(), &args).await.unwrap();
    assert_eq!(
        counts().await,
        (4065, 50_850, 938, 50_850),
        "again: nothing added"
    );
}

#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn timelines_of_unknown_or_deleted_owners_are_a_404_and_cache_nothing(db: PgPool) {
    let app = TestApp::new(db).await;
    let (_, owner) = app.signup("owner").await;
    let (writer, tw) = app.signup("writer").await;
    let id = app.tweet(&tw, "listed").await["id"].as_i64().unwrap();
    let list = app.new_list(&owner, "readers").await;
    app.add_to_list(&owner, list, writer).await;
    app.drain().await;
    // Twice: the second page comes from the cached timeline, with no existence query.
    for _ in 0..2 {
        let res = app.get(&format!("/api/lists/{list}/timeline/"), None).await;
        assert_eq!(tweet_ids(&res.body), vec![id]);
    }
    assert!(app.cached_members(Timeline::List(list)).await.is_some());

    app.delete(&format!("/api/lists/{list}/"), Some(&owner))
        .await;
    for uri in [
        format!("/api/lists/{list}/timeline/"),
        "/api/lists/999999/timeline/".to_owned(),
        "/api/circles/999999/tweets/".to_owned(),
        "/api/tweets/?user_id=999999".to_owned(),
    ] {
        assert_eq!(
            app.get(&uri, None).await.status,
            StatusCode::NOT_FOUND,
            "{uri}"
        );
    }
    for timeline in [
        Timeline::List(list),
        Timeline::List(999999),
        Timeline::Circle(999999),
        Timeline::UserTweets(999999),
    ] {
        assert_eq!(app.cached_members(timeline).await, None, "{timeline:?}");
    }
}

/// Review 2026-11-26, finding 11: a refresh of a list timeline from the middle of a long list
/// scanned half of it for late rows. Now it reads what it returns: the rows created in the
/// second before the cursor and the late ones, whatever the list's length; and it returns what
/// the plain filter does.
#[sqlx::test(migrator = "chirp::db::MIGRATOR")]
async fn a_refresh_of_a_long_list_reads_its_late_rows_not_the_list(db: PgPool) {
    let (seed, mut rng) = crate::helpers::seeded_rng("CHIRP_TEST_SEED", "late list rows");
    let app = TestApp::new(db).await;
    let (owner, _) = app.quick_user("owner").await;
    let (author, _) = app.quick_user("author").await;
    let list: i64 = sqlx::query_scalar(
        "insert into lists (owner_id, name, created_at) values ($1, 'long', now()) returning id",
    )
    .bind(owner)
    .fetch_one(app.db())
    .await
    .unwrap();
    // 40,000 tweets a second apart, each in the list on time (within 0–900 ms), except every
    // 997th, which arrived long after (a backfill); the last hour's rows are a second late or
    // less now and then.
    sqlx::query(
        "insert into tweets (user_id, content, created_at)
         select $1, 'tweet ' || i, timestamptz '2026-01-01' + i * interval '1 second'
         from generate_series(1, 40000) i",
    )
    .bind(author)
    .execute(app.db())
    .await
    .unwrap();
    sqlx::query(
        "insert into list_feeds (list_id, tweet_id, created_at, arrived_at)
         select $1, t.id, t.created_at,
                case when t.id % 997 = 0 then timestamptz '2026-02-01'
                     else t.created_at + (t.id % 10) * interval '100 milliseconds' end
         from tweets t where t.user_id = $2",
    )
    .bind(list)
    .bind(author)
    .execute(app.db())
    .await
    .unwrap();
    sqlx::query("analyze list_feeds")
        .execute(app.db())
        .await
        .unwrap();

    let start = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
        .unwrap()
        .with_timezone(&chrono::Utc);
    for _ in 0..20 {
        let gt = start + chrono::TimeDelta::milliseconds(rng.random_range(1_000..40_000_000));
        let limit = rng.random_range(1..=100usize);
        let got: Vec<i64> = chirp::lists::late_arrivals(app.db(), list, gt, limit)
            .await
            .unwrap()
            .iter()
            .map(|r| r.entry_id)
            .collect();
        let want: Vec<i64> = sqlx::query_scalar(
            "select tweet_id from list_feeds where list_id = $1 and arrived_at > $2
               and created_at < $2 order by created_at desc limit $3",
        )
        .bind(list)
        .bind(gt)
        .bind(limit as i64)
        .fetch_all(app.db())
        .await
        .unwrap();
        assert_eq!(got, want, "seed {seed}: gt {gt}, limit {limit}");
    }

    // From the middle of the list, the plan reads what it returns: hardly a row is read only
    // to be filtered out (a scan of half of the list removes about 20,000).
    let median = start + chrono::TimeDelta::seconds(20_000);
    let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "explain (analyze, format json) {}",
        chirp::lists::LATE_ARRIVALS
    )))
    .bind(list)
    .bind(median)
    .bind(100i64)
    .fetch_one(app.db())
    .await
    .unwrap();
    fn removed(node: &serde_json::Value) -> i64 {
        let own = ["Rows Removed by Filter", "Rows Removed by Index Recheck"]
            .iter()
            .map(|k| node[*k].as_i64().unwrap_or(0))
            .sum::<i64>();
        let loops = node["Actual Loops"].as_i64().unwrap_or(1).max(1);
        own * loops
            + node["Plans"]
                .as_array()
                .map_or(0, |children| children.iter().map(removed).sum())
    }
    let top = &plan[0]["Plan"];
    assert_eq!(
        top["Actual Rows"].as_i64(),
        Some(20),
        "the 20 backfilled rows before the median, none within its last second"
    );
    let removed = removed(top);
    assert!(
        removed < 100,
        "{removed} rows read and filtered out: {plan}"
    );
}
