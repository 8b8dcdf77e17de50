//! Child processes started from one thread that lives as long as the process.
//!
//! A parent-death signal (`setpriv --pdeathsig`, bwrap's `--die-with-parent`) is sent when the
//! *thread* that started the child ends, not only when the process does. A command spawned
//! from a thread that ends before it — a tokio blocking-pool thread idle for ten seconds, the
//! thread of a `block_on` that returns — would be killed in the middle of its call. Every
//! shell command is started here instead, from a thread that never ends, so that the signal
//! comes exactly when the runtime dies.

use std::io;
use std::sync::OnceLock;
use std::sync::mpsc;

use tokio::process::{Child, Command};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

struct Job {
    command: Command,
    /// The runtime the child is registered with (reaping, `wait`), the caller's.
    runtime: Handle,
    reply: oneshot::Sender<io::Result<Child>>,
}

static SPAWNER: OnceLock<Option<mpsc::Sender<Job>>> = OnceLock::new();

/// Starts `command` from the spawner thread; the child belongs to the caller's tokio runtime.
pub(crate) async fn spawn(command: Command) -> io::Result<Child> {
    let runtime = Handle::try_current().map_err(io::Error::other)?;
    let sender = SPAWNER
        .get_or_init(start)
        .as_ref()
        .ok_or_else(|| io::Error::other("the thread that starts commands could not be created"))?;
    let (reply, answer) = oneshot::channel();
    sender
        .send(Job {
            command,
            runtime,
            reply,
        })
        .map_err(|_| io::Error::other("the thread that starts commands has ended"))?;
    answer
        .await
        .map_err(|_| io::Error::other("the thread that starts commands dropped the request"))?
}

fn start() -> Option<mpsc::Sender<Job>> {
    let (sender, jobs) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("skillstate-spawner".into())
        .spawn(move || {
            for job in jobs {
                let Job {
                    mut command,
                    runtime,
                    reply,
                } = job;
                let _in_runtime = runtime.enter();
                // A caller that gave up drops the child here; `kill_on_drop` ends it.
                let _ = reply.send(command.spawn());
            }
        })
        .ok()?;
    Some(sender)
}
