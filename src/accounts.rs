//! Accounts: sign-up, login, logout and bearer-token authentication.
//!
//! Passwords are hashed with argon2id (the `argon2` crate's defaults: 19 MiB, 2 passes) on a
//! bounded pool ([`HashPool`]). Tokens are 32 random bytes, base64url-encoded (43 characters); only
//! their SHA-256 is stored, and logout deletes it.

use argon2::password_hash::{
    PasswordHash, PasswordHasher, PasswordVerifier, SaltString, rand_core::OsRng,
};
use std::sync::{Arc, LazyLock};

use argon2::Argon2;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::PgPool;

use crate::blocks::Hidden;
use crate::cache::deferred::Deferred;
use crate::cache::near::Lookup;
use crate::cache::objects::CachedToken;
use crate::cache::tokens::TokenCache;
use crate::cache::{Cache, Update};
use crate::db;
use crate::error::{ApiError, ApiResult, FieldErrors};
use crate::model::UserRecord;
use crate::users::User;

/// Length of a bearer token in characters.
pub const TOKEN_LEN: usize = 43;

/// A hash to verify against when the username is unknown, so that login takes the same time
/// either way (computed once, on first use, inside the hashing pool).
static DUMMY_HASH: LazyLock<String> = LazyLock::new(|| {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(b"chirp-no-such-user", &salt)
        .map(|h| h.to_string())
        .unwrap_or_default()
});

/// The bounded pool every password hash runs on. An argon2id hash holds 19 MiB and one core
/// for tens of ms, so unbounded concurrent logins took a process from 20 MB to 1.66 GB: at
/// most one hash per core runs at once ([`HashPool::running`]), at most
/// [`HashPool::QUEUE_PER_CORE`] per core wait, and a login or signup past that is a 503 with
/// `Retry-After: 1` (OWASP's password storage guidance: bound the work factor's concurrency).
/// One per app, that is per process ([`crate::state::Shared::hashing`]).
pub struct HashPool {
    permits: tokio::sync::Semaphore,
    waiting: std::sync::atomic::AtomicUsize,
    queue: usize,
    /// Hashes that could run at once (the cores).
    pub running: usize,
    active: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Most hashes seen running at once since start.
    pub peak: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Default for HashPool {
    fn default() -> Self {
        Self::new()
    }
}

impl HashPool {
    /// Hashes that may wait per core.
    pub const QUEUE_PER_CORE: usize = 16;

    /// A pool of one hash per core, with [`HashPool::QUEUE_PER_CORE`] waiting per core.
    pub fn new() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        HashPool {
            permits: tokio::sync::Semaphore::new(cores),
            waiting: std::sync::atomic::AtomicUsize::new(0),
            queue: cores * Self::QUEUE_PER_CORE,
            running: cores,
            active: std::sync::Arc::default(),
            peak: std::sync::Arc::default(),
        }
    }

    /// Runs `hash` on a blocking thread once a permit is free.
    ///
    /// # Errors
    /// `Busy` (503) when the queue is full; `Internal` if the hash panicked.
    async fn run<T: Send + 'static>(
        &self,
        hash: impl FnOnce() -> T + Send + 'static,
    ) -> ApiResult<T> {
        use std::sync::atomic::Ordering;
        /// Leaves the queue when dropped (also if the caller is dropped while waiting).
        struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let ahead = self.waiting.fetch_add(1, Ordering::AcqRel);
        let waiting = Waiting(&self.waiting);
        if ahead >= self.queue {
            return Err(ApiError::Busy(
                1,
                "Too many logins at once; try again shortly.",
            ));
        }
        let permit = self.permits.acquire().await;
        drop(waiting);
        let _permit = permit.map_err(|e| anyhow::anyhow!("hashing pool closed: {e}"))?;
        let (active, peak) = (self.active.clone(), self.peak.clone());
        Ok(tokio::task::spawn_blocking(move || {
            let now = active.fetch_add(1, Ordering::AcqRel) + 1;
            peak.fetch_max(now, Ordering::AcqRel);
            let hashed = hash();
            active.fetch_sub(1, Ordering::AcqRel);
            hashed
        })
        .await
        .map_err(anyhow::Error::from)?)
    }
}

