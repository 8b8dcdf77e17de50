//! `fs.read`, `fs.write`, `fs.list`, `fs.search`: file access confined to a work directory.

use std::io::Read;
use std::path::Path;

use async_trait::async_trait;
use serde_json::{Value, json};
use skillstate_core::{SideEffect, ToolSpec};

use super::confine::WorkDir;
use crate::{CallContext, Tool, ToolError, ToolOutput};

/// Largest file `fs.read` returns whole; longer ones need `offset`/`limit`.
const MAX_READ_BYTES: u64 = 256 * 1024;
const MAX_SEARCH_HITS: usize = 200;

#[derive(Debug, Clone, Copy)]
enum Op {
    Read,
    Write,
    List,
    Search,
}

pub struct FsTool {
    op: Op,
    spec: ToolSpec,
    root: WorkDir,
}

/// The four file tools over `root`.
pub fn fs_tools(root: &WorkDir) -> Vec<FsTool> {
    [Op::Read, Op::Write, Op::List, Op::Search]
        .into_iter()
        .map(|op| FsTool {
            op,
            spec: spec(op),
            root: root.clone(),
        })
        .collect()
}

fn spec(op: Op) -> ToolSpec {
    let path = json!({"type": "string", "description": "Path relative to the work directory"});
    let (name, description, schema, side_effect) = match op {
        Op::Read => (
            "fs.read",
            "Read a text file. Optional `offset` (first line, 1-based) and `limit` (number of lines).",
            json!({"type": "object", "properties": {"path": path, "offset": {"type": "integer", "minimum": 1}, "limit": {"type": "integer", "minimum": 1}}, "required": ["path"], "additionalProperties": false}),
            SideEffect::ReadOnly,
        ),
        Op::Write => (
            "fs.write",
            "Write a text file (created or replaced).",
            json!({"type": "object", "properties": {"path": path, "content": {"type": "string"}}, "required": ["path", "content"], "additionalProperties": false}),
            SideEffect::Idempotent,
        ),
        Op::List => (
            "fs.list",
            "List a directory (default: the work directory).",
            json!({"type": "object", "properties": {"path": path}, "additionalProperties": false}),
            SideEffect::ReadOnly,
        ),
        Op::Search => (
            "fs.search",
            "Find lines containing `text` in the files under `path` (default: everything).",
            json!({"type": "object", "properties": {"text": {"type": "string", "minLength": 1}, "path": path}, "required": ["text"], "additionalProperties": false}),
            SideEffect::ReadOnly,
        ),
    };
    ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema: schema,
        side_effect,
        source: "fs".into(),
        needs_approval: false,
    }
}

fn text_arg<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

#[async_trait]
impl Tool for FsTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, args: &Value, _ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let result = match self.op {
            Op::Read => self.read(args),
            Op::Write => self.write(args),
            Op::List => self.list(args),
            Op::Search => self.search(args),
        };
        Ok(match result {
            Ok(text) => ToolOutput::success(text),
            Err(text) => ToolOutput::failure(format!("Error: {text}")),
        })
    }
}

impl FsTool {
    fn read(&self, args: &Value) -> Result<String, String> {
        let relative = text_arg(args, "path").unwrap_or_default();
        let path = self.root.resolve(relative, true)?;
        if path.is_dir() {
            return Err(format!("`{relative}` is a directory; use fs.list"));
        }
        let mut bytes = Vec::new();
        std::fs::File::open(&path)
            .and_then(|f| f.take(MAX_READ_BYTES + 1).read_to_end(&mut bytes))
            .map_err(|e| format!("`{relative}`: {e}"))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| format!("`{relative}` is not a UTF-8 text file"))?;
        let offset = args
            .get("offset")
            .and_then(Value::as_u64)
            .unwrap_or(1)
            .max(1) as usize;
        let limit = args
            .get("limit")
            .and_then(Value::as_u64)
            .map(|l| l as usize);
        if offset == 1 && limit.is_none() {
            if text.len() as u64 > MAX_READ_BYTES {
                return Err(format!(
                    "`{relative}` is larger than {MAX_READ_BYTES} bytes; read it in parts with offset and limit"
                ));
            }
            return Ok(text);
        }
        let lines: Vec<&str> = text
            .lines()
            .skip(offset - 1)
            .take(limit.unwrap_or(usize::MAX))
            .collect();
        Ok(lines.join("\n"))
    }

    fn write(&self, args: &Value) -> Result<String, String> {
        let relative = text_arg(args, "path").unwrap_or_default();
        let content = text_arg(args, "content").unwrap_or_default();
        let path = self.root.resolve(relative, false)?;
        if path.is_dir() {
            return Err(format!("`{relative}` is a directory"));
        }
        std::fs::write(&path, content).map_err(|e| format!("`{relative}`: {e}"))?;
        Ok(format!(
            "wrote {} bytes to {}",
            content.len(),
            self.root.display(&path)
        ))
    }

    fn list(&self, args: &Value) -> Result<String, String> {
        let relative = text_arg(args, "path").unwrap_or(".");
        let path = self.root.resolve(relative, true)?;
        let mut entries: Vec<String> = std::fs::read_dir(&path)
            .map_err(|e| format!("`{relative}`: {e}"))?
            .filter_map(Result::ok)
            .map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                match entry.metadata() {
                    Ok(m) if m.is_dir() => format!("{name}/"),
                    Ok(m) => format!("{name} ({} bytes)", m.len()),
                    Err(_) => name,
                }
            })
            .collect();
        entries.sort();
        if entries.is_empty() {
            return Ok(format!("{} is empty", self.root.display(&path)));
        }
        Ok(entries.join("\n"))
    }

    fn search(&self, args: &Value) -> Result<String, String> {
        let needle = text_arg(args, "text").unwrap_or_default();
        let relative = text_arg(args, "path").unwrap_or(".");
        let start = self.root.resolve(relative, true)?;
        let mut hits = Vec::new();
        self.search_in(&start, needle, &mut hits, 0);
        if hits.is_empty() {
            return Ok(format!("no line contains `{needle}`"));
        }
        let more = hits.len() >= MAX_SEARCH_HITS;
        let mut text = hits.join("\n");
        if more {
            text.push_str(&format!("\n[stopped after {MAX_SEARCH_HITS} matches]"));
        }
        Ok(text)
    }

    fn search_in(&self, path: &Path, needle: &str, hits: &mut Vec<String>, depth: usize) {
        if hits.len() >= MAX_SEARCH_HITS || depth > 16 {
            return;
        }
        // Symlinks are not followed while walking: they could lead out of the root.
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            return;
        };
        if meta.is_dir() {
            let Ok(entries) = std::fs::read_dir(path) else {
                return;
            };
            let mut children: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
            children.sort();
            for child in children {
                self.search_in(&child, needle, hits, depth + 1);
            }
        } else if meta.is_file() && meta.len() <= MAX_READ_BYTES {
            let Ok(text) = std::fs::read_to_string(path) else {
                return;
            };
            for (number, line) in text.lines().enumerate() {
                if line.contains(needle) {
                    hits.push(format!(
                        "{}:{}: {}",
                        self.root.display(path),
                        number + 1,
                        line.trim()
                    ));
                    if hits.len() >= MAX_SEARCH_HITS {
                        return;
                    }
                }
            }
        }
    }
}
