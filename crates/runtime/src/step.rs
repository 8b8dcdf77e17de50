//! One step's answer loop: the model is asked until an answer is accepted or the step's retry
//! budget (`StepBudget`) runs out; each rejected answer is journaled and fed back, and answers
//! refused only for meeting others' board writes are free up to `MAX_CONFLICTS_PER_STEP`.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use skillstate_core::board::{BoardRules, mounted_view, validate_board_step};
use skillstate_core::json::text_hash;
use skillstate_core::outside::Outside;
use skillstate_core::prompt::Turn;
use skillstate_core::validate::Document;
use skillstate_core::{Action, Rejection, RejectionKind, StepRules, count_tokens, validate_step};
use skillstate_providers::ModelRequest;
use skillstate_providers::{ProviderError, Usage, trace_context};
use skillstate_store::{JournalEntry, LeasedWrite, TaskStatus, Verdict};
use skillstate_tools::{Tool, failpoint};
use tracing::Instrument;

use crate::RuntimeError;
use crate::act::{Acted, unreachable_refusal};
use crate::frame::TaskFrame;
use crate::recovery::Attempts;
use crate::step_loop::{Runner, now_millis};

/// The retry budget of one step.
pub(crate) struct StepBudget {
    /// The first attempt whose answer counts against the budget.
    pub(crate) first_counted: u32,
    /// The answers the step had before this run reached it.
    pub(crate) earlier: Attempts,
}

pub(crate) enum StepEnd {
    Continue,
    /// The task completed, failed or paused.
    Stop,
}

