//! The OpenAPI document's `servers` names where the service is reached: the operator's public
//! URL when configured, otherwise `http://` and the request's Host — never an `X-Forwarded-*`
//! header. A reader that takes `servers[0].url` unconditionally (Dify's importer does) reaches
//! the service at it: checked over a real socket on 127.0.0.1.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use skillstate_server::{AppState, PublicUrl, ServerConfig};
use support::*;

fn servers(reply: &Reply) -> Value {
    reply.json()["servers"].clone()
}

#[tokio::test]
async fn without_a_public_url_the_document_names_the_host_it_was_asked_at() {
    let harness = Harness::new(Db::sqlite().await).await;
    let api = InProcess(harness.router());
    let reply = api
        .send(Call::get("/openapi.json").header("host", "agents.internal:9000"))
        .await;
    reply.expect(200);
    assert_eq!(
        servers(&reply),
        json!([{"url": "http://agents.internal:9000"}])
    );
    // The document differs by Host, so a cache must not share it across hosts.
    assert_eq!(reply.header("vary"), Some("host"));

    // X-Forwarded-* are anyone's to send: never read.
    let reply = api
        .send(
            Call::get("/openapi.json")
                .header("host", "agents.internal:9000")
                .header("x-forwarded-host", "evil.example")
                .header("x-forwarded-proto", "https")
                .header("forwarded", "host=evil.example;proto=https"),
        )
        .await;
    assert_eq!(
        servers(&reply),
        json!([{"url": "http://agents.internal:9000"}])
    );

    // A Host that is not a host and port is not repeated; the document's own origin stands.
    for host in ["user@agents.internal", "agents.internal/path", "bad host"] {
        let reply = api
            .send(Call::get("/openapi.json").header("host", host))
            .await;
        assert_eq!(servers(&reply), json!([{"url": "/"}]), "{host}");
    }
    harness.db.destroy().await;
}

#[tokio::test]
async fn a_configured_public_url_is_named_whatever_the_request_says() {
    let config = ServerConfig {
        public_url: Some(PublicUrl::parse("https://agents.example.com/skillstate/").unwrap()),
        ..ServerConfig::default()
    };
    let harness = Harness::with_config(Db::sqlite().await, config);
    let api = InProcess(harness.router());
    let reply = api
        .send(
            Call::get("/openapi.json")
                .header("host", "10.0.0.7:8080")
                .header("x-forwarded-host", "evil.example"),
        )
        .await;
    reply.expect(200);
    assert_eq!(
        servers(&reply),
        json!([{"url": "https://agents.example.com/skillstate"}])
    );
    assert_eq!(reply.header("vary"), None);
    harness.db.destroy().await;
}

/// What Dify's importer does: fetch the document, take `servers[0].url`, call an operation at
/// it (here: create a task, then read it back).
async fn call_through_the_documents_server(
    client: &reqwest::Client,
    document_url: &str,
    key: &str,
) {
    let doc: Value = client
        .get(document_url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let base = doc["servers"][0]["url"].as_str().unwrap().to_owned();
    let created = client
        .post(format!("{base}/v1/tasks"))
        .bearer_auth(key)
        .json(&json!({"skill": "warehouse", "model": "oracle", "environment": {"seed": 3, "events": 2}}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201, "POST {base}/v1/tasks");
    let created: Value = created.json().await.unwrap();
    let id = created["task"]["id"].as_str().unwrap();
    let read = client
        .get(format!("{base}/v1/tasks/{id}"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 200);
    let read: Value = read.json().await.unwrap();
    assert_eq!(read["id"], id);
    assert_eq!(read["skill"], "warehouse");
}

fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_dify_like_reader_reaches_the_service_at_servers_0_over_a_socket() {
    let harness = Harness::new(Db::sqlite().await).await;
    let (key, _) = harness.key("acme").await;
    let socket = Socket::start(harness.state.clone()).await;
    let client = client();
    let doc: Value = client
        .get(format!("{}/openapi.json", socket.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // Host-derived: exactly the address the document was fetched at.
    assert_eq!(doc["servers"][0]["url"], socket.base.as_str());
    call_through_the_documents_server(&client, &format!("{}/openapi.json", socket.base), &key)
        .await;
    socket.stop().await;
    harness.db.destroy().await;
}

#[tokio::test]
async fn a_public_url_is_where_a_dify_like_reader_goes() {
    // The listener first, so the public URL can name its port; fetched at `localhost`, the
    // document still names the configured 127.0.0.1 address.
    let db = Db::sqlite().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let config = ServerConfig {
        public_url: Some(PublicUrl::parse(&format!("http://127.0.0.1:{port}/")).unwrap()),
        ..ServerConfig::default()
    };
    let harness = Harness::with_config(db, config);
    let (key, _) = harness.key("acme").await;
    let state: AppState = harness.state.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(skillstate_server::serve(listener, state, async move {
        let _ = stopped.await;
    }));
    let client = client();
    let reply = client
        .get(format!("http://127.0.0.1:{port}/openapi.json"))
        .header("host", format!("localhost:{port}"))
        .send()
        .await
        .unwrap();
    let doc: Value = reply.json().await.unwrap();
    assert_eq!(
        doc["servers"],
        json!([{"url": format!("http://127.0.0.1:{port}")}])
    );
    call_through_the_documents_server(
        &client,
        &format!("http://127.0.0.1:{port}/openapi.json"),
        &key,
    )
    .await;
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    harness.db.destroy().await;
}
