//! Loopback gates in front of etcd members' peer listeners, which can cut one
//! member off from the others' peer traffic (a network partition on loopback).
//!
//! Every member advertises its gate's address as its peer URL, so all raft
//! traffic between members crosses the gates. To cut member `i` off, the gate
//! in front of `i` refuses every connection, and the other gates refuse the
//! connections `i` opens; the ones already open are closed at once.
//!
//! Who opened a connection is read from the kernel, not from the bytes: the
//! process owning the other end of the accepted socket (`/proc/net/tcp` gives
//! the socket's inode, `/proc/{pid}/fd` the process holding it). etcd's
//! `X-Server-From` header is only on raft stream and pipeline requests; a
//! follower forwards lease keepalives (`/leases`), version checks and probes
//! to its peers without it, on pooled connections that may later carry raft
//! messages too. The socket's owner covers all of them, whatever protocol runs.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

/// What every gate of one cluster shares: the members' processes and who is cut off.
#[derive(Default)]
pub(crate) struct Gates {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Members' process ids, by index (`None` while a member is down).
    pids: Vec<Option<u32>>,
    isolated: HashSet<usize>,
    open: Vec<Open>,
}

/// A connection through a gate: the member behind the gate, the member that opened it.
struct Open {
    to: usize,
    from: Option<usize>,
    pump: AbortHandle,
}

impl State {
    fn allows(&self, to: usize, from: Option<usize>) -> bool {
        !self.isolated.contains(&to) && from.is_none_or(|from| !self.isolated.contains(&from))
    }
}

impl Gates {
    /// `members` members, none running yet.
    pub(crate) fn new(members: usize) -> Arc<Self> {
        let gates = Self::default();
        gates.lock().pids = vec![None; members];
        Arc::new(gates)
    }

    /// Member `i` now runs as `pid` (or is down).
    pub(crate) fn set_pid(&self, i: usize, pid: Option<u32>) {
        self.lock().pids[i] = pid;
    }

    /// Cuts member `i` off: its connections to and from the others close now,
    /// new ones are refused until [`heal`](Self::heal).
    pub(crate) fn partition(&self, i: usize) {
        let mut state = self.lock();
        state.isolated.insert(i);
        state.open.retain(|open| {
            let keep = open.to != i && open.from != Some(i) && !open.pump.is_finished();
            if !keep {
                open.pump.abort();
            }
            keep
        });
    }

    /// Member `i` may reach the others again (and they it).
    pub(crate) fn heal(&self, i: usize) {
        self.lock().isolated.remove(&i);
    }

    /// Listens on an ephemeral 127.0.0.1 port and forwards to member `to`'s
    /// real peer listener at `upstream`, as these gates allow.
    pub(crate) async fn open(self: &Arc<Self>, to: usize, upstream: SocketAddr) -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let gates = Arc::clone(self);
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                tokio::spawn(Arc::clone(&gates).forward(to, inbound, upstream));
            }
        });
        Gate { addr, accept }
    }

    async fn forward(self: Arc<Self>, to: usize, mut inbound: TcpStream, upstream: SocketAddr) {
        let (Ok(peer), Ok(local)) = (inbound.peer_addr(), inbound.local_addr()) else { return };
        let pids = self.lock().pids.clone();
        let from = tokio::task::spawn_blocking(move || owner(peer, local, &pids)).await.ok().flatten();
        if !self.lock().allows(to, from) {
            return; // dropped: closed at once
        }
        let Ok(mut outbound) = TcpStream::connect(upstream).await else { return };
        // Checked again under the lock that `partition` sweeps under: no connection slips past a cut.
        let mut state = self.lock();
        if !state.allows(to, from) {
            return;
        }
        let pump = tokio::spawn(async move {
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
        });
        state.open.retain(|open| !open.pump.is_finished());
        state.open.push(Open { to, from, pump: pump.abort_handle() });
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One member's gate: where the others reach its peer listener.
pub(crate) struct Gate {
    /// The address the member advertises as its peer URL.
    pub(crate) addr: SocketAddr,
    accept: JoinHandle<()>,
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// The index of the member whose process holds the client end of a
/// connection from `peer` to `local`, if one of `pids` does.
fn owner(peer: SocketAddr, local: SocketAddr, pids: &[Option<u32>]) -> Option<usize> {
    let inode = socket_inode(peer, local)?;
    let wanted = format!("socket:[{inode}]");
    pids.iter().position(|pid| {
        let Some(pid) = pid else { return false };
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
        fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|link| link.as_os_str() == &*wanted))
    })
}

/// The inode of the IPv4 TCP socket bound to `local_end` and connected to `remote_end`.
fn socket_inode(local_end: SocketAddr, remote_end: SocketAddr) -> Option<u64> {
    let (local_end, remote_end) = (proc_address(local_end)?, proc_address(remote_end)?);
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let matches =
            fields.get(1) == Some(&local_end.as_str()) && fields.get(2) == Some(&remote_end.as_str());
        matches.then(|| fields.get(9)?.parse().ok()).flatten()
    })
}

/// An address as `/proc/net/tcp` writes it: the IPv4 address as a host-order
/// 32-bit hex number, then the port in hex.
fn proc_address(address: SocketAddr) -> Option<String> {
    let SocketAddr::V4(v4) = address else { return None };
    let ip = u32::from_le_bytes(v4.ip().octets());
    Some(format!("{ip:08X}:{:04X}", v4.port()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_read_as_the_kernel_writes_them() {
        assert_eq!(proc_address("127.0.0.1:2379".parse().unwrap()).as_deref(), Some("0100007F:094B"));
        assert_eq!(proc_address("[::1]:80".parse().unwrap()), None);
    }

    #[tokio::test]
    async fn the_owner_of_a_loopback_connection_is_found_by_its_process() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let (peer, local) = (accepted.peer_addr().unwrap(), accepted.local_addr().unwrap());
        let me = Some(std::process::id());
        assert_eq!(owner(peer, local, &[None, Some(1), me]), Some(2));
        assert_eq!(owner(peer, local, &[Some(1)]), None, "another process holds no such socket");
    }
}
