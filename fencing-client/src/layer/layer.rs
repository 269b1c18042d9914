//! [`FencedClientLayer`]: the lease's headers and state, shared by every client it wraps.

use std::sync::{Arc, OnceLock};

use http::{HeaderMap, HeaderValue};
use tower::Layer;

use crate::header::{FENCING_PROOF, FENCING_TOKEN, fencing_token_value};
use crate::lease::Shared;
use crate::{Lease, LossReason, Lost};

/// A tower [`Layer`] that fences every request of the client it wraps with a [`Lease`].
///
/// Cheap to clone (one `Arc`). It does not keep the lease alive: dropping or
/// releasing the [`Lease`] ends it, and the wrapped clients then refuse requests.
/// See [the module docs](crate::layer) for what happens to each request.
#[derive(Debug, Clone)]
pub struct FencedClientLayer {
    pub(crate) fence: Arc<Fence>,
}

impl FencedClientLayer {
    /// A layer fencing requests with `lease` (also [`Lease::layer`]).
    pub fn new(lease: &Lease) -> Self {
        let proof = lease.grant().proof.as_deref().and_then(|proof| HeaderValue::from_str(proof).ok());
        let fence = Fence {
            lease: Arc::clone(lease.shared()),
            token: fencing_token_value(lease.token()),
            proof,
            superseded: OnceLock::new(),
        };
        FencedClientLayer { fence: Arc::new(fence) }
    }
}

impl<S> Layer<S> for FencedClientLayer {
    type Service = crate::FencedClient<S>;

    fn layer(&self, inner: S) -> Self::Service {
        crate::FencedClient::from_layer(inner, self.clone())
    }
}

/// The lease's state and its headers, encoded once.
#[derive(Debug)]
pub(crate) struct Fence {
    pub(crate) lease: Arc<Shared>,
    token: HeaderValue,
    // `None` when the grant is unsigned (or its proof is no header value, which the
    // resource then refuses to raise with, as for `Lease::fence`).
    proof: Option<HeaderValue>,
    // Set, with the highest token it named, once a resource has answered a request as
    // stale: proof that this lease is over for it, so nothing more is sent.
    superseded: OnceLock<Option<u64>>,
}

impl Fence {
    /// Fences a request's `headers` while the lease is valid; the loss once it is not.
    pub(crate) fn admit(&self, headers: &mut HeaderMap) -> Result<(), Lost> {
        if let Some(&highest) = self.superseded.get() {
            return Err(Lost(LossReason::Superseded { highest }));
        }
        if !self.lease.is_valid() {
            return Err(self.lease.lost());
        }
        self.apply(headers);
        Ok(())
    }

    /// Records a resource's proof that a newer token exists (the first one's `highest`
    /// is kept); every later request is refused.
    pub(crate) fn supersede(&self, highest: Option<u64>) -> Lost {
        let highest = *self.superseded.get_or_init(|| highest);
        tracing::warn!(token = self.lease_token(), ?highest, "a resource refused the lease's token as stale");
        Lost(LossReason::Superseded { highest })
    }

    fn lease_token(&self) -> &str {
        self.token.to_str().unwrap_or_default()
    }

    /// Sets `Fencing-Token`, and `Fencing-Proof` or removes it, as `Lease::fence` does.
    fn apply(&self, headers: &mut HeaderMap) {
        headers.insert(FENCING_TOKEN, self.token.clone());
        match &self.proof {
            Some(proof) => {
                headers.insert(FENCING_PROOF, proof.clone());
            }
            None => {
                headers.remove(FENCING_PROOF);
            }
        }
    }
}
