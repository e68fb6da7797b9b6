//! The randomized history checker (see `checker.rs`), in a test binary of its own: cargo runs
//! test binaries one after the other, so its load does not slow the timing-sensitive tests of
//! `tests/api` (and theirs do not thin out its histories).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code, unused_imports)] // the helpers serve tests/api; this binary uses a few
#[path = "../api/helpers.rs"]
mod helpers;

mod checker;
