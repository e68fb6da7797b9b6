//! What a public stream (`statuses/filter`, `statuses/sample`) keeps: its predicates.

use std::collections::HashSet;

use super::About;

/// What a public stream keeps: a deterministic sample, or predicates OR-ed together.
#[derive(Debug, Clone)]
pub enum Filter {
    /// `statuses/sample`: tweet ids whose `id mod 100` falls in `percent` residues starting
    /// at `offset` (derived from the caller, so a caller always gets the same sample).
    Sample { percent: u8, offset: u8 },
    /// `statuses/filter`.
    Match(Predicates),
}

/// The predicates of `statuses/filter`: a tweet matches when ANY one does.
#[derive(Debug, Clone, Default)]
pub struct Predicates {
    /// Phrases as lists of lowercase words: a phrase matches when all its words are words of
    /// the text.
    pub track: Vec<Vec<String>>,
    /// Accounts: their tweets and retweets, replies to and retweets of their tweets, and tweets
    /// that mention them (Twitter v1.1's `follow`).
    pub follow: HashSet<i64>,
    /// Boxes `[sw_lon, sw_lat, ne_lon, ne_lat]` (edges included).
    pub locations: Vec<[f64; 4]>,
}

/// The words of `text` as `track` compares them: split on anything but letters, digits, `_`,
/// `#` and `@`, lowercased.
pub fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '#' || c == '@'))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

impl Filter {
    /// The sample of `caller` at `percent` (1–100).
    pub fn sample(caller: i64, percent: u8) -> Self {
        Filter::Sample {
            percent,
            offset: (caller.wrapping_mul(37).rem_euclid(100)) as u8,
        }
    }

    pub(super) fn keeps(&self, about: &About, text_words: &mut Option<HashSet<String>>) -> bool {
        match self {
            Filter::Sample { percent, offset } => {
                (about.tweet_id.rem_euclid(100) - i64::from(*offset)).rem_euclid(100)
                    < i64::from(*percent)
            }
            Filter::Match(p) => p.matches(about, text_words),
        }
    }
}

impl Predicates {
    /// Whether `about` matches any predicate; `text_words` caches the text's words across
    /// the clients of one message.
    fn matches(&self, about: &About, text_words: &mut Option<HashSet<String>>) -> bool {
        let followed = |user: &i64| self.follow.contains(user);
        if followed(&about.user_id)
            || about.in_reply_to_user_id.as_ref().is_some_and(followed)
            || about.retweeted_user_id.as_ref().is_some_and(followed)
            || about.mentioned_user_ids.iter().any(followed)
        {
            return true;
        }
        let located = self.locations.iter().any(|b| {
            let point = about
                .coordinates
                .is_some_and(|[lon, lat]| b[0] <= lon && lon <= b[2] && b[1] <= lat && lat <= b[3]);
            let place = about
                .bbox
                .is_some_and(|p| p[0] <= b[2] && b[0] <= p[2] && p[1] <= b[3] && b[1] <= p[3]);
            point || place
        });
        if located {
            return true;
        }
        if self.track.is_empty() {
            return false;
        }
        let set = text_words.get_or_insert_with(|| words(&about.text).collect());
        self.track
            .iter()
            .any(|phrase| phrase.iter().all(|w| set.contains(w)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn track_compares_whole_words_case_insensitively() {
        let p = Predicates {
            track: vec![vec!["hello".into(), "world".into()], vec!["#rust".into()]],
            ..Predicates::default()
        };
        let about = |text: &str| About {
            tweet_id: 1,
            user_id: 1,
            text: text.into(),
            version: 0,
            coordinates: None,
            bbox: None,
            in_reply_to_user_id: None,
            retweeted_user_id: None,
            mentioned_user_ids: Vec::new(),
        };
        assert!(p.matches(&about("World, HELLO!"), &mut None));
        assert!(p.matches(&about("I like #Rust."), &mut None));
        assert!(!p.matches(&about("hello worlds"), &mut None));
        assert!(!p.matches(&about("rust"), &mut None));
    }

    #[test]
    fn a_box_includes_its_edges_and_overlapping_places() {
        let p = Predicates {
            locations: vec![[-10.0, -10.0, 10.0, 10.0]],
            ..Predicates::default()
        };
        let at = |coordinates, bbox| About {
            tweet_id: 1,
            user_id: 1,
            text: String::new(),
            version: 0,
            coordinates,
            bbox,
            in_reply_to_user_id: None,
            retweeted_user_id: None,
            mentioned_user_ids: Vec::new(),
        };
        assert!(p.matches(&at(Some([10.0, -10.0]), None), &mut None));
        assert!(!p.matches(&at(Some([10.0001, 0.0]), None), &mut None));
        assert!(p.matches(&at(None, Some([10.0, 10.0, 20.0, 20.0])), &mut None));
        assert!(!p.matches(&at(None, Some([10.5, 0.0, 20.0, 20.0])), &mut None));
    }

    #[test]
    fn follow_keeps_the_accounts_tweets_replies_retweets_and_mentions() {
        let p = Predicates {
            follow: [7].into_iter().collect(),
            ..Predicates::default()
        };
        let about = |user_id, in_reply_to_user_id| About {
            tweet_id: 1,
            user_id,
            text: String::new(),
            version: 0,
            coordinates: None,
            bbox: None,
            in_reply_to_user_id,
            retweeted_user_id: None,
            mentioned_user_ids: Vec::new(),
        };
        assert!(p.matches(&about(7, None), &mut None));
        assert!(p.matches(&about(8, Some(7)), &mut None));
        assert!(!p.matches(&about(8, Some(9)), &mut None));
        assert!(!p.matches(&about(8, None), &mut None));
        // A retweet of their tweet, and a tweet that mentions them (Twitter's `follow`).
        let retweet = About {
            retweeted_user_id: Some(7),
            ..about(8, None)
        };
        assert!(p.matches(&retweet, &mut None));
        let mentioning = About {
            mentioned_user_ids: vec![3, 7],
            ..about(8, None)
        };
        assert!(p.matches(&mentioning, &mut None));
        let others = About {
            mentioned_user_ids: vec![3],
            ..about(8, None)
        };
        assert!(!p.matches(&others, &mut None));
    }

    #[test]
    fn a_sample_keeps_percent_residues_per_caller() {
        let f = Filter::sample(42, 10);
        let kept = (0..1000)
            .filter(|id| {
                let about = About {
                    tweet_id: *id,
                    user_id: 1,
                    text: String::new(),
                    version: 0,
                    coordinates: None,
                    bbox: None,
                    in_reply_to_user_id: None,
                    retweeted_user_id: None,
                    mentioned_user_ids: Vec::new(),
                };
                f.keeps(&about, &mut None)
            })
            .count();
        assert_eq!(kept, 100);
    }
}
