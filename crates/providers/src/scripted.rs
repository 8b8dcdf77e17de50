//! `scripted:<file.jsonl>`: replays recorded model outputs in order. Each line is either a JSON
//! string (the raw text a model returned) or any other JSON value (sent as the line's text).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::Value;

use crate::{ModelProvider, ModelRequest, ModelResponse, ProviderError, Usage};

pub struct ScriptedModel {
    path: PathBuf,
    outputs: Vec<String>,
    next: AtomicUsize,
}

impl ScriptedModel {
    pub fn from_file(path: &Path) -> Result<Self, ProviderError> {
        let display = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ProviderError::Script {
            path: display.clone(),
            message: format!("cannot read the script: {e}"),
        })?;
        let mut outputs = Vec::new();
        for (index, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let value: Value = serde_json::from_str(line).map_err(|e| ProviderError::Script {
                path: format!("{display}:{}", index + 1),
                message: format!(
                    "each line must be one JSON value (a string with the raw model text, or an output object): {e}"
                ),
            })?;
            // An object line is sent exactly as written, so the journal shows the file's bytes.
            outputs.push(match value {
                Value::String(raw) => raw,
                _ => line.trim().to_owned(),
            });
        }
        if outputs.is_empty() {
            return Err(ProviderError::Script {
                path: display,
                message: "the script has no outputs".into(),
            });
        }
        Ok(Self::from_outputs(path.to_path_buf(), outputs))
    }

    pub fn from_outputs(path: PathBuf, outputs: Vec<String>) -> Self {
        Self {
            path,
            outputs,
            next: AtomicUsize::new(0),
        }
    }

    pub fn len(&self) -> usize {
        self.outputs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.outputs.is_empty()
    }
}

#[async_trait]
impl ModelProvider for ScriptedModel {
    fn spec(&self) -> String {
        format!("scripted:{}", self.path.display())
    }

    async fn complete(&self, _request: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        let started = Instant::now();
        let index = self.next.fetch_add(1, Ordering::SeqCst);
        let Some(text) = self.outputs.get(index) else {
            return Err(ProviderError::Exhausted {
                path: self.path.display().to_string(),
                used: self.outputs.len(),
                needed: index + 1,
            });
        };
        Ok(ModelResponse {
            text: text.clone(),
            usage: None::<Usage>,
            latency: started.elapsed().max(Duration::ZERO),
            truncated: false,
        })
    }

    fn skip_calls(&self, calls: usize) {
        self.next.store(calls, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skillstate_core::Prompt;

    fn request() -> ModelRequest {
        ModelRequest {
            prompt: Prompt {
                prefix: String::new(),
                body: String::new(),
            },
            prompt_tokens: 0,
            output_schema: None,
        }
    }

    #[tokio::test]
    async fn replays_strings_and_objects_then_reports_exhaustion() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        std::fs::write(
            &path,
            "\"plain text\"\n\n{\"state_patch\":{},\"action\":{\"tool\":\"wait\"}}\n",
        )
        .unwrap();
        let model = ScriptedModel::from_file(&path).unwrap();
        assert_eq!(model.complete(&request()).await.unwrap().text, "plain text");
        assert!(
            model
                .complete(&request())
                .await
                .unwrap()
                .text
                .contains("\"wait\"")
        );
        let err = model.complete(&request()).await.unwrap_err();
        assert!(
            matches!(
                err,
                ProviderError::Exhausted {
                    used: 2,
                    needed: 3,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("exhausted"));
    }

    #[test]
    fn bad_lines_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        std::fs::write(&path, "\"ok\"\nnot json\n").unwrap();
        let err = ScriptedModel::from_file(&path).err().unwrap();
        assert!(err.to_string().contains("s.jsonl:2"), "{err}");
    }
}
