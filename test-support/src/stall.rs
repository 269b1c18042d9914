//! A loopback TCP proxy that can *stall*: connections stay open, but no byte
//! moves either way until it resumes — what a replica sees when the network
//! to its database hangs (not a reset, which the driver notices at once).
//! And that can *sever*: every connection through it is closed at once, and
//! new ones are refused until it is restored — a session lost, and the
//! database out of reach by that route for a while.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Forwards to `upstream` until told to [`stall`](Self::stall) or
/// [`sever`](Self::sever); see the module docs.
pub struct StallProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    flowing: watch::Sender<bool>,
    severed: Arc<AtomicBool>,
    accept: JoinHandle<()>,
    pumps: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl StallProxy {
    /// Listens on an ephemeral 127.0.0.1 port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> StallProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (flowing, _) = watch::channel(true);
        let severed = Arc::new(AtomicBool::new(false));
        let pumps: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (tx, all, refusing) = (flowing.clone(), Arc::clone(&pumps), Arc::clone(&severed));
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if refusing.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let Ok(outbound) = TcpStream::connect(upstream).await else { continue };
                let (in_read, in_write) = inbound.into_split();
                let (out_read, out_write) = outbound.into_split();
                let up = tokio::spawn(pump(in_read, out_write, tx.subscribe()));
                let down = tokio::spawn(pump(out_read, in_write, tx.subscribe()));
                let mut all = all.lock().unwrap();
                all.retain(|pump| !pump.is_finished());
                all.extend([up, down]);
            }
        });
        StallProxy { addr, flowing, severed, accept, pumps }
    }

    /// From now on no byte moves, on any connection, old or new.
    pub fn stall(&self) {
        self.flowing.send_replace(false);
    }

    /// Bytes move again.
    pub fn resume(&self) {
        self.flowing.send_replace(true);
    }

    /// Closes every connection through the proxy (both ends see it closed),
    /// and refuses new ones until [`restore`](Self::restore).
    pub fn sever(&self) {
        self.severed.store(true, Ordering::SeqCst);
        for pump in self.pumps.lock().unwrap().drain(..) {
            pump.abort();
        }
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.severed.store(false, Ordering::SeqCst);
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut flowing: watch::Receiver<bool>,
) {
    let mut buffer = vec![0; 16 * 1024];
    loop {
        if flowing.wait_for(|flowing| *flowing).await.is_err() {
            return;
        }
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Bytes read just before a stall are held until it ends.
        if flowing.wait_for(|flowing| *flowing).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.accept.abort();
        for pump in self.pumps.lock().unwrap().drain(..) {
            pump.abort();
        }
    }
}
