use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use skillstate_core::json::{state_hash, text_hash};
use skillstate_core::{Action, Rejection, count_tokens};
use skillstate_providers::Usage;
use skillstate_runtime::{check_continuity, rebuild_prompt};
use skillstate_store::{IntentRecord, JournalEntry, Store, TaskRecord, Verdict, state_at};

use crate::config::{CONFIG_FILE, Config, load_config};
use crate::hidden::Hidden;
use crate::render::{Table, describe_outcome, format_time};
use crate::term;

#[derive(clap::Args)]
pub struct ShowArgs {
    /// Task id or a unique prefix of it.
    task: String,
    /// Show the state as it was after this step (0 = the initial state).
    #[arg(long)]
    step: Option<u64>,
    /// With --step: print the exact prompt the model received at that step instead.
    #[arg(long, requires = "step")]
    prompt: bool,
    /// With --step: print the full observation the step started from (prompts show it cut
    /// to the observation budget).
    #[arg(long, requires = "step", conflicts_with = "prompt")]
    observation: bool,
    /// With --prompt: which answer of the step (default: the accepted one, else the last).
    #[arg(long, requires = "prompt")]
    attempt: Option<u32>,
    /// Why the state holds its value at this JSON pointer (`/inventory/shelf_122`): the steps
    /// that wrote it, newest first, each with its patch, the observation it answered and
    /// its author.
    #[arg(long, value_name = "POINTER", conflicts_with = "step")]
    why: Option<String>,
    /// With --why: every past value, not only the steps since the value last changed.
    #[arg(long, requires = "why")]
    all: bool,
}

pub async fn run(db: &str, config_path: Option<&Path>, args: ShowArgs) -> Result<ExitCode> {
    if let Some(pointer) = &args.why {
        let store = crate::config::open_existing(db).await?;
        let task = store.task(&args.task).await?;
        return super::why::run(store.as_ref(), &task, pointer, args.all).await;
    }
    if args.step.is_none() {
        // The task view counts every answer's tokens: build the tokenizer while the database
        // is opened and read.
        skillstate_core::tokens::warm_up();
    }
    let config = load_config(config_path)?;
    let store = crate::config::open_existing(db).await?;
    let task = store.task(&args.task).await?;
    if let (Some(step), true) = (args.step, args.observation) {
        let text = store
            .observation(&task.id, step)
            .await?
            .with_context(|| format!("task {} has no observation for step {step}", task.id))?;
        let hidden = Hidden::of_history(store.as_ref(), &task, None).await?;
        term::write_exact(&format!("{}\n", hidden.text(&text)))?;
        return Ok(ExitCode::SUCCESS);
    }
    match (args.step, args.prompt) {
        (Some(step), true) => show_prompt(store.as_ref(), &task, step, args.attempt).await,
        (Some(step), false) => show_state_at(store.as_ref(), &task, step).await,
        (None, _) => show_task(store.as_ref(), &task, &config).await,
    }
}

async fn show_state_at(store: &dyn Store, task: &TaskRecord, step: u64) -> Result<ExitCode> {
    let state = state_at(store, &task.id, step, task.version).await?;
    let hidden = Hidden::of_history(store, task, None).await?;
    outln!(
        "{}",
        serde_json::to_string_pretty(&hidden.state(state.clone()))?
    );
    let hash = if hidden.hides_values() {
        "withheld (the task holds write-only values)".to_owned()
    } else {
        state_hash(&state)
    };
    let note = if step == 0 {
        "initial state".to_owned()
    } else {
        "rebuilt from the journal's patches; matches the hash recorded at this step".to_owned()
    };
    errln!(
        "state after step {step} of task {}: hash {hash} ({note})",
        task.id
    );
    Ok(ExitCode::SUCCESS)
}

