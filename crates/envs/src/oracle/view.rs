//! Reading a rendered prompt back into its parts, the way a model would read it: the state
//! block, summary lines, transcript turns and the latest observation. Only the prompt text is
//! used; nothing here can see the environment.

use serde_json::Value;

/// One earlier step as the prompt shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnView<'a> {
    pub observation: &'a str,
    pub answer: &'a str,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct PromptView<'a> {
    /// The state block, when the strategy shows one.
    pub state: Option<Value>,
    /// Summary lines of older steps, oldest first.
    pub summary: Vec<&'a str>,
    /// Transcript turns, oldest first.
    pub turns: Vec<TurnView<'a>>,
    pub latest: &'a str,
}

const CONTEXT_START: &str = "\n# Answer format\nReply with exactly one JSON object";

/// Splits `prompt` into the sections the renderer writes after its stable prefix.
pub fn read_prompt(prompt: &str) -> PromptView<'_> {
    let body = match prompt.find(CONTEXT_START) {
        Some(at) => {
            let rest = &prompt[at + CONTEXT_START.len()..];
            // The answer-format section ends at the first blank line followed by a header.
            rest.find("\n\n# ").map(|i| &rest[i + 2..]).unwrap_or(rest)
        }
        None => prompt,
    };
    let mut view = PromptView::default();
    for (header, content) in sections(body) {
        match header {
            "# Current state" => {
                view.state = serde_json::Deserializer::from_str(content)
                    .into_iter::<Value>()
                    .next()
                    .and_then(Result::ok);
            }
            "# Summary of earlier steps" => {
                view.summary = content
                    .lines()
                    .filter(|l| l.starts_with("- step "))
                    .collect();
            }
            "# Latest observation" => view.latest = content.trim_end_matches('\n'),
            h if h.starts_with("# Earlier steps") || h.starts_with("# Recent steps") => {
                view.turns.extend(turns(content));
            }
            _ => {}
        }
    }
    view
}

/// `(header line, content)` for every top-level `# ` section of `body`.
fn sections(body: &str) -> Vec<(&str, &str)> {
    let mut starts: Vec<usize> = Vec::new();
    if body.starts_with("# ") {
        starts.push(0);
    }
    starts.extend(body.match_indices("\n# ").map(|(i, _)| i + 1));
    let mut out = Vec::new();
    for (n, &start) in starts.iter().enumerate() {
        let end = starts.get(n + 1).copied().unwrap_or(body.len());
        let section = &body[start..end];
        let (header, content) = section.split_once('\n').unwrap_or((section, ""));
        out.push((header.trim_end(), content));
    }
    out
}

fn turns(content: &str) -> Vec<TurnView<'_>> {
    content
        .split("## Step ")
        .skip(1)
        .filter_map(|chunk| {
            let (_, rest) = chunk.split_once("\nObservation:\n")?;
            let (observation, answer) = rest.rsplit_once("\nAnswer:\n")?;
            Some(TurnView {
                observation,
                answer: answer.trim_end(),
            })
        })
        .collect()
}

/// Observation lines before the telemetry block and any truncation marker.
pub fn relevant_lines(observation: &str) -> Vec<&str> {
    observation
        .lines()
        .take_while(|l| l.trim() != crate::noise::HEADER)
        .filter(|l| !l.trim().is_empty() && !l.starts_with("[observation truncated"))
        .collect()
}

/// Every line of earlier steps that may carry a fact, oldest first: each summary line's alert
/// parts and result ("- step k: ALERT => ACTION -> RESULT"), then each transcript observation.
pub fn history_lines<'a>(view: &PromptView<'a>) -> Vec<&'a str> {
    let mut lines = Vec::new();
    for line in &view.summary {
        let (alert, rest) = line.split_once(" => ").unwrap_or((line, ""));
        let result = rest.split_once(" -> ").map(|(_, r)| r).unwrap_or("");
        let alert = alert.split_once(": ").map(|(_, a)| a).unwrap_or(alert);
        lines.extend(alert.split(" / "));
        lines.push(result);
    }
    for turn in &view.turns {
        lines.extend(relevant_lines(turn.observation));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROMPT: &str = "# Procedure\nDo it.\n\n# Answer format\nReply with exactly one JSON object.\n- rules\n\n# Current state\n{\n  \"inventory\": {\"shelf_1\": \"item_1\"}\n}\n\n# Summary of earlier steps\n- step 1: A => store() -> Success: Stored item_1 on shelf_1.\n\n# Recent steps\n## Step 2\nObservation:\nSuccess: x\nCustomer ordered item_1.\nAnswer:\n{\"a\": 1}\n\n# Latest observation\nSuccess: y\nMaintenance required on shelf_1. Move its item to shelf_2.\n\n# Your previous answer was rejected\n- [schema] state /x: bad\n";

    #[test]
    fn reads_every_section() {
        let view = read_prompt(PROMPT);
        assert_eq!(view.state.unwrap()["inventory"]["shelf_1"], "item_1");
        assert_eq!(
            view.summary,
            vec!["- step 1: A => store() -> Success: Stored item_1 on shelf_1."]
        );
        assert_eq!(
            view.turns,
            vec![TurnView {
                observation: "Success: x\nCustomer ordered item_1.",
                answer: "{\"a\": 1}"
            }]
        );
        assert_eq!(
            view.latest,
            "Success: y\nMaintenance required on shelf_1. Move its item to shelf_2."
        );
    }
}
