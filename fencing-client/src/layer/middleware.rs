//! [`FencedMiddleware`]: the client layer for reqwest-middleware's `ClientWithMiddleware`.

use http::Extensions;
use reqwest_middleware::{Middleware, Next};

use super::future::ResponseFuture;
use super::{FencedClientError, FencedClientLayer};
use crate::Lease;

/// [`FencedClientLayer`] as a [reqwest-middleware](reqwest_middleware) middleware
/// (feature `reqwest-middleware`), for code that sends with the builder's `.send()`.
///
/// The same rules: every request fenced, none sent once the lease is lost, one in
/// flight cancelled, none sent after a resource refused one as stale. A lost lease
/// is a `reqwest_middleware::Error::Middleware` holding a
/// `FencedClientError<reqwest::Error>` (`NotSent`, `Cancelled` or `Refused`); errors
/// of the rest of the chain come back unchanged.
///
/// ```no_run
/// # async fn demo(lease: fencing_client::Lease) -> Result<(), Box<dyn std::error::Error>> {
/// use fencing_client::{FencedClientError, layer::FencedMiddleware};
///
/// let http = reqwest_middleware::ClientBuilder::new(fencing_client::drivers::reqwest::Client::new())
///     .with(FencedMiddleware::new(&lease))
///     .build();
/// match http.put("http://127.0.0.1:8080/docs/report").body("v2").send().await {
///     Ok(response) => println!("{}", response.status()),
///     Err(reqwest_middleware::Error::Middleware(error)) => {
///         let lost = error.downcast_ref::<FencedClientError<reqwest::Error>>().and_then(|e| e.lost());
///         println!("lease lost: {lost:?}");
///     }
///     Err(error) => return Err(error.into()),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct FencedMiddleware {
    layer: FencedClientLayer,
}

impl FencedMiddleware {
    /// A middleware fencing requests with `lease`.
    pub fn new(lease: &Lease) -> Self {
        FencedMiddleware { layer: FencedClientLayer::new(lease) }
    }
}

impl From<FencedClientLayer> for FencedMiddleware {
    fn from(layer: FencedClientLayer) -> Self {
        FencedMiddleware { layer }
    }
}

#[async_trait::async_trait]
impl Middleware for FencedMiddleware {
    async fn handle(
        &self,
        mut request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let fence = &self.layer.fence;
        let stopped: FencedClientError<reqwest::Error> = match fence.admit(request.headers_mut()) {
            Err(lost) => FencedClientError::NotSent(lost),
            Ok(()) => match ResponseFuture::sent(next.run(request, extensions), fence).await {
                Ok(response) => return Ok(response),
                Err(FencedClientError::Inner(error)) => return Err(error),
                Err(FencedClientError::NotSent(lost)) => FencedClientError::NotSent(lost),
                Err(FencedClientError::Cancelled(lost)) => FencedClientError::Cancelled(lost),
                Err(FencedClientError::Refused(lost)) => FencedClientError::Refused(lost),
            },
        };
        Err(reqwest_middleware::Error::middleware(stopped))
    }
}
