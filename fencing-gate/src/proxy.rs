//! [`Proxy`]: the service the layer wraps. It sends each request upstream:
//! an unfenced one in its own future, a fenced one on a task that owns the
//! request's place inside ([`exchange`]).

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

/// The proxy's future: the exchange, or the wait for its task's answer.
pub(crate) type ProxyFuture = Pin<Box<dyn Future<Output = Result<Response<GateBody>, Infallible>> + Send>>;

impl Service<Request<Incoming>> for Proxy {
    type Response = Response<GateBody>;
    type Error = Infallible;
    type Future = ProxyFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Incoming>) -> ProxyFuture {
        let shared = Arc::clone(&self.shared);
        match request.extensions_mut().remove::<HeldPlace>() {
            None => Box::pin(async move { Ok(exchange::unfenced(shared, request).await) }),
            Some(place) => Box::pin(async move { Ok(exchange::fenced(shared, request, place).await) }),
        }
    }
}
