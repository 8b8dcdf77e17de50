//! Parsing what a model said into reasoning, a raw patch and a raw action.
//!
//! Two forms are accepted (docs/concepts.md, "What the model sees and must answer"): one JSON object
//! `{reasoning, state_patch, action}`, or free text followed by a fenced ```json block holding
//! `state_patch` and `action` (the text before the block is the reasoning).

use serde_json::{Map, Value};

use crate::strict_json::{StrictJsonError, parse_strict};

/// A model output that has the expected outer shape. Patch and action are still unchecked.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedOutput {
    pub reasoning: String,
    pub state_patch: Value,
    pub action: RawAction,
}

/// An action as the model wrote it: a tool name and its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct RawAction {
    pub tool: String,
    pub args: Value,
}

/// Why an output could not be parsed, with a pointer into the output document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseProblem {
    pub pointer: String,
    pub message: String,
}

pub const EXPECTED_FORM: &str = "expected one JSON object {\"reasoning\": \"...\", \"state_patch\": {...}, \"action\": {\"tool\": \"NAME\", \"args\": {...}}}, or free text followed by a ```json block holding \"state_patch\" and \"action\"";

pub fn parse_output(text: &str) -> Result<ParsedOutput, ParseProblem> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(problem("", format!("the output is empty; {EXPECTED_FORM}")));
    }
    if trimmed.starts_with('{') {
        return match parse_json(trimmed) {
            Ok(Value::Object(map)) => from_object(map, None),
            Ok(_) => Err(problem(
                "",
                format!("the output is not a JSON object; {EXPECTED_FORM}"),
            )),
            Err(error) if !error.syntax => Err(refused(error)),
            Err(error) => Err(problem(
                "",
                format!(
                    "the output starts like JSON but is not valid JSON ({error}); {EXPECTED_FORM}"
                ),
            )),
        };
    }
    let Some((before, block)) = last_fenced_block(trimmed) else {
        return Err(problem(
            "",
            format!("found no JSON object and no ```json block; {EXPECTED_FORM}"),
        ));
    };
    match parse_json(block.trim()) {
        Ok(Value::Object(map)) => from_object(map, Some(before.trim().to_owned())),
        Ok(_) => Err(problem(
            "",
            format!("the ```json block does not hold a JSON object; {EXPECTED_FORM}"),
        )),
        Err(error) if !error.syntax => Err(refused(error)),
        Err(error) => Err(problem(
            "",
            format!("the ```json block is not valid JSON ({error}); {EXPECTED_FORM}"),
        )),
    }
}

fn from_object(
    mut map: Map<String, Value>,
    text_reasoning: Option<String>,
) -> Result<ParsedOutput, ParseProblem> {
    let reasoning = match map.remove("reasoning") {
        Some(Value::String(s)) => s,
        Some(Value::Null) | None => text_reasoning.unwrap_or_default(),
        Some(other) => other.to_string(),
    };
    let Some(state_patch) = map.remove("state_patch") else {
        return Err(problem(
            "/state_patch",
            "missing key \"state_patch\"; send {} when the state does not change".to_owned(),
        ));
    };
    let Some(action) = map.remove("action") else {
        return Err(problem(
            "/action",
            "missing key \"action\"; send {\"tool\": \"NAME\", \"args\": {...}}".to_owned(),
        ));
    };
    Ok(ParsedOutput {
        reasoning,
        state_patch,
        action: parse_action(action)?,
    })
}

fn parse_action(action: Value) -> Result<RawAction, ParseProblem> {
    let Value::Object(mut map) = action else {
        return Err(problem(
            "/action",
            "\"action\" must be an object {\"tool\": \"NAME\", \"args\": {...}}".to_owned(),
        ));
    };
    let tool = match map.remove("tool") {
        Some(Value::String(name)) if !name.trim().is_empty() => name,
        Some(_) => {
            return Err(problem(
                "/action/tool",
                "\"tool\" must be a non-empty string naming a tool".to_owned(),
            ));
        }
        None => {
            return Err(problem(
                "/action/tool",
                "missing key \"tool\" in \"action\"".to_owned(),
            ));
        }
    };
    let args = match map.remove("args") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(args) => args,
    };
    if let Some(extra) = map.keys().next() {
        return Err(problem(
            &format!("/action/{}", crate::json::escape_token(extra)),
            format!("unexpected key \"{extra}\" in \"action\"; put tool arguments inside \"args\""),
        ));
    }
    Ok(RawAction { tool, args })
}

/// Parses JSON strictly (duplicate keys and numbers beyond ±2^53 are refused with their
/// pointer, see `strict_json`), tolerating raw control characters inside strings (some
/// constrained decoders, llama.cpp's among them, let a literal newline into a string); they are
/// escaped and the text parsed again. The original error is kept when that does not help either.
fn parse_json(text: &str) -> Result<Value, StrictJsonError> {
    match parse_strict(text) {
        Err(error) if error.syntax => match escape_controls_in_strings(text) {
            Some(escaped) => match parse_strict(&escaped) {
                Err(again) if again.syntax => Err(error),
                other => other,
            },
            None => Err(error),
        },
        other => other,
    }
}