impl Runner<'_> {
    /// One step: ask the model until an answer is accepted or retries run out, commit it, act.
    /// Answers from attempt `budget.first_counted` on count against the retry budget (1 unless
    /// a `retry` restarted it); `budget.earlier` are the answers the step already had.
    pub(crate) async fn step(
        &mut self,
        task: &str,
        frame: &TaskFrame,
        (state, version): (&mut Value, &mut u64),
        budget: StepBudget,
        env_tools: &[Arc<dyn Tool>],
        turns: &mut Vec<Turn>,
    ) -> Result<StepEnd, RuntimeError> {
        let step = *version + 1;
        // The observation this runner just recorded is the stored one; only the first step of
        // a run reads it back.
        let observation = match self.next_observation.take() {
            Some((of, at, text)) if of == task && at == step => text,
            _ => self.store.observation(task, step).await?.ok_or_else(|| {
                RuntimeError::StoredTask {
                    task: task.to_owned(),
                    message: format!("no observation recorded for step {step}"),
                }
            })?,
        };
        let settings = frame.skill.settings();
        let rules = StepRules {
            schema: &frame.skill.schema,
            catalog: &frame.catalog,
            state_token_budget: settings.budgets.state_tokens,
        };
        let StepBudget {
            first_counted,
            earlier,
        } = budget;
        let first_attempt = earlier.made.saturating_add(1);
        let max_attempts = settings.run.max_retries.saturating_add(1);
        // Answers refused for meeting others' board writes before this run reached the step
        // (a crash in the middle of it) are free as they were then.
        let mut conflicts = earlier.board_conflicts_from(first_counted);
        let mut last_attempt = first_counted
            .saturating_sub(1)
            .saturating_add(max_attempts)
            .saturating_add(conflicts.min(MAX_CONFLICTS_PER_STEP));
        let mut retry: Vec<Rejection> = earlier.last_errors;
        let mut attempt = first_attempt;
        while attempt <= last_attempt {
            self.check_lease()?;
            // A board member's prompt shows the newest board through its reads, at `/board`.
            let seen = match &frame.board {
                Some(board) => Some(board.read(self.store.as_ref()).await?),
                None => None,
            };
            let shown = match (&frame.board, &seen) {
                (Some(board), Some(seen)) => {
                    std::borrow::Cow::Owned(mounted_view(state, &seen.state, &board.scope))
                }
                _ => std::borrow::Cow::Borrowed(&*state),
            };
            let prompt = frame.prompt(&shown, &observation, &retry, turns);
            let text = prompt.text();
            let prompt_tokens = count_tokens(&text);
            let call_span = if trace_context::enabled() {
                crate::spans::model_call(task, step, attempt, &self.model.spec())
            } else {
                tracing::Span::none()
            };
            let content = crate::spans::content_allowed(frame.content_withheld());
            match content {
                Ok(()) => {
                    let shown = Outside::new(text.clone()).redacted(&self.secrets);
                    call_span.record(
                        "gen_ai.input.messages",
                        messages("user", crate::spans::clip(&shown)),
                    );
                }
                Err("") => {}
                Err(reason) => {
                    call_span.record("skillstate.content_withheld", reason);
                }
            }
            let started = Instant::now();
            failpoint("before_model");
            let response = match self
                .model
                .complete(&ModelRequest {
                    prompt,
                    prompt_tokens,
                    output_schema: Some(frame.output_schema.clone()),
                })
                .instrument(call_span.clone())
                .await
            {
                Ok(response) => response,
                // A draining worker's request that was not sent (its rate-limit wait ended
                // with the drain), or that failed meanwhile, does not fail the task: it stays
                // running, for the next worker to continue.
                Err(_) if self.draining() => return Ok(StepEnd::Stop),
                Err(error) => {
                    call_span.record("error.type", provider_error_type(&error));
                    tracing::Span::current().record("skillstate.step.verdict", "provider_error");
                    crate::metrics::model_failed();
                    self.finish(
                        task,
                        TaskStatus::Failed,
                        json!({"reason": "provider", "message": error.to_string(), "step": step}),
                    )
                    .await?;
                    return Ok(StepEnd::Stop);
                }
            };
            let latency = started.elapsed();
            let latency_ms = latency.as_millis() as u64;
            crate::metrics::model_answered(latency, prompt_tokens, response.usage.as_ref());
            failpoint("after_model");
            // The answer is untrusted text: secrets it echoes are gone before anything reads it.
            let answer_text = Outside::new(response.text).redacted(&self.secrets);
            record_usage(
                &call_span,
                prompt_tokens,
                &answer_text,
                response.usage.as_ref(),
                response.truncated,
            );
            if content.is_ok() {
                call_span.record(
                    "gen_ai.output.messages",
                    messages("assistant", crate::spans::clip(&answer_text)),
                );
            }
            let mut verdict = match (&frame.board, &seen) {
                (Some(board), Some(seen)) => validate_board_step(
                    &rules,
                    &BoardRules {
                        schema: &seen.schema,
                        scope: &board.scope,
                    },
                    state,
                    &seen.state,
                    &answer_text,
                ),
                _ => validate_step(&rules, state, &answer_text),
            };
            if let (true, Err(rejected)) = (response.truncated, &mut verdict) {
                rejected.rejections.insert(0, truncation_rejection());
            }

            record_verdict(
                &call_span,
                verdict.as_ref().map(|_| ()).map_err(|r| &r.rejections[..]),
            );
            self.observer
                .attempt(step, attempt, prompt_tokens, verdict.as_ref());
            crate::metrics::answer(verdict.as_ref());
            let output_tokens = Some(count_tokens(&answer_text) as u64);
            let mut entry = JournalEntry {
                step,
                attempt,
                verdict: Verdict::Rejected,
                output: answer_text,
                patch: None,
                action: None,
                errors: None,
                state_hash: None,
                prompt_tokens: prompt_tokens as u64,
                output_tokens,
                prompt_hash: text_hash(&text),
                usage: response.usage.and_then(|u| serde_json::to_value(u).ok()),
                latency_ms,
                created_at: now_millis(),
                author: None,
                board_version: seen.as_ref().map(|s| s.version),
            };
            match verdict {
                Err(rejected) => {
                    entry.errors = serde_json::to_value(&rejected.rejections).ok();
                    self.writer()
                        .write(task, LeasedWrite::Rejection(&entry))
                        .await?;
                    retry = rejected.rejections;
                    attempt += 1;
                }
                Ok(accepted) => {
                    let answer = entry.output.clone();
                    let action = accepted.action.summary();
                    let step_span = tracing::Span::current();
                    step_span.record("skillstate.step.verdict", "accepted");
                    step_span.record("skillstate.step.attempts", i64::from(attempt));
                    step_span.record(
                        "skillstate.action",
                        match &accepted.action {
                            Action::Tool { name, .. } => name.as_str(),
                            Action::Finish { .. } => "finish",
                            Action::AskUser { .. } => "ask_user",
                        },
                    );
                    let needs_approval = match &accepted.action {
                        Action::Tool { name, .. } => {
                            frame.catalog.get(name).is_some_and(|t| t.needs_approval)
                        }
                        _ => false,
                    };
                    let refusable = frame.board.is_some().then(|| entry.clone());
                    let board = frame.board.as_ref().zip(seen.as_ref());
                    let acted = self
                        .commit_and_act(
                            task,
                            step,
                            entry,
                            accepted,
                            (state, version),
                            board,
                            env_tools,
                            needs_approval,
                        )
                        .await?;
                    let (end, result) = match (acted, refusable) {
                        (Acted::Done(end, result), _) => (end, result),
                        (Acted::Refused(rejections), Some(mut entry)) => {
                            // Others' writes met this answer: not the model's mistake, so
                            // it does not spend the retry budget (up to a bound).
                            entry.errors = serde_json::to_value(&rejections).ok();
                            self.writer()
                                .write(task, LeasedWrite::Rejection(&entry))
                                .await?;
                            retry = rejections;
                            conflicts += 1;
                            if conflicts <= MAX_CONFLICTS_PER_STEP {
                                last_attempt = last_attempt.saturating_add(1);
                            }
                            attempt += 1;
                            continue;
                        }
                        (Acted::Refused(_), None) => unreachable_refusal(task)?,
                    };
                    if frame.context.uses_turns() {
                        turns.push(Turn {
                            step,
                            observation,
                            answer,
                            action,
                            result,
                        });
                    }
                    return Ok(end);
                }
            }
        }
        let step_span = tracing::Span::current();
        step_span.record("skillstate.step.verdict", "rejected");
        step_span.record(
            "skillstate.step.attempts",
            i64::from(attempt.saturating_sub(1)),
        );
        let summary: Vec<String> = retry.iter().map(ToString::to_string).collect();
        self.finish(
            task,
            TaskStatus::Failed,
            json!({
                "reason": "rejected",
                "message": format!("step {step}: every one of {max_attempts} answers was rejected; last errors: {}", summary.join("; ")),
                "step": step,
                "errors": retry,
            }),
        )
        .await?;
        Ok(StepEnd::Stop)
    }
}

