//! Reading the input: the follower graph (edge list) and the tweets (JSON lines), plain or
//! gzipped, with a progress bar over each file's bytes.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use anyhow::Context;
use chrono::{DateTime, Utc};
use flate2::read::MultiGzDecoder;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;

use super::report::Skipped;
use crate::model::Place;
use crate::time::Timestamp;

/// One tweet as read from the input.
#[derive(Debug, Clone)]
pub(super) struct InTweet {
    pub(super) id: i64,
    pub(super) author: i64,
    pub(super) created_at: Timestamp,
    pub(super) text: String,
    pub(super) reply_to: Option<i64>,
    /// The retweeted tweet (v1.1 `retweeted_status.id_str`), for a retweet.
    pub(super) retweet_of: Option<i64>,
    /// `[lon, lat]` (v1.1 `coordinates.coordinates`).
    pub(super) coordinates: Option<[f64; 2]>,
    /// `place.full_name` with `place.bounding_box` reduced to `[sw_lon, sw_lat, ne_lon, ne_lat]`.
    pub(super) place: Option<Place>,
    /// The mentioned users' (Twitter) ids, in order (v1.1 `entities.user_mentions[].id_str`,
    /// of the extended tweet when there is one).
    pub(super) mentions: Vec<i64>,
}

#[derive(Deserialize)]
struct RawTweet {
    id_str: Option<String>,
    created_at: Option<String>,
    user: Option<RawUser>,
    text: Option<String>,
    full_text: Option<String>,
    extended_tweet: Option<RawExtended>,
    in_reply_to_status_id_str: Option<String>,
    coordinates: Option<RawPoint>,
    place: Option<RawPlace>,
    /// A retweet's original, embedded whole.
    retweeted_status: Option<Box<RawTweet>>,
    entities: Option<RawEntities>,
}

/// v1.1 `entities`: only the mentions are read (hashtags are parsed from the text, as a post's).
#[derive(Deserialize)]
struct RawEntities {
    user_mentions: Option<Vec<RawMention>>,
}

#[derive(Deserialize)]
struct RawMention {
    id_str: Option<String>,
}

impl RawEntities {
    /// The mentioned users' ids, in order.
    fn mentions(self) -> Vec<i64> {
        (self.user_mentions.into_iter().flatten())
            .filter_map(|m| m.id_str?.parse().ok())
            .collect()
    }
}

/// v1.1 `coordinates`: a GeoJSON point, `[lon, lat]`.
#[derive(Deserialize)]
struct RawPoint {
    coordinates: Option<Vec<f64>>,
}

/// v1.1 `place`: its name and a GeoJSON polygon (one ring of `[lon, lat]` corners).
#[derive(Deserialize)]
struct RawPlace {
    full_name: Option<String>,
    bounding_box: Option<RawPolygon>,
}

#[derive(Deserialize)]
struct RawPolygon {
    coordinates: Option<Vec<Vec<Vec<f64>>>>,
}

/// `[lon, lat]` if both are finite and in range.
fn point(c: &[f64]) -> Option<[f64; 2]> {
    match *c {
        [lon, lat] if (-180.0..=180.0).contains(&lon) && (-90.0..=90.0).contains(&lat) => {
            Some([lon, lat])
        }
        _ => None,
    }
}

/// A place from its v1.1 object: the bounding box of the polygon's corners.
fn place(raw: RawPlace) -> Option<Place> {
    let name = raw.full_name.filter(|n| !n.trim().is_empty())?;
    let rings = raw.bounding_box?.coordinates?;
    let corners: Vec<[f64; 2]> = rings.iter().flatten().filter_map(|c| point(c)).collect();
    let first = corners.first()?;
    let mut bbox = [first[0], first[1], first[0], first[1]];
    for [lon, lat] in &corners {
        bbox = [
            bbox[0].min(*lon),
            bbox[1].min(*lat),
            bbox[2].max(*lon),
            bbox[3].max(*lat),
        ];
    }
    Some(Place {
        full_name: name.replace('\0', ""),
        bbox,
    })
}

#[derive(Deserialize)]
struct RawUser {
    id_str: Option<String>,
}

#[derive(Deserialize)]
struct RawExtended {
    full_text: Option<String>,
    entities: Option<RawEntities>,
}

/// A progress bar over `len` bytes, labelled `msg`.
fn bar(len: u64, msg: &'static str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{msg:<18} [{bar:30}] {bytes}/{total_bytes} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(msg);
    pb
}