async fn hash_password(hashing: &HashPool, password: String) -> ApiResult<String> {
    hashing
        .run(move || {
            let salt = SaltString::generate(&mut OsRng);
            Argon2::default()
                .hash_password(password.as_bytes(), &salt)
                .map(|h| h.to_string())
                .map_err(|e| anyhow::anyhow!("hashing password: {e}"))
        })
        .await?
        .map_err(ApiError::from)
}

/// Verifies `password` against `hash`, or against [`DUMMY_HASH`] when there is none.
async fn verify_password(
    hashing: &HashPool,
    password: String,
    hash: Option<String>,
) -> ApiResult<bool> {
    hashing
        .run(move || {
            let hash = hash.as_deref().unwrap_or(DUMMY_HASH.as_str());
            match PasswordHash::new(hash) {
                Ok(parsed) => Argon2::default()
                    .verify_password(password.as_bytes(), &parsed)
                    .is_ok(),
                Err(_) => false,
            }
        })
        .await
}

/// SHA-256 of a token, as stored in `auth_tokens`.
pub fn hash_token(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// Issues a new token for `user_id`.
pub async fn issue_token(db: &PgPool, user_id: i64) -> sqlx::Result<String> {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let token = URL_SAFE_NO_PAD.encode(bytes);
    sqlx::query("insert into auth_tokens (token_hash, user_id) values ($1, $2)")
        .bind(hash_token(&token))
        .bind(user_id)
        .execute(db)
        .await?;
    Ok(token)
}

/// Creates an account (inputs already validated; the username lowercase) and a token; the
/// password is hashed on `hashing`, the process's pool ([`crate::state::Shared::hashing`]).
///
/// # Errors
/// 400 naming the field if the username or email is taken; 503 if `hashing`'s queue is full.
pub async fn signup(
    db: &PgPool,
    hashing: &HashPool,
    username: &str,
    email: &str,
    password: String,
) -> ApiResult<(User, String)> {
    let hash = hash_password(hashing, password).await?;
    let inserted = sqlx::query_as::<_, UserRecord>(concat!(
        "insert into users (username, email, password_hash) values ($1, $2, $3) returning ",
        crate::user_record_columns!()
    ))
    .bind(username)
    .bind(email)
    .bind(hash)
    .fetch_one(db)
    .await;
    let user = match inserted {
        Ok(u) => u,
        Err(e) if db::violates(&e, "users_username_key") => {
            return Err(ApiError::field(
                "username",
                "This username has been occupied.",
            ));
        }
        Err(e) if db::violates(&e, "users_email_key") => {
            return Err(ApiError::field(
                "email",
                "This email address has been occupied.",
            ));
        }
        Err(e) => return Err(e.into()),
    };
    let token = issue_token(db, user.id).await?;
    Ok((user.into(), token))
}

#[derive(sqlx::FromRow)]
struct Credentials {
    id: i64,
    username: String,
    nickname: Option<String>,
    avatar_url: Option<String>,
    password_hash: String,
}

/// Checks a username and password (on `hashing`, the process's pool) and issues a token.
///
/// # Errors
/// 400 "username and password does not match" for any wrong pair; 503 if `hashing`'s queue is
/// full.
pub async fn login(
    db: &PgPool,
    hashing: &HashPool,
    username: &str,
    password: String,
) -> ApiResult<(User, String)> {
    let row: Option<Credentials> = sqlx::query_as(
        "select id, username, nickname, avatar_url, password_hash from users where username = $1",
    )
    .bind(username.to_lowercase())
    .fetch_optional(db)
    .await?;
    let hash = row.as_ref().map(|r| r.password_hash.clone());
    let matches = verify_password(hashing, password, hash).await?;
    match row {
        Some(c) if matches => {
            let token = issue_token(db, c.id).await?;
            Ok((
                User {
                    id: c.id,
                    username: c.username,
                    nickname: c.nickname,
                    avatar_url: c.avatar_url,
                },
                token,
            ))
        }
        _ => Err(ApiError::BadRequest("username and password does not match")),
    }
}

/// Revokes a token: deletes it and stages its tombstone in the token cache in one transaction,
/// then drops it from every process's memory ([`crate::cache::tokens::broadcast`], which waits for each
/// process to confirm).
///
/// If this request brought the token back from Postgres, its cache fill of the token (deferred
/// to the request's next read, decision 0037) was read before this delete: it is dropped, not
/// sent after the revocation, so no fill can cache the token again whether or not the
/// tombstone is in Redis by then (the cache step failed, the key was evicted).
pub async fn logout(
    db: &PgPool,
    cache: &Cache,
    tokens: &TokenCache,
    token: &str,
) -> sqlx::Result<()> {
    cache.discard_deferred();
    let hash = hash_token(token);
    let mut tx = db.begin().await?;
    sqlx::query("delete from auth_tokens where token_hash = $1")
        .bind(&hash)
        .execute(&mut *tx)
        .await?;
    let staged = cache
        .stage(&mut tx, &[Update::TokenRevoked { hash: hash.clone() }])
        .await?;
    tx.commit().await?;
    // This process forgets the token before the commit's cache step revokes it everywhere
    // (`Cache::finish`), so its own lookups in flight store nothing.
    tokens.forget_token(&hash);
    cache.finish(db, staged).await;
    Ok(())
}

/// A bearer token's SHA-256 (see [`hash_token`]), once its shape is checked.
///
/// # Errors
/// `InvalidToken` for anything but 43 base64url characters.
pub fn token_hash(token: &str) -> ApiResult<Vec<u8>> {
    if token.len() != TOKEN_LEN
        || !token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(ApiError::InvalidToken);
    }
    Ok(hash_token(token))
}