/// A value the strict parser refused (duplicate key, number beyond ±2^53), at its pointer.
fn refused(error: StrictJsonError) -> ParseProblem {
    problem(&error.pointer, error.message)
}

/// `text` with control characters inside string literals escaped, or `None` if it has none.
fn escape_controls_in_strings(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    let mut changed = false;
    for c in text.chars() {
        if in_string && !escaped && (c as u32) < 0x20 {
            out.push_str(&format!("\\u{:04x}", c as u32));
            changed = true;
            continue;
        }
        match c {
            '"' if !escaped => in_string = !in_string,
            _ => {}
        }
        escaped = in_string && c == '\\' && !escaped;
        out.push(c);
    }
    changed.then_some(out)
}

/// The contents of the last fenced code block and the text before it.
fn last_fenced_block(text: &str) -> Option<(&str, &str)> {
    let close = text.rfind("```")?;
    let open = text[..close].rfind("```")?;
    let after_ticks = &text[open + 3..close];
    // Drop an info string such as `json` on the opening fence line.
    let body = match after_ticks.find('\n') {
        Some(newline) if !after_ticks[..newline].trim_start().starts_with('{') => {
            &after_ticks[newline + 1..]
        }
        _ => after_ticks,
    };
    Some((&text[..open], body))
}

fn problem(pointer: &str, message: String) -> ParseProblem {
    ParseProblem {
        pointer: pointer.to_owned(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_the_object_form() {
        let out = parse_output(r#"{"reasoning":"ship it","state_patch":{"inventory":{"shelf_1":null}},"action":{"tool":"ship","args":{"item":"item_1","shelf":"shelf_1"}}}"#).unwrap();
        assert_eq!(out.reasoning, "ship it");
        assert_eq!(out.state_patch, json!({"inventory": {"shelf_1": null}}));
        assert_eq!(out.action.tool, "ship");
        assert_eq!(out.action.args["shelf"], "shelf_1");
    }

    #[test]
    fn parses_text_then_fenced_json() {
        let text = "The order is for item_3, which sits on shelf_9.\n\n```json\n{\"state_patch\": {}, \"action\": {\"tool\": \"wait\"}}\n```\n";
        let out = parse_output(text).unwrap();
        assert_eq!(
            out.reasoning,
            "The order is for item_3, which sits on shelf_9."
        );
        assert_eq!(out.action.args, json!({}));
    }

    #[test]
    fn tolerates_raw_control_characters_inside_strings() {
        let out = parse_output("{\"reasoning\": \"line one\nline two\\\"\tq\", \"state_patch\": {}, \"action\": {\"tool\": \"wait\"}}").unwrap();
        assert_eq!(out.reasoning, "line one\nline two\"\tq");
        assert!(parse_output("{\"reasoning\": \"x\"\n,}").is_err());
    }

    #[test]
    fn explains_what_was_expected() {
        for bad in [
            "",
            "I will ship the item.",
            "[1,2]",
            "{\"state_patch\": {}",
            "```json\n[]\n```",
        ] {
            let err = parse_output(bad).unwrap_err();
            assert!(
                err.message.contains("expected"),
                "{bad:?} -> {}",
                err.message
            );
        }
        assert_eq!(
            parse_output(r#"{"action":{"tool":"wait"}}"#)
                .unwrap_err()
                .pointer,
            "/state_patch"
        );
        assert_eq!(
            parse_output(r#"{"state_patch":{}}"#).unwrap_err().pointer,
            "/action"
        );
        assert_eq!(
            parse_output(r#"{"state_patch":{},"action":{"tool":"ship","item":"x"}}"#)
                .unwrap_err()
                .pointer,
            "/action/item"
        );
        assert_eq!(
            parse_output(r#"{"state_patch":{},"action":"wait"}"#)
                .unwrap_err()
                .pointer,
            "/action"
        );
    }

    #[test]
    fn refuses_duplicate_keys_and_big_numbers_with_pointers() {
        let err = parse_output(
            r#"{"state_patch": {"inventory": {"a": "x", "a": "y"}}, "action": {"tool": "wait"}}"#,
        )
        .unwrap_err();
        assert_eq!(err.pointer, "/state_patch/inventory/a");
        assert!(err.message.contains("twice"), "{}", err.message);
        let err = parse_output(
            "Counting.\n```json\n{\"state_patch\": {\"n\": 9007199254740993}, \"action\": {\"tool\": \"wait\"}}\n```",
        )
        .unwrap_err();
        assert_eq!(err.pointer, "/state_patch/n");
        assert!(err.message.contains("string"), "{}", err.message);
    }
}