async fn show_prompt(
    store: &dyn Store,
    task: &TaskRecord,
    step: u64,
    attempt: Option<u32>,
) -> Result<ExitCode> {
    let journal = store.journal(&task.id).await?;
    let answers: Vec<&JournalEntry> = journal.iter().filter(|e| e.step == step).collect();
    if answers.is_empty() {
        bail!(
            "task {} has no model call at step {step} (it has {} accepted steps)",
            task.id,
            task.version
        );
    }
    let attempt = match attempt {
        Some(a) => a,
        None => answers
            .iter()
            .find(|e| e.verdict == Verdict::Accepted)
            .or(answers.last())
            .map(|e| e.attempt)
            .unwrap_or(1),
    };
    // The count recorded when the model received the prompt: the rebuilt prompt is checked to
    // be byte-identical below, so it is this prompt's count too (and the tokenizer need not be
    // built just to print it).
    let recorded_tokens = answers
        .iter()
        .find(|e| e.attempt == attempt)
        .map(|e| e.prompt_tokens);
    let (prompt, recorded) = rebuild_prompt(store, task, step, attempt).await?;
    let text = prompt.text();
    let rebuilt = text_hash(&text);
    // The model saw the write-only values; whoever reads this does not.
    let hidden = Hidden::of_history(store, task, Some(&journal)).await?;
    let shown = hidden.text(&text);
    let exact = shown == text;
    term::write_exact(&shown)?;
    // stdout holds the prompt's exact bytes (their SHA-256 is the recorded one). What follows
    // goes to stderr after a blank line, so that in a terminal or a merged log it stands apart
    // from the prompt's last line instead of reading as part of it.
    err!("{}", if text.ends_with('\n') { "\n" } else { "\n\n" });
    if rebuilt != recorded && !exact {
        bail!(
            "the rebuilt prompt of step {step} attempt {attempt} does not match what the model received (hashes withheld: the task holds write-only values)"
        );
    }
    if rebuilt != recorded {
        bail!(
            "the rebuilt prompt of step {step} attempt {attempt} does not match what the model received (sha256 {rebuilt} vs recorded {recorded})"
        );
    }
    let tokens = recorded_tokens.unwrap_or_else(|| count_tokens(&text) as u64);
    if exact {
        errln!(
            "prompt of step {step} attempt {attempt}: {tokens} tokens, sha256 {rebuilt} (byte-identical to the prompt the model received)"
        );
    } else {
        errln!(
            "prompt of step {step} attempt {attempt}: {tokens} tokens; rebuilt byte-identical to the prompt the model received, shown with its write-only values replaced by [redacted] (sha256 withheld)"
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn show_task(store: &dyn Store, task: &TaskRecord, config: &Config) -> Result<ExitCode> {
    let journal = store.journal(&task.id).await?;
    let intents: BTreeMap<u64, IntentRecord> = store
        .intents(&task.id)
        .await?
        .into_iter()
        .map(|i| (i.step, i))
        .collect();
    let hidden = Hidden::of_history(store, task, Some(&journal)).await?;
    let rejected = journal
        .iter()
        .filter(|e| e.verdict == Verdict::Rejected)
        .count();
    let status = match &task.outcome {
        Some(outcome) => format!(
            "{} - {}",
            task.status.as_str(),
            hidden.text(&describe_outcome(outcome))
        ),
        None => task.status.as_str().to_owned(),
    };
    outln!("task     {}", task.id);
    let runs = skillstate_runtime::upgrade::version_name(&task.skill, &task.tools);
    let skill = match runs.version {
        Some(_) => format!("{} {runs}", task.skill.name),
        None => task.skill.name.clone(),
    };
    outln!(
        "skill    {skill}  (context {}, model {})",
        task.context.as_str(),
        task.model
    );
    // A task that moved between versions: each, with the step it began at.
    // (A database of an older schema, opened read-only, keeps no history of versions.)
    let versions = store.task_versions(&task.id).await.unwrap_or_default();
    if versions.len() > 1 {
        let each: Vec<String> = versions
            .iter()
            .map(|v| {
                let name = skillstate_runtime::upgrade::VersionName {
                    hash: v.hash.clone(),
                    version: v.version.clone(),
                };
                format!("{name} from step {}", v.from_step)
            })
            .collect();
        outln!("versions {}", each.join(", "));
    }
    if let Some(upgrade) = &task.upgrade_to {
        outln!(
            "upgrade  to {} scheduled by {}: committed once the waiting action is settled",
            &upgrade.hash[..upgrade.hash.len().min(12)],
            upgrade.author
        );
    }
    if let Some((parent, step)) = &task.parent {
        outln!("forked   from {parent} at step {step}");
    }
    outln!("status   {status}");
    outln!(
        "created  {}   updated {}",
        format_time(task.created_at),
        format_time(task.updated_at)
    );
    outln!(
        "steps    {} accepted, {rejected} rejected answer(s)",
        task.version
    );
    outln!("tokens   {}", token_summary(&journal, &task.model, config));
    let hash = if hidden.hides_values() {
        "withheld (write-only values)".to_owned()
    } else {
        state_hash(&task.state)
    };
    outln!("state    version {}, hash {hash}", task.version);
    outln!(
        "{}",
        serde_json::to_string(&hidden.state(task.state.clone()))?
    );
    outln!();

    let mut by_step: BTreeMap<u64, Vec<&JournalEntry>> = BTreeMap::new();
    for entry in &journal {
        by_step.entry(entry.step).or_default().push(entry);
    }
    let mut table = Table::new(&[
        "STEP", "PROMPT", "OUTPUT", "USAGE", "MS", "ACTION", "PATCH", "RESULT", "VERDICT",
    ]);
    // Every step the task claims is listed: one whose rows are gone shows as missing instead
    // of silently disappearing from the table.
    // (Steps up to the snapshot gc left were compacted on purpose and are not listed.)
    let compacted = store.journal_extent(&task.id).await?.base.unwrap_or(0);
    for step in compacted + 1..=task.version {
        by_step.entry(step).or_default();
    }
    for (step, answers) in &by_step {
        let Some(last) = answers.last() else {
            table.row(vec![
                step.to_string(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "MISSING from the journal".into(),
            ]);
            continue;
        };
        let accepted = answers.iter().find(|e| e.verdict == Verdict::Accepted);
        let shown = accepted.unwrap_or(last);
        let rejected_here = answers
            .iter()
            .filter(|e| e.verdict == Verdict::Rejected)
            .count();
        let verdict = match (accepted, rejected_here) {
            (Some(_), 0) => "accepted".to_owned(),
            (Some(_), n) => format!("accepted after {n} rejected"),
            (None, n) => format!("rejected x{n}"),
        };
        let action = shown
            .action
            .as_ref()
            .and_then(Action::from_call_json)
            .map(|a| hidden.text(&a.summary()).into_owned())
            .unwrap_or_else(|| "-".into());
        let patch = shown
            .patch
            .as_ref()
            .map(|p| {
                let p = hidden.patch(p.clone());
                clip(&serde_json::to_string(&p).unwrap_or_default(), 48)
            })
            .unwrap_or_else(|| "-".into());
        let result = match intents.get(step) {
            Some(intent) if !intent.done => "pending".to_owned(),
            Some(intent) if intent.ok == Some(true) => "ok".to_owned(),
            Some(intent) => clip(
                &hidden.text(intent.result.as_deref().unwrap_or("error")),
                40,
            ),
            None => "-".to_owned(),
        };
        table.row(vec![
            step.to_string(),
            shown.prompt_tokens.to_string(),
            output_tokens(shown).to_string(),
            usage_cell(shown.usage.as_ref()),
            shown.latency_ms.to_string(),
            action,
            patch,
            result,
            verdict,
        ]);
    }
    out!("{}", table.render());
    outln!(
        "PROMPT and OUTPUT are o200k_base tokens counted locally; USAGE is what the provider reported (input/output)."
    );

    let broken = check_continuity(store, task).await.err();
    if let Some(problem) = &broken {
        errln!("warning: {problem}");
    }

    let rejections: Vec<&JournalEntry> = journal
        .iter()
        .filter(|e| e.verdict == Verdict::Rejected)
        .collect();
    if !rejections.is_empty() {
        outln!("\nrejected answers:");
        for entry in rejections {
            let errors: Vec<Rejection> = entry
                .errors
                .as_ref()
                .and_then(|e| serde_json::from_value(e.clone()).ok())
                .unwrap_or_default();
            for error in errors {
                outln!(
                    "  step {} attempt {}: {}",
                    entry.step,
                    entry.attempt,
                    hidden.text(&error.to_string())
                );
            }
        }
    }
    Ok(if broken.is_some() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The answer's output tokens as written with it; rows from before the count was stored are
/// counted now.
fn output_tokens(entry: &JournalEntry) -> u64 {
    entry
        .output_tokens
        .unwrap_or_else(|| count_tokens(&entry.output) as u64)
}

fn usage_cell(usage: Option<&Value>) -> String {
    match usage {
        Some(u) => format!(
            "{}/{}",
            u.get("input_tokens").and_then(Value::as_u64).unwrap_or(0),
            u.get("output_tokens").and_then(Value::as_u64).unwrap_or(0)
        ),
        None => "-".into(),
    }
}

/// Cuts stored values for a table: a stored value was redacted where it entered
/// (`outside::Outside`), so no cut here can split a secret.
fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let kept: String = text.chars().take(max - 1).collect();
    format!("{kept}…")
}

/// Local counts for every model call, the provider's own figures, and the cost estimate.
fn token_summary(journal: &[JournalEntry], model: &str, config: &Config) -> String {
    // Saturating: the counts come from the database, which may hold anything.
    let prompt = journal
        .iter()
        .map(|e| e.prompt_tokens)
        .fold(0u64, u64::saturating_add);
    let output = journal
        .iter()
        .map(output_tokens)
        .fold(0u64, u64::saturating_add);
    let mut text = format!("local {prompt} prompt + {output} output (o200k_base)");
    let reported: Vec<Usage> = journal
        .iter()
        .filter_map(|e| {
            e.usage
                .as_ref()
                .and_then(|u| serde_json::from_value::<Usage>(u.clone()).ok())
        })
        .collect();
    if reported.is_empty() {
        return text + "; the model reported no usage";
    }
    let mut total = Usage::default();
    for usage in &reported {
        total.add(usage);
    }
    text.push_str(&format!("; provider {} in", total.input_tokens));
    if let Some(cached) = total.cached_input_tokens {
        text.push_str(&format!(" ({cached} cached)"));
    }
    if let Some(written) = total.cache_write_tokens {
        text.push_str(&format!(" ({written} written to cache)"));
    }
    text.push_str(&format!(" + {} out", total.output_tokens));
    match config.cost(model, &total) {
        Some(cost) => text.push_str(&format!("; cost ≈ ${cost:.4}")),
        None => text.push_str(&format!(
            "; no price for {model} under [prices] in {CONFIG_FILE}"
        )),
    }
    text
}
