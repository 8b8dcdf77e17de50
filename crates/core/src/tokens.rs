//! Token counting with one tokenizer (o200k_base) for every strategy and every provider, so that
//! budgets and reports compare like with like.
//!
//! Building the tokenizer takes a noticeable moment (its 200,000-entry vocabulary is decoded
//! and hashed), so it is built once per process, on the first count that really needs it:
//! commands that count nothing never pay for it, and a text whose byte length already fits a
//! budget is never counted against it (a token is at least one byte). `warm_up` builds it on a
//! background thread when a command knows it will count soon.
//!
//! Counting is cached by segment: `count_tokens` cuts a text before every line that starts
//! with `#` (the headings and turns of a rendered prompt), counts each segment and remembers
//! the counts of the longer segments, so the stable prefix of a prompt and the earlier turns
//! of a transcript are counted once, not at every step. The pre-tokenizer never joins a
//! newline with a `#` that follows it, so the sum of the segments' counts is exactly the count
//! of the whole text (checked by the tests below).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use tiktoken_rs::{CoreBPE, o200k_base_singleton};

fn tokenizer() -> &'static CoreBPE {
    o200k_base_singleton()
}

/// Starts building the tokenizer on a background thread, so that the first count does not
/// wait for all of it. Only the first call in a process does anything.
pub fn warm_up() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let _ = std::thread::Builder::new()
            .name("tokenizer-warm-up".into())
            .spawn(|| {
                tokenizer();
            });
    });
}

/// Number of o200k_base tokens in `text`.
pub fn count_tokens(text: &str) -> usize {
    segments(text).map(count_segment).sum()
}

/// Whether `text` is at most `budget` tokens. Counts only when its byte length is over the
/// budget: a token is at least one byte.
pub fn fits_in_tokens(text: &str, budget: usize) -> bool {
    text.len() <= budget || count_tokens(text) <= budget
}

/// The longest prefix of `text` that fits in `budget` tokens, and the token count of the whole
/// text. Returns the text unchanged when it already fits. It cuts observations only, which are
/// built from redacted text (`outside::Outside` in the runtime), never from raw outside text.
pub fn truncate_to_tokens(text: &str, budget: usize) -> (String, usize) {
    let tokens = tokenizer().encode_ordinary(text);
    let total = tokens.len();
    if total <= budget {
        return (text.to_owned(), total);
    }
    // A token boundary can fall inside a multi-byte character; back off until it decodes.
    let mut keep = budget;
    loop {
        if keep == 0 {
            return (String::new(), total);
        }
        if let Ok(prefix) = tokenizer().decode(&tokens[..keep]) {
            return (prefix, total);
        }
        keep -= 1;
    }
}

/// `text` cut before every `#` that starts a line (each newline stays with the segment it
/// ends).
fn segments(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let cut = rest
            .match_indices("\n#")
            .map(|(at, _)| at + 1)
            .next()
            .unwrap_or(rest.len());
        let (segment, tail) = rest.split_at(cut);
        rest = tail;
        Some(segment)
    })
}

/// Segments shorter than this are counted every time (cheaper than remembering them).
const CACHED_FROM_BYTES: usize = 128;
/// Bytes of segment text one generation of the cache holds; at most two generations are kept.
const GENERATION_BYTES: usize = 8 << 20;

/// Segment counts, in two generations: a segment found in the older one moves to the newer;
/// when the newer one is full, it becomes the older and the older is dropped. Bounded memory,
/// and what every step uses again (the prefix, the transcript's turns) stays.
#[derive(Default)]
struct SegmentCache {
    current: HashMap<Box<str>, usize>,
    current_bytes: usize,
    previous: HashMap<Box<str>, usize>,
}

impl SegmentCache {
    fn get(&mut self, segment: &str) -> Option<usize> {
        if let Some(count) = self.current.get(segment) {
            return Some(*count);
        }
        let (key, count) = self.previous.remove_entry(segment)?;
        self.insert(key, count);
        Some(count)
    }

    fn insert(&mut self, segment: Box<str>, count: usize) {
        if self.current_bytes + segment.len() > GENERATION_BYTES {
            self.previous = std::mem::take(&mut self.current);
            self.current_bytes = 0;
        }
        self.current_bytes += segment.len();
        self.current.insert(segment, count);
    }
}

static CACHE: Mutex<Option<SegmentCache>> = Mutex::new(None);

