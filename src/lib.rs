//! chirp: a backend for Twitter-like apps, with cache-aside Redis timelines over Postgres and
//! fan-out-on-write newsfeeds. See docs/ARCHITECTURE.md for the architecture and docs/API.md for the API.

pub mod accounts;
pub mod blocks;
pub mod cache;
pub mod chat;
pub mod check;
pub mod circles;
pub mod comments;
pub mod config;
pub mod db;
pub mod error;
pub mod fanout;
pub mod friendships;
pub mod hashtags;
pub mod http;
pub mod hybrid;
pub mod import;
pub mod jobs;
pub mod likes;
pub mod lists;
pub mod media;
pub mod metrics;
pub mod model;
pub mod newsfeeds;
pub mod notifications;
pub mod pagination;
pub mod replica;
pub mod replies;
pub mod startup;
pub mod state;
pub mod streams;
pub mod time;
pub mod timeline;
pub mod trace;
pub mod tweets;
pub mod users;
