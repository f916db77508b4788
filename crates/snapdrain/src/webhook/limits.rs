//! What one client may hold of the gate's HTTPS server: connections (in all and per peer), time to
//! send a request, time idle, and reviews in flight. Under `failurePolicy: Ignore` a gate that cannot
//! answer admits every eviction, so no client (a slow one, or a pod flooding port 8443) may use up
//! what kube-apiserver's calls need (security review H-2).
//!
//! The values follow kube-apiserver's webhook client, a Go `net/http` transport with client-go's
//! defaults (kubernetes `staging/src/k8s.io/apimachinery/pkg/util/net/http.go`,
//! `SetOldTransportDefaults`: `TLSHandshakeTimeout` and `IdleConnTimeout` from Go's
//! `http.DefaultTransport`, 10 s and 90 s), and the webhook's own `timeoutSeconds` (at most 30 s).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum_server::accept::Accept;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// The TLS handshake: kube-apiserver gives up on its own after 10 s, so waiting longer serves nobody.
pub const HANDSHAKE: Duration = Duration::from_secs(10);
/// From the handshake to a complete first request. kube-apiserver writes its request at once; a client
/// that trickles its headers (slowloris) is cut off here.
pub const FIRST_REQUEST: Duration = Duration::from_secs(10);
/// A connection with no byte either way, and the wait for the next request's headers on HTTP/1.1
/// (hyper's header read timer also runs between keep-alive requests). Longer than kube-apiserver's
/// 90 s idle timeout, so that kube-apiserver always closes an idle connection first: Go's transport
/// does not retry a POST written into a connection the server is closing, and under `Ignore` that
/// failed call would admit the eviction.
pub const IDLE: Duration = Duration::from_secs(120);
/// Open connections in all. kube-apiserver needs few (HTTP/2: one per API server instance).
pub const CONNECTIONS: usize = 512;
/// Open connections from one address, so that one pod cannot take the rest.
pub const PER_PEER: usize = 64;
/// The largest request body read. An eviction's AdmissionReview is a few KiB (the Eviction and the
/// caller's user info); a larger body is answered 413 before any of it is parsed. axum's default, made
/// explicit so that an axum upgrade cannot change it unseen.
pub const BODY: usize = 2 * 1024 * 1024;
/// Reviews being answered at once. A review is answered from memory in microseconds; beyond this the
/// gate answers 503 at once rather than queue.
pub const IN_FLIGHT: usize = 64;

/// Open connections per peer address.
type Peers = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// Admits a new connection only while the caps allow; a refused one is closed before its handshake.
#[derive(Clone)]
pub struct Capped {
    total: Arc<Semaphore>,
    peers: Peers,
    per_peer: usize,
    idle: Duration,
}

impl Capped {
    pub fn new(total: usize, per_peer: usize) -> Self {
        Self {
            total: Arc::new(Semaphore::new(total)),
            peers: Arc::default(),
            per_peer,
            idle: IDLE,
        }
    }

    /// Another idle limit than [`IDLE`] (tests use a short one).
    pub fn with_idle(mut self, idle: Duration) -> Self {
        self.idle = idle;
        self
    }

    fn admit(&self, stream: TcpStream) -> io::Result<Counted> {
        let refused = |why: &str| io::Error::other(format!("connection refused: {why}"));
        let peer = stream.peer_addr()?.ip();
        let permit = self
            .total
            .clone()
            .try_acquire_owned()
            .map_err(|_| refused("the gate's connection cap is reached"))?;
        {
            let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
            let open = peers.entry(peer).or_default();
            if *open >= self.per_peer {
                return Err(refused("this address holds its share of connections"));
            }
            *open += 1;
        }
        // A reply leaves at once: with Nagle's algorithm on, a TLS record written after another waits for
        // the API server's delayed ACK (up to 40 ms on Linux). The gate bench's sequential dry-run
        // evictions had a p99 of 43 ms against a p50 of 0.34 ms before this. (axum-server's own
        // acceptors set it only in NoDelayAcceptor, which this acceptor replaces.)
        stream.set_nodelay(true)?;
        Ok(Counted {
            inner: stream,
            idle: Box::pin(tokio::time::sleep(self.idle)),
            idle_limit: self.idle,
            _permit: permit,
            peer: Some((peer, self.peers.clone())),
        })
    }
}

impl<S: Send + 'static> Accept<TcpStream, S> for Capped {
    type Stream = Counted;
    type Service = S;
    type Future = std::future::Ready<io::Result<(Counted, S)>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        std::future::ready(self.admit(stream).map(|s| (s, service)))
    }
}