/// The id of the user whose token has the SHA-256 `hash` ([`token_hash`]): from this
/// process's memory ([`TokenCache`]), else from the Redis token cache (one round trip), else
/// from Postgres (then cached in both): [`cached_token`], then [`load_token`].
///
/// # Errors
/// `InvalidToken` for an unknown or revoked token.
pub async fn authenticate(
    db: &PgPool,
    cache: &Cache,
    tokens: &TokenCache,
    hash: &[u8],
) -> ApiResult<i64> {
    match cached_token(cache, tokens, hash).await {
        Known::User(id) => Ok(id),
        Known::Invalid => Err(ApiError::InvalidToken),
        Known::Neither(lookup) => {
            let (id, _, fill) = load_token(db, cache, tokens, hash, lookup).await?;
            if let Some(fill) = fill {
                fill.send(cache).await;
            }
            Ok(id)
        }
    }
}

/// What the caches know of a token ([`cached_token`]).
pub enum Known {
    /// Its user.
    User(i64),
    /// Revoked, or found unknown within the last minute.
    Invalid,
    /// Nothing: ask Postgres ([`load_token`]) with this lookup, begun before Redis was asked.
    Neither(Lookup),
}

/// What this process's memory, then the Redis token cache (one round trip), know of the token
/// with SHA-256 `hash`, without asking Postgres (a client over its failed-authentication
/// limit gets this far: `http::extract::authenticate`). A user found in Redis is remembered
/// in memory, a revocation as unknown.
pub async fn cached_token(cache: &Cache, tokens: &TokenCache, hash: &[u8]) -> Known {
    if let Some(id) = tokens.get(hash) {
        return Known::User(id);
    }
    if tokens.is_unknown(hash) {
        return Known::Invalid;
    }
    let lookup = tokens.begin();
    match cache.get_token(hash).await {
        Ok(CachedToken::User(id)) => {
            tokens.insert(lookup, hash, id);
            Known::User(id)
        }
        Ok(CachedToken::Revoked) => {
            tokens.remember_unknown(hash);
            Known::Invalid
        }
        Ok(CachedToken::Miss) | Err(_) => Known::Neither(lookup),
    }
}

