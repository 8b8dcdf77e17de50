//! The spans of a run, for OpenTelemetry traces (docs/operations/telemetry.md): a task run,
//! each step, each model call and each tool call, named and attributed after the GenAI
//! semantic conventions, plus skillstate's own `skillstate.*` attributes.
//!
//! They are `tracing` spans of the target [`TARGET`]; the binary exports that target, and only
//! it, through the `tracing-opentelemetry` bridge when telemetry is on. Off, the spans are
//! disabled at their call sites and their fields are never evaluated.
//!
//! What an attribute may hold: ids, step and attempt numbers, the skill's and tool's names,
//! the model spec's provider and model (never a scripted file's path), token counts, verdicts,
//! rejection kinds and the pointer a rejection names (read from the answer after its secrets
//! were redacted). Contents — prompts, answers, tool arguments and results — only with
//! `[telemetry] capture_content = true`, redacted of secrets, and never for a task whose state
//! schema has a write-only location (its values appear in prompts and answers; the span says
//! `skillstate.content_withheld = "write_only"` instead).

use skillstate_providers::trace_context;
use tracing::Span;
use tracing::field::Empty;

/// The target of every span exported.
pub const TARGET: &str = "skillstate_trace";

/// A task's run (one claim of a worker, one `run`, `resume`, `approve`…): `invoke_agent`.
pub(crate) fn task(task: &str, skill: &str, parent: Option<&str>) -> Span {
    let span = tracing::info_span!(
        target: "skillstate_trace",
        "invoke_agent",
        otel.name = format!("invoke_agent {skill}"),
        otel.kind = "internal",
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = skill,
        skillstate.task.id = task,
        skillstate.task.status = Empty,
    );
    if let Some(parent) = parent {
        trace_context::set_parent(&span, parent);
    }
    span
}

/// One step: the answers asked for until one is accepted, its commit and its action.
pub(crate) fn step(task: &str, step: u64) -> Span {
    tracing::info_span!(
        target: "skillstate_trace",
        "step",
        otel.name = format!("step {step}"),
        otel.kind = "internal",
        skillstate.task.id = task,
        skillstate.step = step as i64,
        skillstate.step.verdict = Empty,
        skillstate.step.attempts = Empty,
        skillstate.action = Empty,
    )
}

/// One model call (`chat`), with the provider and model read from the model spec.
pub(crate) fn model_call(task: &str, step: u64, attempt: u32, spec: &str) -> Span {
    let (provider, model) = provider_and_model(spec);
    tracing::info_span!(
        target: "skillstate_trace",
        "chat",
        otel.name = format!("chat {model}"),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = provider,
        gen_ai.request.model = model,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.usage.cache_read.input_tokens = Empty,
        gen_ai.usage.cache_creation.input_tokens = Empty,
        skillstate.usage.reported = Empty,
        skillstate.task.id = task,
        skillstate.step = step as i64,
        skillstate.attempt = i64::from(attempt),
        skillstate.verdict = Empty,
        skillstate.rejection.kind = Empty,
        skillstate.rejection.pointer = Empty,
        skillstate.rejections = Empty,
        skillstate.content_withheld = Empty,
        gen_ai.input.messages = Empty,
        gen_ai.output.messages = Empty,
        error.type = Empty,
    )
}

/// One tool call (`execute_tool`), MCP and built-in alike.
pub(crate) fn tool_call(task: &str, step: u64, tool: &str) -> Span {
    tracing::info_span!(
        target: "skillstate_trace",
        "execute_tool",
        otel.name = format!("execute_tool {tool}"),
        otel.kind = "internal",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = tool,
        gen_ai.tool.type = "function",
        skillstate.task.id = task,
        skillstate.step = step as i64,
        skillstate.tool.ok = Empty,
        skillstate.content_withheld = Empty,
        gen_ai.tool.call.arguments = Empty,
        gen_ai.tool.call.result = Empty,
        error.type = Empty,
    )
}

/// `gen_ai.provider.name` and `gen_ai.request.model` of a model spec (`openai:gpt-4.1-mini`).
/// A scripted provider's file path is not a model name and stays out.
pub(crate) fn provider_and_model(spec: &str) -> (&str, &str) {
    match spec.split_once(':') {
        Some(("scripted", _)) => ("scripted", "scripted"),
        Some((provider, model)) => (provider, model),
        None => (spec, spec),
    }
}

/// Whether contents may go into spans for a task: `Err("")` when capture is off, else
/// `Err(reason)` when the task's frame withholds them (`TaskFrame::content_withheld`).
pub(crate) fn content_allowed(withheld: Option<&'static str>) -> Result<(), &'static str> {
    if !trace_context::capture_content() {
        return Err("");
    }
    match withheld {
        Some(reason) => Err(reason),
        None => Ok(()),
    }
}

/// The longest content attribute, in bytes (cut at a character boundary).
pub(crate) const MAX_CONTENT: usize = 16 * 1024;

/// `text` cut to [`MAX_CONTENT`] bytes.
pub(crate) fn clip(text: &str) -> &str {
    if text.len() <= MAX_CONTENT {
        return text;
    }
    let mut end = MAX_CONTENT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_name_provider_and_model() {
        assert_eq!(
            provider_and_model("openai:gpt-4.1-mini"),
            ("openai", "gpt-4.1-mini")
        );
        assert_eq!(
            provider_and_model("scripted:/home/me/answers.jsonl"),
            ("scripted", "scripted")
        );
        assert_eq!(provider_and_model("oracle"), ("oracle", "oracle"));
    }

    #[test]
    fn clip_keeps_characters_whole() {
        let text = "é".repeat(MAX_CONTENT);
        assert!(clip(&text).len() <= MAX_CONTENT);
        assert!(text.starts_with(clip(&text)));
    }
}
