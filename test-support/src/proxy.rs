//! A loopback TCP proxy that can stop answering.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Forwards to `upstream` until [`Proxy::blackhole`]: then it cuts every open
/// connection and accepts new ones without ever answering (a server that hangs,
/// not one that refuses).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
///
/// let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
/// let upstream = echo.local_addr().unwrap();
/// tokio::spawn(async move {
///     while let Ok((mut s, _)) = echo.accept().await {
///         tokio::spawn(async move {
///             let (mut r, mut w) = s.split();
///             let _ = tokio::io::copy(&mut r, &mut w).await;
///         });
///     }
/// });
/// let proxy = test_support::Proxy::start(upstream).await;
/// let mut c = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
/// c.write_all(b"ping").await.unwrap();
/// let mut got = [0; 4];
/// c.read_exact(&mut got).await.unwrap();
/// assert_eq!(&got, b"ping");
///
/// proxy.blackhole();
/// let mut c = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
/// c.write_all(b"ping").await.unwrap();
/// let silent = tokio::time::timeout(std::time::Duration::from_millis(200), c.read(&mut got)).await;
/// assert!(silent.is_err(), "a blackholed proxy never answers");
/// # });
/// ```
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    forwarding: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on an ephemeral 127.0.0.1 port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let forwarding = Arc::new(AtomicBool::new(true));
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (f, c) = (forwarding.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            // Blackholed connections are held open (never answered) until the proxy drops.
            let mut held = Vec::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                if f.load(Ordering::SeqCst) {
                    let conn = tokio::spawn(async move {
                        if let Ok(mut out) = TcpStream::connect(upstream).await {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                        }
                    });
                    c.lock().unwrap().push(conn);
                } else {
                    held.push(inbound);
                }
            }
        });
        Proxy { addr, forwarding, conns, accept }
    }

    /// Cuts every open connection; from now on connections are accepted and never answered.
    pub fn blackhole(&self) {
        self.forwarding.store(false, Ordering::SeqCst);
        let conns: Vec<_> = self.conns.lock().unwrap().drain(..).collect();
        for c in conns {
            c.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.blackhole();
        self.accept.abort();
    }
}