/// How many of one step's answers may be refused for meeting others' board writes without
/// spending its retry budget.
const MAX_CONFLICTS_PER_STEP: u32 = 32;

/// Fed back when the provider cut the answer off at its token limit.
fn truncation_rejection() -> Rejection {
    Rejection {
        kind: RejectionKind::Parse,
        document: Document::Output,
        pointer: String::new(),
        message:
            "the answer was cut off at the token limit before it was complete; answer more briefly"
                .into(),
    }
}

/// The GenAI conventions' message list of one text part, as JSON text.
pub(crate) fn messages(role: &str, text: &str) -> String {
    json!([{"role": role, "parts": [{"type": "text", "content": text}]}]).to_string()
}

/// A model call's token counts: the provider's when it reported them, else counted here
/// (`skillstate.usage.reported = false`); its finish reason.
fn record_usage(
    span: &tracing::Span,
    prompt_tokens: usize,
    answer: &str,
    usage: Option<&Usage>,
    truncated: bool,
) {
    if span.is_disabled() {
        return;
    }
    match usage {
        Some(usage) => {
            span.record("gen_ai.usage.input_tokens", count(usage.input_tokens));
            span.record("gen_ai.usage.output_tokens", count(usage.output_tokens));
            if let Some(cached) = usage.cached_input_tokens {
                span.record("gen_ai.usage.cache_read.input_tokens", count(cached));
            }
            if let Some(written) = usage.cache_write_tokens {
                span.record("gen_ai.usage.cache_creation.input_tokens", count(written));
            }
            span.record("skillstate.usage.reported", true);
        }
        None => {
            span.record("gen_ai.usage.input_tokens", prompt_tokens as i64);
            span.record("gen_ai.usage.output_tokens", count_tokens(answer) as i64);
            span.record("skillstate.usage.reported", false);
        }
    }
    let reason = if truncated { "length" } else { "stop" };
    trace_context::set_strings(span, "gen_ai.response.finish_reasons", &[reason]);
}

/// A count as a span attribute: the OpenTelemetry bridge exports integers as `i64`.
fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// An answer's verdict on its model call's span: the first rejection's kind and pointer (a
/// location in the answer or the state, never a value), and how many there were.
fn record_verdict(span: &tracing::Span, verdict: Result<(), &[Rejection]>) {
    if span.is_disabled() {
        return;
    }
    match verdict {
        Ok(()) => {
            span.record("skillstate.verdict", "accepted");
        }
        Err(rejections) => {
            span.record("skillstate.verdict", "rejected");
            span.record("skillstate.rejections", rejections.len() as i64);
            if let Some(first) = rejections.first() {
                span.record("skillstate.rejection.kind", first.kind.as_str());
                span.record("skillstate.rejection.pointer", first.pointer.as_str());
            }
        }
    }
}

/// `error.type` of a failed model call: the error's kind, never its text.
fn provider_error_type(error: &ProviderError) -> &'static str {
    match error {
        ProviderError::UnknownSpec(_) => "unknown_spec",
        ProviderError::Script { .. } | ProviderError::Exhausted { .. } => "script",
        ProviderError::Auth { .. } => "auth",
        ProviderError::ModelNotFound { .. } => "model_not_found",
        ProviderError::Rejected { .. } => "rejected",
        ProviderError::Unavailable { .. } => "unavailable",
        ProviderError::Protocol { .. } => "protocol",
        ProviderError::Config(_) => "config",
    }
}
