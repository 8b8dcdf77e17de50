//! Token counting with one tokenizer (o200k_base) for every strategy and every provider, so that
//! budgets and reports compare like with like.

use tiktoken_rs::{CoreBPE, o200k_base_singleton};

fn tokenizer() -> &'static CoreBPE {
    o200k_base_singleton()
}

/// Number of o200k_base tokens in `text`.
pub fn count_tokens(text: &str) -> usize {
    tokenizer().encode_ordinary(text).len()
}

/// The longest prefix of `text` that fits in `budget` tokens, and the token count of the whole
/// text. Returns the text unchanged when it already fits.
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
