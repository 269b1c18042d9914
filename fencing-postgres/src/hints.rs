//! The replica's hints: a connection of its own that `LISTEN`s on the claims
//! channel, driven by a thread and a runtime of its own, never the keeper's.
//!
//! Why apart: any role that can connect can `NOTIFY` on the channel, no
//! privilege needed, hundreds of thousands a second. On the connection that
//! renews, those notifications queued ahead of the renewals' replies on the
//! one socket, and parsing them took the keeper's one thread: renewals timed
//! out and claims lapsed (issue 47). Here a flood costs this thread and the
//! hints themselves (the channel keeps the newest [`EVENTS`]); the renewals'
//! connection hears none of it.
//!
//! The thread ends when its connection ends, or when the renewals' connection
//! ends (its driver holds the sender of `until`), so the session ends with
//! either. Its end drops the channel's only sender: the keeper's `events`
//! closes, and it opens another session.

use std::future::poll_fn;
use std::task::Poll;

use fencing_layer::claims::{ClaimEvent, EVENTS};
use fencing_layer::store::StoreError;
use tokio::sync::{broadcast, oneshot};
use tokio_postgres::{AsyncMessage, Connection, Socket};

use crate::claims::parse;
use crate::connect::{PgConnect, PgTlsStream, store_error};

/// The session's own test notification, and who waits to hear it: a hint
/// connection behind a pooler in transaction mode hears nothing (PgBouncer
/// drops a notification that arrives while no client is linked to the server
/// session), and only a notification sent on purpose tells that apart from
/// a quiet channel.
pub(crate) struct Echo {
    payload: String,
    heard: Option<oneshot::Sender<()>>,
}

impl Echo {
    /// Waits for `payload` (one that [`parse`] takes for no event).
    pub(crate) fn new(payload: String) -> (Self, oneshot::Receiver<()>) {
        let (heard, hearing) = oneshot::channel();
        (Self { payload, heard: Some(heard) }, hearing)
    }

    fn heard(&mut self, payload: &str) {
        if payload == self.payload {
            self.heard.take().map(|heard| heard.send(()));
        }
    }
}

/// Most notifications taken off the socket before the thread looks at its
/// stop signal again: a flood never keeps it from ending.
const BATCH: usize = 1024;

/// Starts the hint thread: it connects with `config`, `LISTEN`s on `channel`
/// and forwards every notification that parses into a new channel of
/// [`EVENTS`], until its connection ends or `until` resolves (its sender is
/// dropped). Answers once it listens, with the channel's receiver.
pub(crate) async fn listen(
    config: PgConnect,
    channel: String,
    until: oneshot::Receiver<()>,
    echo: Echo,
) -> Result<broadcast::Receiver<ClaimEvent>, StoreError> {
    let (sender, events) = broadcast::channel(EVENTS);
    let (ready, listening) = oneshot::channel();
    std::thread::Builder::new()
        .name("fencing-claims-hints".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(error) => return drop(ready.send(Err(StoreError::log(error)))),
            };
            runtime.block_on(async move {
                tokio::select! {
                    _ = until => {}
                    () = hear(config, channel, sender, ready, echo) => {}
                }
            });
        })
        .map_err(StoreError::log)?;
    let heard = listening.await.map_err(|_| StoreError::log(std::io::Error::other("the hint thread ended")));
    heard??;
    Ok(events)
}

/// Connects, listens (telling `ready`), then forwards until the connection ends.
async fn hear(
    config: PgConnect,
    channel: String,
    sender: broadcast::Sender<ClaimEvent>,
    ready: oneshot::Sender<Result<(), StoreError>>,
    echo: Echo,
) {
    let (client, connection) = match config.connect().await {
        Ok(connected) => connected,
        Err(error) => return drop(ready.send(Err(store_error(error)))),
    };
    let forwarding = forward(connection, sender, echo);
    tokio::pin!(forwarding);
    let listen = format!("LISTEN {channel}");
    tokio::select! {
        () = &mut forwarding => {
            let _ = ready.send(Err(StoreError::log(std::io::Error::other("the hint connection ended"))));
            return;
        }
        listened = client.batch_execute(&listen) => {
            let listened = listened.map_err(StoreError::log);
            let failed = listened.is_err();
            if ready.send(listened).is_err() || failed {
                return;
            }
        }
    }
    // `client` lives as long as the connection is driven: dropping it would close it.
    forwarding.await;
    drop(client);
}

/// Drives `connection`, sending each notification that parses to `sender`
/// (a full channel drops the oldest; the keeper then reads every mark). Ends
/// with the connection.
async fn forward(
    mut connection: Connection<Socket, PgTlsStream>,
    sender: broadcast::Sender<ClaimEvent>,
    mut echo: Echo,
) {
    let ended = poll_fn(|cx| {
        for _ in 0..BATCH {
            match connection.poll_message(cx) {
                Poll::Ready(Some(Ok(AsyncMessage::Notification(note)))) => {
                    if let Some(event) = parse(note.payload()) {
                        let _ = sender.send(event);
                    } else {
                        echo.heard(note.payload());
                    }
                }
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Err(error)),
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
        // More is waiting: let the stop signal be looked at, then go on.
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await;
    // The session ends first: a log output that blocks this thread (a full
    // pipe, say) must not keep the keeper on a session that hears nothing.
    drop(sender);
    if let Err(error) = ended {
        tracing::warn!(%error, "claims: the hint connection ended");
    }
}