/// Opens a plain or gzipped file, with a progress bar over its bytes on disk.
fn open(path: &Path, msg: &'static str) -> anyhow::Result<(Box<dyn BufRead>, ProgressBar)> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let pb = bar(len, msg);
    let raw = pb.wrap_read(file);
    let gz = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gz"));
    let reader: Box<dyn Read> = if gz {
        Box::new(MultiGzDecoder::new(raw))
    } else {
        Box::new(raw)
    };
    Ok((Box::new(BufReader::with_capacity(1 << 20, reader)), pb))
}

/// Calls `each(line_number, line)` for every line; a line that is not UTF-8 is passed as `Err`.
/// An I/O error (unreadable or corrupt file) stops with the file and line.
fn for_each_line(
    path: &Path,
    reader: &mut dyn BufRead,
    mut each: impl FnMut(usize, Result<&str, &str>),
) -> anyhow::Result<()> {
    let mut buf = Vec::with_capacity(4096);
    let mut n = 0;
    loop {
        buf.clear();
        let read = reader
            .read_until(b'\n', &mut buf)
            .with_context(|| format!("reading {} after line {n}", path.display()))?;
        if read == 0 {
            return Ok(());
        }
        n += 1;
        while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            buf.pop();
        }
        match std::str::from_utf8(&buf) {
            Ok(line) => each(n, Ok(line)),
            Err(_) => each(n, Err("not UTF-8")),
        }
    }
}

/// The follower graph as read: `(a, b)` means a follows b, in file order, each edge once.
pub(super) struct Edges {
    pub(super) edges: Vec<(i64, i64)>,
    pub(super) skipped: Skipped,
    pub(super) duplicates: usize,
    pub(super) self_follows: usize,
}

/// Reads an edge list (`A B` per line; blank lines and `#` comments ignored), dropping
/// duplicate edges and self-follows and skipping malformed lines.
pub(super) fn read_follows(path: &Path) -> anyhow::Result<Edges> {
    let (mut reader, pb) = open(path, "follows")?;
    let mut seen = HashSet::new();
    let mut out = Edges {
        edges: Vec::new(),
        skipped: Skipped::default(),
        duplicates: 0,
        self_follows: 0,
    };
    for_each_line(path, &mut *reader, |n, line| {
        let line = match line {
            Ok(l) => l.trim(),
            Err(reason) => return out.skipped.add(path, n, reason),
        };
        if line.is_empty() || line.starts_with('#') {
            return;
        }
        let mut parts = line.split_whitespace();
        let parsed = match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(b), None) => a.parse::<i64>().ok().zip(b.parse::<i64>().ok()),
            _ => None,
        };
        match parsed {
            None => out.skipped.add(path, n, "expected two integer ids"),
            Some((a, b)) if a == b => out.self_follows += 1,
            Some(edge) => {
                if seen.insert(edge) {
                    out.edges.push(edge);
                } else {
                    out.duplicates += 1;
                }
            }
        }
    })?;
    pb.finish();
    Ok(out)
}

/// Parses Twitter's `created_at` format (`Wed Nov 09 06:57:54 +0000 2016`).
pub(super) fn parse_twitter_time(s: &str) -> Option<Timestamp> {
    DateTime::parse_from_str(s, "%a %b %d %H:%M:%S %z %Y")
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// Parses one Twitter API v1.1 JSON line, or says why it is unusable: the tweet and, for a
/// retweet, its embedded original (if usable itself).
fn parse_tweet(line: &str) -> Result<(InTweet, Option<InTweet>), &'static str> {
    let mut raw: RawTweet = serde_json::from_str(line).map_err(|_| "not a JSON tweet object")?;
    let original = raw.retweeted_status.take().and_then(|o| from_raw(*o).ok());
    let mut tweet = from_raw(raw)?;
    tweet.retweet_of = original.as_ref().map(|o| o.id);
    Ok((tweet, original))
}

