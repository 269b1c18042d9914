//! [`GateBody`]: what the gate answers with, an upstream's streamed body or an
//! answer of its own; and [`Upstream`], the streamed body that holds the
//! request's place inside until the upstream's response has been read to the end.

use std::error::Error as StdError;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use fencing_layer::future::HeldPlace;
use fencing_layer::respond::RejectionBody;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::time::Sleep;

use crate::exchange::Shared;
use crate::upstream::Sender;

/// The error of a body the gate streams: the upstream's, or its silence past the bound.
pub type BodyError = Box<dyn StdError + Send + Sync>;

/// A response body of the gate: an upstream's, streamed, or the gate's own.
#[derive(Debug)]
pub enum GateBody {
    /// The gate's own answer (a refusal).
    Own(Full<Bytes>),
    /// The upstream's body, streamed as it comes.
    Upstream(Upstream),
}

impl RejectionBody for GateBody {
    fn from_rejection(bytes: Bytes) -> Self {
        Self::Own(Full::new(bytes))
    }
}

impl Body for GateBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            Self::Own(full) => Pin::new(full).poll_frame(cx).map_err(|never| match never {}),
            Self::Upstream(upstream) => Pin::new(upstream).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Own(full) => full.is_end_stream(),
            Self::Upstream(upstream) => upstream.body.as_ref().is_none_or(Body::is_end_stream),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Own(full) => full.size_hint(),
            Self::Upstream(upstream) => upstream.body.as_ref().map(Body::size_hint).unwrap_or_default(),
        }
    }
}

/// An upstream's response body. While it streams, it holds the fenced
/// request's place (when it has one): the exchange has not ended until the
/// last byte is read. Should the client go before that, the rest is read
/// anyway, on a task of its own, and only then is the place let go; should the
/// upstream break off or fall silent past the bound, the outcome is unknown
/// and the place is held for the quarantine.
#[derive(Debug)]
pub struct Upstream {
    body: Option<Incoming>,
    place: Option<HeldPlace>,
    /// The connection the body comes on: back to the pool once it has been read to the end.
    connection: Option<Sender>,
    silence: Option<Pin<Box<Sleep>>>,
    shared: Arc<Shared>,
}

impl Upstream {
    pub(crate) fn new(
        body: Incoming,
        place: Option<HeldPlace>,
        connection: Sender,
        shared: Arc<Shared>,
    ) -> Self {
        let mut upstream =
            Self { body: Some(body), place, connection: Some(connection), silence: None, shared };
        if upstream.body.as_ref().is_some_and(Body::is_end_stream) {
            upstream.finish();
        }
        upstream
    }

    /// The exchange ended: the place goes, the connection is free for another.
    fn finish(&mut self) {
        self.body = None;
        self.place = None;
        if let Some(connection) = self.connection.take() {
            self.shared.pool.put(connection);
        }
    }

    /// The exchange ended without an answer we can trust.
    fn broke_off(&mut self) {
        self.body = None;
        if let Some(place) = self.place.take() {
            self.shared.quarantine(place);
        }
    }
}

impl Body for Upstream {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let Some(body) = this.body.as_mut() else { return Poll::Ready(None) };
        if this.place.as_ref().is_some_and(|place| place.poll_revoked(cx).is_ready()) {
            // The gate lost its claim on the key: the exchange stops here.
            this.body = None;
            this.place = None;
            this.connection = None;
            return Poll::Ready(Some(Err("this gate lost its claim on the key mid-response".into())));
        }
        match Pin::new(body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.silence = None;
                if this.body.as_ref().is_some_and(Body::is_end_stream) {
                    this.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                this.finish();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(error))) => {
                this.broke_off();
                Poll::Ready(Some(Err(error.into())))
            }
            Poll::Pending => {
                let bound = this.shared.timeouts.upstream();
                let silence = this.silence.get_or_insert_with(|| Box::pin(tokio::time::sleep(bound)));
                ready!(silence.as_mut().poll(cx));
                this.broke_off();
                Poll::Ready(Some(Err(
                    format!("the upstream sent nothing for {} ms", bound.as_millis()).into()
                )))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body.as_ref().map(Body::size_hint).unwrap_or_default()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let (Some(body), Some(place)) = (self.body.take(), self.place.take()) else { return };
        // The client left mid-body: read the rest, then let the place go.
        let shared = Arc::clone(&self.shared);
        let connection = self.connection.take();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let tracker = shared.tasks.clone();
            runtime.spawn(tracker.track_future(drain(body, place, connection, shared)));
        }
    }
}

/// Reads `body` to its end, each wait bounded, holding `place` until then (or
/// for the quarantine, if the upstream breaks off).
async fn drain(mut body: Incoming, place: HeldPlace, connection: Option<Sender>, shared: Arc<Shared>) {
    let bound = shared.timeouts.upstream();
    loop {
        match tokio::time::timeout(bound, body.frame()).await {
            Ok(None) => {
                if let Some(connection) = connection {
                    shared.pool.put(connection);
                }
                return;
            }
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(_))) | Err(_) => return shared.quarantine(place),
        }
    }
}
