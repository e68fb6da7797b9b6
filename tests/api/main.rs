//! chirp's integration tests: real Postgres (a database per test from `#[sqlx::test]`) and real
//! Redis (a key prefix per test).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod accounts;
mod blocks;
mod cache;
mod chat;
mod check;
mod circles;
mod cold;
mod comments;
mod connections;
mod edits;
mod fanout;
mod friendships;
mod hashtags;
mod helpers;
mod hybrid;
mod import;
mod likes;
mod limits;
mod lists;
mod media;
mod mentions;
mod metrics;
mod near;
mod notifications;
mod openapi;
mod outbox;
mod pagination;
mod pool;
mod races;
mod replica;
mod replies;
mod resilience;
mod retweets;
mod statements;
mod streams;
mod tweets;
mod users;