/// A tweet from its v1.1 object, or why it is unusable.
fn from_raw(raw: RawTweet) -> Result<InTweet, &'static str> {
    let id = raw
        .id_str
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or("no id_str")?;
    let author = raw
        .user
        .and_then(|u| u.id_str)
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or("no author")?;
    let created_at = raw
        .created_at
        .as_deref()
        .and_then(parse_twitter_time)
        .ok_or("no valid created_at")?;
    // The extended tweet's text and entities, when it has them (the short ones are cut).
    let (extended_text, extended_entities) = match raw.extended_tweet {
        Some(e) => (e.full_text, e.entities),
        None => (None, None),
    };
    let mentions = extended_entities
        .or(raw.entities)
        .map(RawEntities::mentions)
        .unwrap_or_default();
    let text = extended_text
        .or(raw.full_text)
        .or(raw.text)
        .map(|t| t.replace('\0', ""))
        .filter(|t| !t.trim().is_empty())
        .ok_or("no text")?;
    let reply_to = raw
        .in_reply_to_status_id_str
        .and_then(|s| s.parse::<i64>().ok());
    Ok(InTweet {
        id,
        author,
        created_at,
        text,
        reply_to,
        retweet_of: None,
        coordinates: raw.coordinates.and_then(|c| point(&c.coordinates?)),
        place: raw.place.and_then(place),
        mentions,
    })
}

/// Reads the tweet files in order: the tweets (each id once, first one wins; a retweet's
/// embedded original right after it, unless read before), what was skipped, and how many
/// duplicate ids were dropped.
pub(super) fn read_tweets(paths: &[PathBuf]) -> anyhow::Result<(Vec<InTweet>, Skipped, usize)> {
    let mut tweets = Vec::new();
    let mut seen = HashSet::new();
    let mut skipped = Skipped::default();
    let mut duplicates = 0;
    for path in paths {
        let (mut reader, pb) = open(path, "tweets")?;
        for_each_line(path, &mut *reader, |n, line| match line.map(parse_tweet) {
            Err(reason) | Ok(Err(reason)) => {
                if !line.is_ok_and(|l| l.trim().is_empty()) {
                    skipped.add(path, n, reason);
                }
            }
            Ok(Ok((t, original))) => {
                if seen.insert(t.id) {
                    tweets.push(t);
                } else {
                    duplicates += 1;
                }
                if let Some(original) = original
                    && seen.insert(original.id)
                {
                    tweets.push(original);
                }
            }
        })?;
        pb.finish();
    }
    Ok((tweets, skipped, duplicates))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twitter_dates_parse() {
        let t = parse_twitter_time("Wed Nov 09 06:57:54 +0000 2016").unwrap();
        assert_eq!(crate::time::format(&t), "2016-11-09T06:57:54.000000Z");
    }
}

/// One list of a SNAP ego-Twitter circles file: its owner (the ego), name and members.
#[derive(Debug, Clone)]
pub(super) struct InList {
    pub(super) owner: i64,
    pub(super) name: String,
    pub(super) members: Vec<i64>,
}

/// A circles file as read.
#[derive(Debug, Default)]
pub(super) struct Circles {
    pub(super) lists: Vec<InList>,
    pub(super) skipped: Skipped,
    /// Members named twice in one list (kept once).
    pub(super) duplicate_members: usize,
}

/// Reads SNAP ego-Twitter circles (`ego<TAB>circle name<TAB>member id<TAB>…` per line, each
/// circle one of the ego's Twitter lists), skipping malformed lines: a bad id, or a name that
/// is empty or longer than a list name may be.
pub(super) fn read_circles(path: &Path) -> anyhow::Result<Circles> {
    let (mut reader, pb) = open(path, "circles")?;
    let mut out = Circles::default();
    for_each_line(path, &mut *reader, |n, line| {
        let line = match line {
            Ok(l) => l.trim_end(),
            Err(reason) => return out.skipped.add(path, n, reason),
        };
        if line.is_empty() || line.starts_with('#') {
            return;
        }
        let mut fields = line.split('\t');
        let owner = fields.next().and_then(|o| o.trim().parse::<i64>().ok());
        let name = fields.next().map(str::trim).unwrap_or_default();
        let Some(owner) = owner else {
            return out.skipped.add(path, n, "expected an integer ego id");
        };
        if name.is_empty() || name.chars().count() > crate::lists::MAX_NAME_CHARS {
            return out
                .skipped
                .add(path, n, "expected a list name of 1 to 25 characters");
        }
        let mut members = Vec::new();
        let mut seen = HashSet::new();
        for raw in fields {
            match raw.trim().parse::<i64>() {
                Ok(m) if seen.insert(m) => members.push(m),
                Ok(_) => out.duplicate_members += 1,
                Err(_) => return out.skipped.add(path, n, "expected integer member ids"),
            }
        }
        out.lists.push(InList {
            owner,
            name: name.to_owned(),
            members,
        });
    })?;
    pb.finish();
    Ok(out)
}
