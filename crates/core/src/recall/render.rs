//! The recall tool's result: hits newest first (or oldest), one line each, cut to the skill's
//! `[budgets] recall_tokens` by dropping whole hits from the end, so a prompt that shows a
//! recall result stays bounded.

use super::{RecallHit, RecallQuery};
use crate::tokens::count_tokens;

/// The marker of the last line when hits were left out: `… N more matches not shown (recall budget).`
pub const HITS_NOT_SHOWN: &str = "more matches not shown (recall budget)";

/// The result text of one recall. `more` says whether the store has older (or newer) hits
/// beyond the ones given.
pub fn render_hits(
    query: &RecallQuery,
    hits: &[RecallHit],
    more: bool,
    budget_tokens: usize,
) -> String {
    let described = query.describe();
    if hits.is_empty() {
        return format!("Recall: no matches for {described}.");
    }
    let order = if query.oldest_first {
        "oldest first"
    } else {
        "newest first"
    };
    let head = |shown: usize| {
        let more = if more || shown < hits.len() {
            " (more exist)"
        } else {
            ""
        };
        format!("Recall: {shown} matches for {described}, {order}{more}.")
    };
    let lines: Vec<String> = hits.iter().map(line).collect();
    // Whole hits from the front while the text fits; the first one is cut if it alone does not.
    let mut shown = lines.len();
    loop {
        let mut text = head(shown);
        for line in &lines[..shown] {
            text.push('\n');
            text.push_str(line);
        }
        if shown < lines.len() {
            text.push_str(&format!("\n… {} {HITS_NOT_SHOWN}.", lines.len() - shown));
        }
        if count_tokens(&text) <= budget_tokens || shown == 0 {
            return text;
        }
        if shown == 1 {
            // One hit that does not fit alone: cut it to what fits.
            return cut_to_tokens(&text, budget_tokens);
        }
        shown -= 1;
    }
}

fn line(hit: &RecallHit) -> String {
    let text = hit.text.replace("\r\n", " ⏎ ").replace(['\n', '\r'], " ⏎ ");
    format!("[step {} {}] {}", hit.step, hit.kind.as_str(), text)
}

/// `text` cut to `budget` tokens with a marker, never mid-character.
fn cut_to_tokens(text: &str, budget: usize) -> String {
    const MARK: &str = " … [cut: recall budget]";
    let mut end = text.len();
    while end > 0 {
        end = (end * 3 / 4).max(end.saturating_sub(4096));
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let candidate = format!("{}{MARK}", &text[..end]);
        if count_tokens(&candidate) <= budget {
            return candidate;
        }
    }
    MARK.trim_start().to_owned()
}
