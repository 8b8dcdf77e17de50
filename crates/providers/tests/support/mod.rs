//! A fake model server on 127.0.0.1 (a random port) for tests: it records every request it
//! receives (path, headers, JSON body) and answers from a queue of replies or a callback.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub delay: Duration,
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.to_string(),
            delay: Duration::ZERO,
        }
    }

    pub fn raw(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.to_owned(),
            delay: Duration::ZERO,
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn delayed(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// An OpenAI Chat Completions answer with `content`.
pub fn openai_answer(content: &str, finish_reason: &str) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 1200, "completion_tokens": 60, "total_tokens": 1260, "prompt_tokens_details": {"cached_tokens": 1024}}
    })
}

/// An Anthropic Messages answer whose forced tool call carries `input`.
pub fn anthropic_tool_answer(input: Value, stop_reason: &str) -> Value {
    json!({
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "skillstate_step", "input": input}],
        "stop_reason": stop_reason,
        "usage": {"input_tokens": 100, "output_tokens": 50, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 0}
    })
}

#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Value,
}

type Responder = Arc<dyn Fn(&Value) -> Reply + Send + Sync>;

struct Shared {
    replies: Mutex<VecDeque<Reply>>,
    responder: Option<Responder>,
    requests: Mutex<Vec<Recorded>>,
}

pub struct FakeServer {
    pub base_url: String,
    shared: Arc<Shared>,
}

impl FakeServer {
    /// A server that answers with `replies` in order (and 599 once they run out).
    pub async fn with_replies(replies: Vec<Reply>) -> Self {
        Self::start(replies, None).await
    }

    /// A server that computes each reply from the request body.
    pub async fn with_responder(
        responder: impl Fn(&Value) -> Reply + Send + Sync + 'static,
    ) -> Self {
        Self::start(Vec::new(), Some(Arc::new(responder))).await
    }

    async fn start(replies: Vec<Reply>, responder: Option<Responder>) -> Self {
        let shared = Arc::new(Shared {
            replies: Mutex::new(replies.into()),
            responder,
            requests: Mutex::new(Vec::new()),
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            base_url: format!("http://{address}"),
            shared,
        }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().unwrap().clone()
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    shared.requests.lock().unwrap().push(Recorded {
        path: uri.path().to_owned(),
        headers,
        body: json.clone(),
    });
    let reply = match &shared.responder {
        Some(responder) => responder(&json),
        None => shared
            .replies
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(|| Reply::raw(599, "no reply queued")),
    };
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let mut response = (StatusCode::from_u16(reply.status).unwrap(), reply.body).into_response();
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    for (name, value) in reply.headers {
        response.headers_mut().insert(
            axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    response
}
