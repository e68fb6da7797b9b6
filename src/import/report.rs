//! What an import reports: the [`Summary`], the [`Skipped`] lines, and the per-phase timing.

use std::path::Path;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// How many examples of skipped lines the summary shows per file.
const EXAMPLES: usize = 5;

/// What was skipped while reading, with a few examples (`file:line: reason`).
#[derive(Debug, Clone, Default)]
pub struct Skipped {
    /// How many lines were skipped.
    pub count: usize,
    /// The first few skipped lines, as `file:line: reason`.
    pub examples: Vec<String>,
}

impl Skipped {
    /// Counts line `line` of `path` as skipped for `reason`, keeping it as an example while
    /// there are fewer than [`EXAMPLES`].
    pub(super) fn add(&mut self, path: &Path, line: usize, reason: impl std::fmt::Display) {
        self.count += 1;
        if self.examples.len() < EXAMPLES {
            self.examples
                .push(format!("{}:{line}: {reason}", path.display()));
        }
    }
}

/// What an import did.
#[derive(Debug, Default)]
pub struct Summary {
    /// `(phase, seconds)` in order.
    pub phases: Vec<(String, f64)>,
    /// `(table, rows after the import)`.
    pub tables: Vec<(String, i64)>,
    /// Malformed lines of the follows file.
    pub skipped_edges: Skipped,
    /// Malformed lines of the tweet files.
    pub skipped_tweets: Skipped,
    /// Edges dropped because the same edge came earlier in the file.
    pub duplicate_edges: usize,
    /// Edges dropped because an account would follow itself.
    pub self_follows: usize,
    /// Tweets dropped because a tweet with the same id came earlier.
    pub duplicate_tweets: usize,
    /// Retweets dropped: an account's second retweet of one tweet (two authors of the data
    /// may share an account), or a retweet of a retweet.
    pub dropped_retweets: usize,
    /// Tokens written to the tokens file (0 without one).
    pub tokens_written: usize,
    /// Malformed lines of the circles file.
    pub skipped_circles: Skipped,
    /// Members named twice in one circle (kept once).
    pub duplicate_members: usize,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "phase                         seconds")?;
        for (phase, secs) in &self.phases {
            writeln!(f, "{phase:<28} {secs:>8.2}")?;
        }
        let total: f64 = self.phases.iter().map(|p| p.1).sum();
        writeln!(f, "{:<28} {total:>8.2}", "total")?;
        writeln!(f, "\ntable                         rows")?;
        for (table, rows) in &self.tables {
            writeln!(f, "{table:<28} {rows:>10}")?;
        }
        writeln!(
            f,
            "\nedges: {} duplicate, {} self-follows dropped, {} malformed lines skipped",
            self.duplicate_edges, self.self_follows, self.skipped_edges.count
        )?;
        writeln!(
            f,
            "tweets: {} duplicate ids dropped, {} malformed lines skipped, {} repeated retweets dropped",
            self.duplicate_tweets, self.skipped_tweets.count, self.dropped_retweets
        )?;
        writeln!(
            f,
            "circles: {} members named twice in a circle, {} malformed lines skipped",
            self.duplicate_members, self.skipped_circles.count
        )?;
        for e in self
            .skipped_edges
            .examples
            .iter()
            .chain(&self.skipped_tweets.examples)
            .chain(&self.skipped_circles.examples)
        {
            writeln!(f, "  skipped {e}")?;
        }
        if self.tokens_written > 0 {
            writeln!(f, "tokens written: {}", self.tokens_written)?;
        }
        Ok(())
    }
}

/// A spinner with the phase name and its elapsed time.
fn spinner(msg: String) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg:<28} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    pb.set_message(msg);
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

/// The import's phases and how long each took, with a spinner for the running one.
pub(super) struct Phases {
    /// `(phase, seconds)` in order; the running phase has 0 until it ends.
    times: Vec<(String, f64)>,
    started: Instant,
    pb: Option<ProgressBar>,
}

impl Phases {
    /// No phases yet.
    pub(super) fn new() -> Self {
        Phases {
            times: Vec::new(),
            started: Instant::now(),
            pb: None,
        }
    }

    /// Runs `f` as phase `name`, without a spinner (reading shows its own progress bars).
    pub(super) fn timed<T>(&mut self, name: &str, f: impl FnOnce() -> T) -> T {
        let t0 = Instant::now();
        let out = f();
        self.times
            .push((name.to_owned(), t0.elapsed().as_secs_f64()));
        out
    }

    /// Ends the running phase, if any, and starts phase `name` with a spinner.
    pub(super) fn start(&mut self, name: &str) {
        self.end();
        self.pb = Some(spinner(name.to_owned()));
        self.started = Instant::now();
        self.times.push((name.to_owned(), 0.0));
    }

    /// Ends the running phase, if any, recording its time.
    fn end(&mut self) {
        if let Some(pb) = self.pb.take() {
            pb.finish();
            if let Some(last) = self.times.last_mut() {
                last.1 = self.started.elapsed().as_secs_f64();
            }
        }
    }

    /// Ends the running phase, if any, and returns `(phase, seconds)` in order.
    pub(super) fn finish(mut self) -> Vec<(String, f64)> {
        self.end();
        self.times
    }
}
