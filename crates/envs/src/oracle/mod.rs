//! The oracle policy (`--model oracle`): deterministic and honest. It reads ONLY the rendered
//! prompt text — never the environment — and acts optimally on what that text says. It
//! therefore measures how much task-relevant information a context strategy keeps in front of
//! the model: an upper bound that a real model can only approach.

mod admin_panel;
mod bugfix_coder;
mod bugfix_reviewer;
mod repository;
mod view;
mod warehouse;
mod warehouse_archive;

use std::time::Instant;

use async_trait::async_trait;
use skillstate_providers::{ModelProvider, ModelRequest, ModelResponse, ProviderError};

pub use view::{PromptView, TurnView, read_prompt};

/// The oracle's answer to a rendered prompt for environment `kind` (`None` if it has no
/// oracle). Useful to stand in for a model behind any interface, e.g. a fake API server.
pub fn answer(kind: &str, prompt: &str) -> Option<String> {
    match kind {
        crate::warehouse::KIND => Some(warehouse::answer(prompt)),
        crate::warehouse_archive::KIND => Some(warehouse_archive::answer(prompt)),
        crate::repository::KIND => Some(repository::answer(prompt)),
        crate::admin_panel::KIND => Some(admin_panel::answer(prompt)),
        crate::bugfix::coder::KIND => Some(bugfix_coder::answer(prompt)),
        crate::bugfix::reviewer::KIND => Some(bugfix_reviewer::answer(prompt)),
        _ => None,
    }
}

/// The environments that have an oracle.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Warehouse,
    WarehouseArchive,
    Repository,
    AdminPanel,
    BugfixCoder,
    BugfixReviewer,
}

/// The oracle for one environment kind.
pub struct OracleModel {
    kind: Kind,
}

impl OracleModel {
    /// The oracle for environment `kind`, if there is one.
    pub fn for_environment(kind: &str) -> Result<Self, ProviderError> {
        match kind {
            crate::warehouse::KIND => Ok(Self {
                kind: Kind::Warehouse,
            }),
            crate::warehouse_archive::KIND => Ok(Self {
                kind: Kind::WarehouseArchive,
            }),
            crate::repository::KIND => Ok(Self {
                kind: Kind::Repository,
            }),
            crate::admin_panel::KIND => Ok(Self {
                kind: Kind::AdminPanel,
            }),
            crate::bugfix::coder::KIND => Ok(Self {
                kind: Kind::BugfixCoder,
            }),
            crate::bugfix::reviewer::KIND => Ok(Self {
                kind: Kind::BugfixReviewer,
            }),
            other => Err(ProviderError::UnknownSpec(format!(
                "oracle (no oracle policy for the `{other}` environment; it exists for: {})",
                crate::ENVIRONMENTS.join(", ")
            ))),
        }
    }
}

#[async_trait]
impl ModelProvider for OracleModel {
    fn spec(&self) -> String {
        "oracle".into()
    }

    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        let started = Instant::now();
        let prompt = request.prompt.text();
        let text = match self.kind {
            Kind::Warehouse => warehouse::answer(&prompt),
            Kind::WarehouseArchive => warehouse_archive::answer(&prompt),
            Kind::Repository => repository::answer(&prompt),
            Kind::AdminPanel => admin_panel::answer(&prompt),
            Kind::BugfixCoder => bugfix_coder::answer(&prompt),
            Kind::BugfixReviewer => bugfix_reviewer::answer(&prompt),
        };
        Ok(ModelResponse {
            text,
            usage: None,
            latency: started.elapsed(),
            truncated: false,
        })
    }
}