fn cache() -> MutexGuard<'static, Option<SegmentCache>> {
    CACHE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn count_segment(segment: &str) -> usize {
    if segment.len() < CACHED_FROM_BYTES {
        return tokenizer().encode_ordinary(segment).len();
    }
    if let Some(count) = cache().get_or_insert_with(Default::default).get(segment) {
        return count;
    }
    // Counted without holding the lock: other threads count at the same time.
    let count = tokenizer().encode_ordinary(segment).len();
    cache()
        .get_or_insert_with(Default::default)
        .insert(segment.into(), count);
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uncached(text: &str) -> usize {
        tokenizer().encode_ordinary(text).len()
    }

    #[test]
    fn counts_and_truncates() {
        let text = "Customer ordered item_12. ".repeat(50);
        let total = count_tokens(&text);
        assert!(total > 100);
        let (cut, counted) = truncate_to_tokens(&text, 20);
        assert_eq!(counted, total);
        assert!(count_tokens(&cut) <= 20);
        assert!(text.starts_with(&cut));
        let (same, _) = truncate_to_tokens("short", 20);
        assert_eq!(same, "short");
    }

    #[test]
    fn truncation_never_splits_a_character() {
        let text = "状態".repeat(200);
        for budget in 1..12 {
            let (cut, _) = truncate_to_tokens(&text, budget);
            assert!(text.starts_with(&cut));
        }
    }

    #[test]
    fn segments_cover_the_text_and_cut_before_headings() {
        let text = "a\n# b\n\n## c\nx#y\n#";
        let parts: Vec<&str> = segments(text).collect();
        assert_eq!(parts, vec!["a\n", "# b\n\n", "## c\nx#y\n", "#"]);
        assert_eq!(parts.concat(), text);
        assert_eq!(segments("").count(), 0);
        assert_eq!(
            segments("no heading").collect::<Vec<_>>(),
            vec!["no heading"]
        );
    }

    /// The whole point of cutting: the segments' counts add up to the whole text's count, for
    /// whatever precedes a newline and whatever follows the `#`.
    #[test]
    fn segmented_counts_equal_whole_counts() {
        let befores = [
            "word", "word.", "x ", "x  ", "42", "}", "/", "\t", " ", "é", "状態", "'s", "\r", "\n",
            "!!", "a\n\n\n",
        ];
        let newlines = ["\n", "\n\n", " \n", "\r\n", "\n \n", "\n\t\n"];
        let afters = [
            "#",
            "# Heading",
            "## Step 3",
            "#word",
            "#1",
            "#\n",
            "# ",
            "#é",
            "#'s",
            "#!",
            "#\u{a0}x",
        ];
        let long = "The inventory holds item_7 on shelf_12 and {\"a\": [1, 2, 3]} ".repeat(4);
        let mut checked = 0;
        for before in befores {
            for newline in newlines {
                for after in afters {
                    for prefix in ["", long.as_str()] {
                        let text = format!("{prefix}{before}{newline}{after} tail{newline}{after}");
                        assert_eq!(count_tokens(&text), uncached(&text), "{text:?}");
                        // Twice: the second count comes from the cache.
                        assert_eq!(count_tokens(&text), uncached(&text), "{text:?}");
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 1000);
    }

    #[test]
    fn fitting_needs_no_count_when_the_bytes_fit() {
        assert!(fits_in_tokens("abc", 3));
        assert!(!fits_in_tokens("abc def ghi jkl", 2));
        let words = "word ".repeat(10);
        assert!(fits_in_tokens(&words, uncached(&words)));
        assert!(!fits_in_tokens(&words, uncached(&words) - 1));
        // Multi-byte characters: more bytes than tokens, so the count decides.
        let text = "状態".repeat(10);
        let tokens = uncached(&text);
        assert!(tokens < text.len());
        assert!(fits_in_tokens(&text, tokens));
        assert!(!fits_in_tokens(&text, tokens - 1));
    }

    #[test]
    fn the_cache_stays_bounded() {
        let mut cache = SegmentCache::default();
        let segment = "x".repeat(1 << 20);
        for i in 0..40 {
            cache.insert(format!("{i}{segment}").into(), i);
        }
        let kept: usize = cache
            .current
            .keys()
            .chain(cache.previous.keys())
            .map(|k| k.len())
            .sum();
        assert!(kept <= 2 * GENERATION_BYTES, "{kept}");
        assert_eq!(cache.get(&format!("39{segment}")), Some(39));
        assert_eq!(cache.get(&format!("0{segment}")), None);
    }
}
