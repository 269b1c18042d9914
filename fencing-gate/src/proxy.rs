//! [`Proxy`]: the service the layer wraps. It sends each request upstream in
//! its own future; should hyper drop a fenced request's future (its client
//! went away), what is left of the exchange goes on, on a task of its own that
//! owns the request's place inside ([`exchange`]).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use fencing_layer::future::HeldPlace;
use http::{Request, Response};
use hyper::body::Incoming;
use tower_service::Service;

use crate::body::GateBody;
use crate::exchange::{self, Shared};

/// Sends requests upstream; always ready.
#[derive(Debug, Clone)]
pub(crate) struct Proxy {
    pub(crate) shared: Arc<Shared>,
}

/// An exchange, boxed so that it can be moved onto a task of its own.
type Exchange = Pin<Box<dyn Future<Output = Response<GateBody>> + Send>>;

/// The proxy's future: the exchange, polled in the connection's task while
/// its client waits.
pub(crate) struct ProxyFuture {
    exchange: Option<Exchange>,
    /// Whether the exchange must run to its end if this is dropped (it holds a place).
    fenced: bool,
    /// Whether it has begun: one dropped before its first poll has sent nothing, and ends there.
    begun: bool,
    shared: Arc<Shared>,
}

impl Future for ProxyFuture {
    type Output = Result<Response<GateBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        this.begun = true;
        let exchange = this.exchange.as_mut().expect("polled after completion");
        let response = std::task::ready!(exchange.as_mut().poll(cx));
        this.exchange = None;
        Poll::Ready(Ok(response))
    }
}

impl Drop for ProxyFuture {
    fn drop(&mut self) {
        let Some(exchange) = self.exchange.take() else { return };
        if !self.fenced || !self.begun {
            return; // it just stops, as a client's request would; its place, if any, goes with it
        }
        // The client left: the exchange goes on without it, and its response,
        // with the upstream body (which reads itself to the end), is dropped then.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let exchange = async move { drop(exchange.await) };
            runtime.spawn(self.shared.tasks.track_future(exchange));
        }
    }
}

impl Service<Request<Incoming>> for Proxy {
    type Response = Response<GateBody>;
    type Error = Infallible;
    type Future = ProxyFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Incoming>) -> ProxyFuture {
        let shared = Arc::clone(&self.shared);
        let task = Arc::clone(&shared);
        let (exchange, fenced): (Exchange, bool) = match request.extensions_mut().remove::<HeldPlace>() {
            None => (Box::pin(exchange::unfenced(task, request)), false),
            Some(place) => (Box::pin(exchange::fenced(task, request, place)), true),
        };
        ProxyFuture { exchange: Some(exchange), fenced, begun: false, shared }
    }
}
