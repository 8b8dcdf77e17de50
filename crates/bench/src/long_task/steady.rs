//! The steady workload of the long-task curve: answers that keep the state's size fixed while
//! the warehouse is handled correctly.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use skillstate_envs::warehouse::{WarehouseConfig, generate_events};
use skillstate_providers::{ModelProvider, ModelRequest, ModelResponse, ProviderError};

/// 40 occupied shelves: about what a 200-step warehouse episode holds at its peak.
pub(crate) fn steady_state() -> Value {
    let inventory: Map<String, Value> = (0..40)
        .map(|i| {
            (
                format!("shelf_{}", i * 7),
                json!(format!("item_{}", 1000 + i)),
            )
        })
        .collect();
    json!({"shelf_count": 500, "inventory": inventory})
}

/// Answers every prompt validly without reading it: odd calls put item_9 on shelf_499, even
/// calls take it off again; the action is the episode's correct one for the call's event.
pub(crate) struct SteadyModel {
    actions: Vec<Value>,
    calls: AtomicU64,
}

impl SteadyModel {
    /// The answers for the episode of `world`.
    pub(crate) fn new(world: &WarehouseConfig) -> Self {
        Self {
            actions: generate_events(world)
                .iter()
                .map(|event| {
                    let (tool, args) = event.expected_action();
                    json!({"tool": tool, "args": args})
                })
                .collect(),
            calls: AtomicU64::new(0),
        }
    }
}

#[async_trait]
impl ModelProvider for SteadyModel {
    fn spec(&self) -> String {
        "scripted:steady".into()
    }

    async fn complete(&self, _request: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        let call = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        let action = usize::try_from(call - 1)
            .ok()
            .and_then(|i| self.actions.get(i))
            .cloned()
            .unwrap_or_else(|| json!({"tool": "wait", "args": {}}));
        let shelf = if call % 2 == 1 {
            json!("item_9")
        } else {
            Value::Null
        };
        Ok(ModelResponse {
            text: json!({
                "reasoning": "steady workload",
                "state_patch": {"inventory": {"shelf_499": shelf}},
                "action": action
            })
            .to_string(),
            usage: None,
            latency: Duration::ZERO,
            truncated: false,
        })
    }
}