/// The user of the token with SHA-256 `hash` from Postgres, remembered in memory (unless a
/// revocation was heard since `lookup` began) and, with the fill returned, in Redis. The same
/// statement reads the user's hidden set ([`crate::blocks`]), cached by the same fill: a
/// returning user's token and hidden set are gone from the caches together, and the request
/// that brings the token back filters its timeline with the set (decision 0030). The caller
/// runs the rest of the request with the fill deferred to its first read
/// ([`Cache::deferring`], decision 0037). A token Postgres does not know is remembered as
/// unknown, in Redis for [`UNKNOWN_TOKEN_SECS`] and in this process's memory, so asking again
/// costs no Postgres query (a token can not become valid later: it is random and issued,
/// stored, before any client has it).
///
/// Returns the user's id, hidden set and the cache fill (`None` with the cache off).
///
/// # Errors
/// `InvalidToken` for an unknown token; Postgres errors.
pub async fn load_token(
    db: &PgPool,
    cache: &Cache,
    tokens: &TokenCache,
    hash: &[u8],
    lookup: Lookup,
) -> ApiResult<(i64, Arc<Hidden>, Option<Deferred>)> {
    let hidden_lookup = cache.begin_hidden_lookup();
    let row: Option<(i64, i64, Vec<i64>, Vec<i64>)> = sqlx::query_as(concat!(
        "select auth_tokens.user_id, ",
        crate::hidden_set_columns!("auth_tokens.user_id"),
        " from auth_tokens join users on users.id = auth_tokens.user_id",
        " where auth_tokens.token_hash = $1",
    ))
    .bind(hash)
    .fetch_optional(db)
    .await?;
    let Some((id, version, hidden, blocked_by)) = row else {
        tokens.remember_unknown(hash);
        cache.put_unknown_token(hash, UNKNOWN_TOKEN_SECS).await;
        return Err(ApiError::InvalidToken);
    };
    let hidden = Arc::new(Hidden::new(version, hidden, blocked_by));
    let fill = cache.token_and_hidden_fill(hash, hidden_lookup, id, &hidden);
    tokens.insert(lookup, hash, id);
    Ok((id, hidden, fill))
}

/// Seconds Redis remembers a token that Postgres did not know.
pub const UNKNOWN_TOKEN_SECS: u64 = 60;

/// Validates sign-up input; returns `(username lowercase, email, password)`.
pub fn validate_signup(
    username: Option<String>,
    email: Option<String>,
    password: Option<String>,
    errors: &mut FieldErrors,
) -> Option<(String, String, String)> {
    let mut err = |field: &str, msg: &str| {
        errors
            .entry(field.to_owned())
            .or_default()
            .push(msg.to_owned());
    };
    let username = username.map(|u| u.trim().to_lowercase());
    if let Some(u) = &username {
        let ok_chars = u
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !(3..=30).contains(&u.len()) || !ok_chars {
            err(
                "username",
                "Enter 3 to 30 characters: letters, digits or underscores.",
            );
        }
    }
    let email = email.map(|e| e.trim().to_owned());
    if let Some(e) = &email
        && (e.len() > 254 || !email_address::EmailAddress::is_valid(e))
    {
        err("email", "Enter a valid email address.");
    }
    if let Some(p) = &password
        && !(8..=128).contains(&p.chars().count())
    {
        err("password", "Enter 8 to 128 characters.");
    }
    match (username, email, password) {
        (Some(u), Some(e), Some(p)) if errors.is_empty() => Some((u, e, p)),
        _ => None,
    }
}