/// An admitted connection: it gives its place back when dropped, and fails once idle for [`IDLE`] (or
/// the limit of [`Capped::with_idle`]).
pub struct Counted {
    inner: TcpStream,
    idle: Pin<Box<Sleep>>,
    idle_limit: Duration,
    _permit: OwnedSemaphorePermit,
    peer: Option<(IpAddr, Peers)>,
}

impl Counted {
    fn active(&mut self) {
        let limit = self.idle_limit;
        self.idle.as_mut().reset(Instant::now() + limit);
    }

    fn idle_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        self.idle
            .as_mut()
            .poll(cx)
            .map(|()| io::Error::new(io::ErrorKind::TimedOut, "the connection was idle too long"))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        if let Some((peer, peers)) = self.peer.take() {
            let mut peers = peers.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(open) = peers.get_mut(&peer) {
                *open = open.saturating_sub(1);
                if *open == 0 {
                    peers.remove(&peer);
                }
            }
        }
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.active();
                }
                Poll::Ready(r)
            }
            Poll::Pending => self.idle_out(cx).map(Err),
        }
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.active();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn pair(listener: &tokio::net::TcpListener) -> (TcpStream, TcpStream) {
        let addr = listener.local_addr().expect("bound");
        let (client, server) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (client.expect("connect"), server.expect("accept").0)
    }

    #[tokio::test]
    async fn connections_are_capped_per_peer_and_in_all_and_given_back_when_closed() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let caps = Capped::new(3, 2);
        let mut held = Vec::new();
        for _ in 0..2 {
            let (c, s) = pair(&listener).await;
            held.push((c, caps.admit(s).expect("within the caps")));
        }
        let (_c, s) = pair(&listener).await;
        let refused = caps.admit(s).err().expect("a third from one peer");
        assert!(refused.to_string().contains("its share"), "{refused}");
        drop(held.pop());
        let (_c2, s) = pair(&listener).await;
        caps.admit(s)
            .expect("a closed connection gave its place back");

        let total = Capped::new(1, 8);
        let (_c3, s) = pair(&listener).await;
        let _kept = total.admit(s).expect("the first");
        let (_c4, s) = pair(&listener).await;
        let refused = total.admit(s).err().expect("over the total cap");
        assert!(refused.to_string().contains("cap is reached"), "{refused}");
    }

    #[tokio::test]
    async fn an_admitted_connection_sends_without_waiting_for_acks() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let (_c, s) = pair(&listener).await;
        assert!(!s.nodelay().expect("a socket option"), "Linux's default");
        let admitted = Capped::new(1, 1).admit(s).expect("within the caps");
        assert!(admitted.inner.nodelay().expect("a socket option"));
    }

    /// A connection with no byte either way for its idle limit fails its read (hyper then closes it),
    /// and any byte read or written starts the wait again (review H-2: idle keep-alive connections
    /// cannot pile up). A 2 s limit stands in for [`IDLE`]; the traffic comes every 0.5 s, well inside it.
    #[tokio::test]
    async fn an_idle_connection_fails_after_the_idle_limit_and_traffic_resets_it() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let limit = Duration::from_secs(2);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let (mut client, server) = pair(&listener).await;
        let mut conn = Capped::new(4, 4)
            .with_idle(limit)
            .admit(server)
            .expect("admitted");
        let mut buf = [0u8; 16];

        // Traffic both ways for twice the limit: the connection stays up.
        let started = Instant::now();
        for i in 0..8 {
            // The test's own pacing of the traffic, not a wait for state.
            tokio::time::sleep(Duration::from_millis(500)).await;
            if i % 2 == 0 {
                client.write_all(b"x").await.expect("write");
                assert_eq!(conn.read(&mut buf).await.expect("a byte"), 1);
            } else {
                conn.write_all(b"y").await.expect("write back");
                assert_eq!(client.read(&mut buf).await.expect("the byte back"), 1);
            }
        }
        assert!(started.elapsed() > limit);

        // Then silence: the read fails with TimedOut, not before the limit.
        let quiet = Instant::now();
        let read = tokio::time::timeout(limit * 10, conn.read(&mut buf))
            .await
            .expect("the idle limit ended the read");
        let e = read.expect_err("an idle connection fails");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(
            quiet.elapsed() >= limit - Duration::from_millis(50),
            "{:?}",
            quiet.elapsed()
        );
    }
}
