//! A loopback TCP proxy between the queue bench's workers and PostgreSQL: it counts round trips
//! as the wire sees them, and can delay each direction to show what they cost a worker on
//! another machine (`tc netem` is not available on these machines).
//!
//! A round trip is a client turn: the bytes a client sends after it last heard from the
//! server (a statement, a pipeline of them, a ping — pg_stat_statements sees only some of
//! these). Each connection counts its own turns; the proxy sums them. With a delay, every chunk
//! is held `delay` in its direction before it is passed on, in order, so pipelined chunks are
//! not serialised behind each other's delay: a turn costs one delay each way, as on a link with
//! that latency.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long connecting to the server may take before the client's connection is dropped.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Chunks in flight in one direction before the reader waits for the writer.
const IN_FLIGHT: usize = 1024;

/// A running proxy; it stops when dropped.
pub struct WireProxy {
    addr: SocketAddr,
    turns: Arc<AtomicU64>,
    listener: JoinHandle<()>,
}

impl WireProxy {
    /// Listens on an ephemeral port of 127.0.0.1 and forwards every connection to `upstream`,
    /// holding each chunk `delay` in each direction.
    pub async fn start(upstream: SocketAddr, delay: Duration) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let turns = Arc::new(AtomicU64::new(0));
        let counted = turns.clone();
        let listener = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let turns = counted.clone();
                tokio::spawn(async move {
                    let server =
                        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(upstream))
                            .await
                        {
                            Ok(Ok(server)) => server,
                            // The client sees its connection closed and reports it.
                            _ => return,
                        };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    relay(client, server, delay, turns).await;
                });
            }
        });
        Ok(Self {
            addr,
            turns,
            listener,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Client turns counted so far, over every connection.
    pub fn turns(&self) -> u64 {
        self.turns.load(Ordering::Relaxed)
    }
}

impl Drop for WireProxy {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// Passes bytes both ways until either side closes.
async fn relay(client: TcpStream, server: TcpStream, delay: Duration, turns: Arc<AtomicU64>) {
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // Whether the server sent anything since the client's last chunk; the first chunk of a
    // connection is a turn too.
    let heard = Arc::new(AtomicBool::new(true));
    let upstream = pump(client_read, server_write, delay, {
        let heard = heard.clone();
        move || {
            if heard.swap(false, Ordering::AcqRel) {
                turns.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let downstream = pump(server_read, client_write, delay, move || {
        heard.store(true, Ordering::Release);
    });
    // Either direction ending ends the connection (the other half is dropped with it).
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
    }
}

/// Copies `from` to `to`, calling `on_chunk` as each chunk is read and writing it `delay`
/// after it was read.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    delay: Duration,
    on_chunk: impl Fn(),
) {
    let (line, mut held) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT);
    let writer = async move {
        while let Some((read_at, chunk)) = held.recv().await {
            // (A deadline already passed is not waited for: the timer would round it up to
            // its next tick, a millisecond per chunk.)
            let due = read_at + delay;
            if due > Instant::now() {
                tokio::time::sleep_until(due).await;
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    let reader = async move {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    on_chunk();
                    if line
                        .send((Instant::now(), buffer[..n].to_vec()))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    };
    // The writer drains what was read before the reader ended.
    tokio::join!(reader, writer);
}

/// `url` (a `postgres://` URL) pointed at `proxy` instead of its host and port, and the host
/// and port it named (5432 when it named none). `None` for a URL without a host.
pub fn through_proxy(url: &str, proxy: SocketAddr) -> Option<(String, String)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (user, host_port) = match authority.rsplit_once('@') {
        Some((user, host_port)) => (Some(user), host_port),
        None => (None, authority),
    };
    if host_port.is_empty() {
        return None;
    }
    let upstream = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:5432")
    };
    let user = user.map(|u| format!("{u}@")).unwrap_or_default();
    Some((format!("{scheme}://{user}{proxy}{tail}"), upstream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_pointed_at_the_proxy() {
        let proxy: SocketAddr = "127.0.0.1:6000".parse().unwrap();
        assert_eq!(
            through_proxy("postgres://postgres@127.0.0.1:5432/test?x=1", proxy),
            Some((
                "postgres://postgres@127.0.0.1:6000/test?x=1".into(),
                "127.0.0.1:5432".into()
            ))
        );
        assert_eq!(
            through_proxy("postgresql://localhost/db", proxy),
            Some((
                "postgresql://127.0.0.1:6000/db".into(),
                "localhost:5432".into()
            ))
        );
        assert_eq!(through_proxy("postgres:///db", proxy), None);
    }

    /// A server that answers each line with one line: every request is one turn, however it is
    /// split, and a delayed proxy passes every byte in order.
    #[tokio::test]
    async fn turns_are_counted_through_a_delayed_proxy() {
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = server.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = server.accept().await.unwrap();
            let mut buffer = [0u8; 64];
            let mut seen = Vec::new();
            loop {
                let n = stream.read(&mut buffer).await.unwrap();
                if n == 0 {
                    return;
                }
                seen.extend_from_slice(&buffer[..n]);
                while let Some(end) = seen.iter().position(|b| *b == b'\n') {
                    seen.drain(..=end);
                    stream.write_all(b"ok\n").await.unwrap();
                }
            }
        });
        let proxy = WireProxy::start(upstream, Duration::from_millis(5))
            .await
            .unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        for _ in 0..3 {
            // One request in two writes: still one turn.
            client.write_all(b"hel").await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
            client.write_all(b"lo\n").await.unwrap();
            let mut answer = [0u8; 3];
            client.read_exact(&mut answer).await.unwrap();
            assert_eq!(&answer, b"ok\n");
        }
        // Every byte got through, in order, through the delay line; three turns counted.
        assert_eq!(proxy.turns(), 3);
    }
}
