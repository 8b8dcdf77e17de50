//! The work queue on SQLite.

use async_trait::async_trait;

use super::SqliteStore;
use crate::Result;
use crate::model::*;

// Placeholder until the queue lands (issue 10 work in progress).
#[async_trait]
impl crate::Queue for SqliteStore {
    async fn create_batch(&self, _batch: &crate::NewBatch) -> Result<crate::BatchRecord> {
        Err(crate::queue_todo())
    }
    async fn enqueue_tasks(
        &self,
        _batch: &str,
        _tasks: Vec<crate::QueuedTask>,
    ) -> Result<Vec<String>> {
        Err(crate::queue_todo())
    }
    async fn batch(&self, _id: &str) -> Result<crate::BatchRecord> {
        Err(crate::queue_todo())
    }
    async fn list_batches(&self) -> Result<Vec<crate::BatchRecord>> {
        Err(crate::queue_todo())
    }
    async fn claim_task(
        &self,
        _claim: &LeaseClaim,
        _ttl_ms: u64,
        _batch: Option<&str>,
    ) -> Result<Option<crate::Claimed>> {
        Err(crate::queue_todo())
    }
    async fn settle_claim(
        &self,
        _task: &str,
        _token: &str,
        _settle: &crate::Settle,
        _failure: Option<&str>,
    ) -> Result<()> {
        Err(crate::queue_todo())
    }
    async fn stop_batch(&self, _batch: &str, _reason: &str) -> Result<()> {
        Err(crate::queue_todo())
    }
    async fn requeue_failed(&self, _batch: &str) -> Result<u64> {
        Err(crate::queue_todo())
    }
    async fn batch_tasks(&self, _batch: &str) -> Result<Vec<crate::BatchTask>> {
        Err(crate::queue_todo())
    }
    async fn next_wakeup(&self, _batch: Option<&str>) -> Result<Option<i64>> {
        Err(crate::queue_todo())
    }
    async fn rate_acquire(
        &self,
        _scope: &str,
        _limit: &crate::RateLimit,
        _tokens: u64,
    ) -> Result<crate::RateDecision> {
        Err(crate::queue_todo())
    }
    async fn rate_add_tokens(&self, _scope: &str, _tokens: u64) -> Result<()> {
        Err(crate::queue_todo())
    }
}
