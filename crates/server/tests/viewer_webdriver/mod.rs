//! A small W3C WebDriver client over reqwest, driving a headless Chromium through
//! `chromedriver` (Debian's `chromium` and `chromium-driver`): start the driver, open a session,
//! find elements, click, type, run a script, take screenshots. Every wait has a timeout.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

/// The W3C element reference key.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub const INSTALL: &str = "apt-get install -y chromium chromium-driver";

/// How long any one thing may take to show in the browser.
pub const WAIT: Duration = Duration::from_secs(20);

/// Where the viewer tests put their screenshots: target/viewer-screenshots/.
pub fn screenshots() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("viewer-screenshots")
}

fn program(variable: &str, default: &str) -> PathBuf {
    std::env::var_os(variable)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default))
}

/// A running chromedriver, killed on drop.
pub struct Driver {
    child: Child,
    pub base: String,
    client: reqwest::Client,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    /// Starts chromedriver on a free port and waits (at most 30 s) until it is ready.
    /// Fails, naming the install command, when Chromium or its driver is missing.
    pub async fn start() -> Result<Self> {
        let chromium = program("SKILLSTATE_TEST_CHROMIUM", "/usr/bin/chromium");
        let driver = program("SKILLSTATE_TEST_CHROMEDRIVER", "/usr/bin/chromedriver");
        for (what, path) in [("chromium", &chromium), ("chromedriver", &driver)] {
            if !path.is_file() {
                bail!(
                    "{what} is not installed at {} (the viewer's browser tests need it): run `{INSTALL}` (scripts/test does when it runs as root), or point SKILLSTATE_TEST_CHROMIUM / SKILLSTATE_TEST_CHROMEDRIVER at them",
                    path.display()
                );
            }
        }
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
            listener.local_addr()?.port()
        };
        let child = Command::new(&driver)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}", driver.display()))?;
        // reqwest is built without a TLS provider; plain http only, but it wants one installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()?;
        let base = format!("http://127.0.0.1:{port}");
        let profile = tempfile::tempdir()?;
        let mut driver_handle = Self {
            child,
            base,
            client,
            _profile: profile,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(response) = driver_handle
                .client
                .get(format!("{}/status", driver_handle.base))
                .send()
                .await
                && let Ok(status) = response.json::<Value>().await
                && status["value"]["ready"] == true
            {
                break;
            }
            if let Some(exit) = driver_handle.child.try_wait()? {
                bail!("chromedriver exited at start: {exit}");
            }
            if Instant::now() > deadline {
                bail!("chromedriver was not ready within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = chromium;
        Ok(driver_handle)
    }

    /// A new headless browser session with a window of `width` × `height`.
    pub async fn session(&self, width: u32, height: u32) -> Result<Browser> {
        let chromium = program("SKILLSTATE_TEST_CHROMIUM", "/usr/bin/chromium");
        let profile = self._profile.path().join(format!(
            "profile-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_nanos()
        ));
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", "--disable-extensions", "--hide-scrollbars",
                    format!("--window-size={width},{height}"),
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
            "timeouts": {"script": 20000, "pageLoad": 30000, "implicit": 0},
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let answer = send(
            &self.client,
            reqwest::Method::POST,
            &format!("{}/session", self.base),
            Some(capabilities),
        )
        .await
        .context("new session")?;
        let id = answer["sessionId"]
            .as_str()
            .ok_or_else(|| anyhow!("no sessionId in {answer}"))?
            .to_owned();
        Ok(Browser {
            client: self.client.clone(),
            session: format!("{}/session/{id}", self.base),
        })
    }
}

async fn send(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> Result<Value> {
    let mut request = client.request(method.clone(), url);
    if let Some(body) = body {
        request = request.json(&body);
    } else if method == reqwest::Method::POST {
        request = request.json(&json!({}));
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("WebDriver {url}"))?;
    let status = response.status();
    let answer: Value = response
        .json()
        .await
        .with_context(|| format!("WebDriver {url}: not JSON"))?;
    if !status.is_success() {
        bail!(
            "WebDriver {url}: {status}: {} {}",
            answer["value"]["error"],
            answer["value"]["message"]
        );
    }
    Ok(answer["value"].clone())
}

/// One browser session.
pub struct Browser {
    client: reqwest::Client,
    session: String,
}

/// An element of the page, with the selector it was found by (`find`, `wait`): the viewer
/// re-renders its lists as they refresh, so an element can be replaced between being found and
/// being used; a use that meets a stale element finds it again by its selector
/// (`Browser::on_element`).
#[derive(Debug, Clone)]
pub struct Element {
    id: String,
    css: Option<String>,
}

pub mod keys {
    pub const ENTER: &str = "\u{E007}";
    pub const HOME: &str = "\u{E011}";
    pub const END: &str = "\u{E010}";
    pub const RIGHT: &str = "\u{E014}";
    pub const TAB: &str = "\u{E004}";
}

impl Browser {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        send(
            &self.client,
            method,
            &format!("{}{path}", self.session),
            body,
        )
        .await
    }

    pub async fn goto(&self, url: &str) -> Result<()> {
        self.call(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await?;
        Ok(())
    }

    /// The first element matching `css`, if any (no wait).
    pub async fn find(&self, css: &str) -> Result<Option<Element>> {
        let found = self
            .call(
                reqwest::Method::POST,
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await?;
        Ok(found
            .as_array()
            .and_then(|all| all.first())
            .and_then(|e| e[ELEMENT].as_str())
            .map(|id| Element {
                id: id.to_owned(),
                css: Some(css.to_owned()),
            }))
    }

    pub async fn find_all(&self, css: &str) -> Result<Vec<Element>> {
        let found = self
            .call(
                reqwest::Method::POST,
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await?;
        Ok(found
            .as_array()
            .map(|all| {
                all.iter()
                    .filter_map(|e| e[ELEMENT].as_str())
                    .map(|id| Element {
                        id: id.to_owned(),
                        css: None,
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Waits (at most `timeout`) for an element matching `css`.
    pub async fn wait(&self, css: &str, timeout: Duration) -> Result<Element> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(element) = self.find(css).await? {
                return Ok(element);
            }
            if Instant::now() > deadline {
                let text = self.text_of("body").await.unwrap_or_default();
                bail!(
                    "no `{css}` within {timeout:?}; the page shows: {}",
                    text.chars().take(1500).collect::<String>()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the script (a function body returning a value) returns something other
    /// than `null`/`false`, and returns it.
    pub async fn wait_script(&self, what: &str, script: &str, timeout: Duration) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let value = self.script(script, json!([])).await?;
            if !(value.is_null() || value == false) {
                return Ok(value);
            }
            if Instant::now() > deadline {
                let text = self.text_of("body").await.unwrap_or_default();
                bail!(
                    "{what}: not within {timeout:?}; the page shows: {}",
                    text.chars().take(1500).collect::<String>()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn script(&self, body: &str, args: Value) -> Result<Value> {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": body, "args": args})),
        )
        .await
    }

    /// The visible text of the first element matching `css` ("" when there is none).
    pub async fn text_of(&self, css: &str) -> Result<String> {
        match self.find(css).await? {
            Some(element) => self.text(&element).await,
            None => Ok(String::new()),
        }
    }

    pub async fn text(&self, element: &Element) -> Result<String> {
        let value = self
            .on_element(element, reqwest::Method::GET, "text", None)
            .await?;
        Ok(value.as_str().unwrap_or_default().to_owned())
    }

    pub async fn attribute(&self, element: &Element, name: &str) -> Result<Option<String>> {
        let value = self
            .on_element(
                element,
                reqwest::Method::GET,
                &format!("attribute/{name}"),
                None,
            )
            .await?;
        Ok(value.as_str().map(str::to_owned))
    }

    pub async fn click(&self, element: &Element) -> Result<()> {
        self.on_element(element, reqwest::Method::POST, "click", None)
            .await?;
        Ok(())
    }

    /// Types `text` into the element (keys as in [`keys`]).
    pub async fn type_into(&self, element: &Element, text: &str) -> Result<()> {
        self.on_element(
            element,
            reqwest::Method::POST,
            "value",
            Some(json!({"text": text})),
        )
        .await?;
        Ok(())
    }

    /// `method` on `/element/{id}/{what}`. An element the page replaced since it was found
    /// (WebDriver's "stale element reference") is found again by its selector, for up to
    /// [`WAIT`]; one found among several (`find_all`) has no selector to find it by.
    async fn on_element(
        &self,
        element: &Element,
        method: reqwest::Method,
        what: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let deadline = Instant::now() + WAIT;
        let mut id = element.id.clone();
        loop {
            let answer = self
                .call(
                    method.clone(),
                    &format!("/element/{id}/{what}"),
                    body.clone(),
                )
                .await;
            match (&answer, &element.css) {
                (Err(error), Some(css))
                    if error.to_string().contains("stale element reference")
                        && Instant::now() < deadline =>
                {
                    // Found again as `find` would (not `wait`, whose error report reads the page
                    // through this function).
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    if let Some(again) = self.find(css).await? {
                        id = again.id;
                    }
                }
                _ => return answer,
            }
        }
    }

    /// Saves a PNG of the window to `path`.
    pub async fn screenshot(&self, path: &Path) -> Result<()> {
        let value = self.call(reqwest::Method::GET, "/screenshot", None).await?;
        let encoded = value
            .as_str()
            .ok_or_else(|| anyhow!("the screenshot is not a string"))?;
        let png = base64_decode(encoded)?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, png).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(())
    }

    pub async fn set_window(&self, width: u32, height: u32) -> Result<()> {
        self.call(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        )
        .await?;
        Ok(())
    }

    /// The browser console's entries since the last call (chromedriver's log endpoint):
    /// `(level, message)`.
    pub async fn console(&self) -> Result<Vec<(String, String)>> {
        let entries = self
            .call(
                reqwest::Method::POST,
                "/se/log",
                Some(json!({"type": "browser"})),
            )
            .await?;
        Ok(entries
            .as_array()
            .map(|all| {
                all.iter()
                    .map(|e| {
                        (
                            e["level"].as_str().unwrap_or_default().to_owned(),
                            e["message"].as_str().unwrap_or_default().to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    pub async fn quit(self) -> Result<()> {
        self.call(reqwest::Method::DELETE, "", None).await?;
        Ok(())
    }
}

fn base64_decode(text: &str) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut buffer = 0u32;
    let mut bits = 0;
    for byte in text.bytes() {
        let value = match byte {
            b'A'..=b'Z' => byte - b'A',
            b'a'..=b'z' => byte - b'a' + 26,
            b'0'..=b'9' => byte - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' | b'\n' | b'\r' => continue,
            other => bail!("not base64: byte {other}"),
        };
        buffer = (buffer << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    Ok(out)
}
