//! `skillstate view`: the web viewer over a local database — `serve` on a loopback address,
//! API-only unless given workers, optionally with a bench's results.json for the bench page.
//!
//! It mints a key for this process only (the server keeps its hash in memory, never in the
//! database) that sees every task, board and batch of the database — those the CLI made belong
//! to no tenant — and prints the viewer's link with the key in its fragment
//! (`http://127.0.0.1:8080/#key=sk_…`): the page moves it to the tab's sessionStorage and
//! removes it from the address bar; the fragment never reaches the server or its logs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};

use super::serve::{ServeArgs, Viewer, run_with};

#[derive(clap::Args)]
pub struct ViewArgs {
    /// Loopback address to listen on (127.0.0.1 or ::1; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: SocketAddr,
    /// The directory whose skills create requests name, as for `serve`.
    #[arg(long, default_value = "skills")]
    skills: PathBuf,
    /// Tasks embedded workers run at once; 0 (the default) only shows tasks — approvals and
    /// messages sent from the page then wait for a `skillstate worker`.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=4096))]
    workers: u16,
    /// A bench's results.json (written by `skillstate bench` to bench-out/), shown read-only
    /// on the viewer's bench page.
    #[arg(long, value_name = "RESULTS_JSON")]
    bench: Option<PathBuf>,
}

pub async fn run(db: &str, config_path: Option<&Path>, args: ViewArgs) -> Result<ExitCode> {
    if !args.addr.ip().is_loopback() {
        bail!(
            "--addr {}: `view` listens on this machine only (127.0.0.1 or ::1); use `skillstate serve` to serve other addresses",
            args.addr
        );
    }
    let bench = match &args.bench {
        Some(path) => Some(read_bench(path)?),
        None => None,
    };
    if args.workers == 0 {
        errln!(
            "view: no embedded workers; approvals and messages sent from the page wait for a `skillstate worker` (or start view with --workers N)"
        );
    }
    let serve = ServeArgs {
        addr: args.addr,
        skills: args.skills,
        workers: args.workers,
        work_roots: Vec::new(),
        allow_model: Vec::new(),
        scripted_dir: None,
        public_url: None,
    };
    let viewer = Viewer {
        bench,
        local_key: Some(skillstate_server::new_key_secret()),
    };
    run_with(db, config_path, serve, viewer).await
}

/// The file's bytes, once they read as a bench report.
fn read_bench(path: &Path) -> Result<Vec<u8>> {
    let bytes =
        std::fs::read(path).with_context(|| format!("--bench {}: cannot read", path.display()))?;
    serde_json::from_slice::<skillstate_bench::BenchReport>(&bytes).with_context(|| {
        format!(
            "--bench {}: not a results.json of `skillstate bench`",
            path.display()
        )
    })?;
    Ok(bytes)
}
