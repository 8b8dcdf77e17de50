//! What a batch's status, report and summary are made of: the figures are computed by
//! `skillstate_server::batch_report` (shared with `GET /v1/batches/{id}`); here the batch's
//! model, skill and price are read from its batch file and skillstate.toml, and failure
//! reasons are cleaned of write-only values.

use skillstate_store::prelude::*;
use skillstate_store::{BatchRecord, BatchTask};

use skillstate_server::batch_report;
#[cfg(test)]
pub use skillstate_server::batch_report::Standing;
pub use skillstate_server::batch_report::{Report, TaskRow, now_millis};

use crate::config::Config;
use crate::hidden::Hidden;

/// Reads the batch and its tasks and computes the figures.
pub async fn load(store: &dyn Store, batch: &str, config: &Config) -> anyhow::Result<Report> {
    let batch = store.batch(batch).await?;
    let mut tasks = store.batch_tasks(&batch.id).await?;
    // A failure quotes rejection messages, which may quote a value: none that the task's
    // state schema marks write-only.
    for task in &mut tasks {
        if let Some(failure) = &task.failure
            && let Ok(record) = store.task(&task.id).await
        {
            task.failure = Some(Hidden::of_task(&record).text(failure).into_owned());
        }
    }
    Ok(build(batch, &tasks, config, now_millis()))
}

/// The figures of `batch` at `now`, priced from skillstate.toml.
pub fn build(batch: BatchRecord, tasks: &[BatchTask], config: &Config, now: i64) -> Report {
    // The settings as stored, so a batch made through the service (which stores only its
    // model and skill) shows them as one made from a batch file does.
    let model = batch_report::setting(&batch, "model");
    let skill = batch_report::setting(&batch, "skill");
    let price = model.as_deref().and_then(|m| config.prices.get(m));
    Report::build(batch, tasks, model, skill, price, now)
}
