//! The entities of a tweet's text (Twitter v1.1's `entities`): a sigil that does not join a
//! word, then a run of body characters. [`crate::mentions::parse`] (`@name`) and
//! [`crate::hashtags::parse`] (`#tag`) are two [`Grammar`]s of one [`scan`].

/// How one kind of entity is written.
pub struct Grammar {
    /// The characters that open one: the ASCII sigil and its full-width form.
    pub sigils: [char; 2],
    /// Whether a character may be part of the body.
    pub body: fn(char) -> bool,
    /// Whether a sigil right after this character opens nothing (it joins a word, as in
    /// `ann@example.com` or `&#38;`).
    pub joins: fn(char) -> bool,
}

/// The bodies of `grammar`'s entities in `content`, in order and as written: each the longest
/// run of body characters after an opening sigil, possibly empty (a sigil with nothing after
/// it). The scan goes on after each body, so the body's last character is what a next sigil
/// follows.
pub fn scan<'a>(content: &'a str, grammar: &'a Grammar) -> impl Iterator<Item = &'a str> + 'a {
    let mut chars = content.char_indices().peekable();
    let mut prev: Option<char> = None;
    std::iter::from_fn(move || {
        while let Some((i, c)) = chars.next() {
            let opens = grammar.sigils.contains(&c) && !prev.is_some_and(grammar.joins);
            prev = Some(c);
            if !opens {
                continue;
            }
            let start = i + c.len_utf8();
            let mut end = start;
            while let Some(&(j, d)) = chars.peek() {
                if !(grammar.body)(d) {
                    break;
                }
                end = j + d.len_utf8();
                prev = Some(d);
                chars.next();
            }
            return Some(&content[start..end]);
        }
        None
    })
}

/// The first `cap` distinct `items`, in order of first appearance (a tweet's entities are
/// listed once each).
pub fn distinct(items: impl Iterator<Item = String>, cap: usize) -> Vec<String> {
    let mut kept: Vec<String> = Vec::new();
    for item in items {
        if kept.len() == cap {
            break;
        }
        if !kept.contains(&item) {
            kept.push(item);
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word(c: char) -> bool {
        c.is_alphanumeric()
    }

    const DOLLAR: Grammar = Grammar {
        sigils: ['$', '＄'],
        body: word,
        joins: word,
    };

    #[test]
    fn a_scan_yields_each_body_as_written() {
        let found: Vec<&str> = scan("$A x$b $ $$c ＄é", &DOLLAR).collect();
        assert_eq!(found, ["A", "", "", "c", "é"]);
        assert_eq!(scan("", &DOLLAR).count(), 0);
    }

    #[test]
    fn distinct_keeps_the_first_of_each_up_to_the_cap() {
        let items = ["a", "b", "a", "c", "d"].map(String::from).into_iter();
        assert_eq!(distinct(items.clone(), 10), ["a", "b", "c", "d"]);
        assert_eq!(distinct(items, 3), ["a", "b", "c"]);
    }
}
