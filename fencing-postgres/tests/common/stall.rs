//! A loopback TCP proxy that can *stall*: connections stay open, but no byte
//! moves either way until it resumes — what a replica sees when the network
//! to its database hangs (not a reset, which the driver notices at once).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct StallProxy {
    pub addr: SocketAddr,
    flowing: watch::Sender<bool>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl StallProxy {
    pub async fn start(upstream: SocketAddr) -> StallProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (flowing, _) = watch::channel(true);
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (tx, all) = (flowing.clone(), Arc::clone(&tasks));
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = TcpStream::connect(upstream).await else { continue };
                let (in_read, in_write) = inbound.into_split();
                let (out_read, out_write) = outbound.into_split();
                let up = tokio::spawn(pump(in_read, out_write, tx.subscribe()));
                let down = tokio::spawn(pump(out_read, in_write, tx.subscribe()));
                all.lock().unwrap().extend([up, down]);
            }
        });
        tasks.lock().unwrap().push(accept);
        StallProxy { addr, flowing, tasks }
    }

    /// From now on no byte moves, on any connection, old or new.
    pub fn stall(&self) {
        self.flowing.send_replace(false);
    }

    /// Bytes move again.
    pub fn resume(&self) {
        self.flowing.send_replace(true);
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
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}
