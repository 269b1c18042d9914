//! `[forwarding] upgrades = "pass"`: an `Upgrade` request (WebSocket) goes to
//! the upstream unfenced and, once it answers 101, the two connections are
//! joined byte for byte. Nothing after the upgrade is HTTP, so nothing in it
//! can be fenced: a stale holder's messages on an upgraded connection reach
//! the upstream. Refused by default (501); `docs/gate.md` says when to pass.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use crate::body::{GateBody, Upstream};
use crate::exchange::{Shared, UpstreamOutcome};
use crate::forward::{Forwarder, Peer};
use crate::problem::GateProblem;
use crate::upstream::SendError;

/// Forwards an upgrade request and, on 101, joins the two connections.
pub(crate) async fn pass(
    shared: Arc<Shared>,
    forwarder: &Forwarder,
    mut request: Request<Incoming>,
    peer: &Peer,
) -> Response<GateBody> {
    let protocol = request.headers().get(header::UPGRADE).cloned();
    let client_side = hyper::upgrade::on(&mut request);
    forwarder.rewrite(&mut request, peer);
    if let Some(protocol) = protocol {
        request.headers_mut().insert(header::UPGRADE, protocol);
        request.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    let bound = shared.timeouts.upstream();
    let (mut response, sender) = match tokio::time::timeout(bound, shared.pool.send(request)).await {
        Ok(Ok(answered)) => answered,
        Ok(Err(SendError::Connect(error))) => {
            return GateProblem::Unreachable.response(format!("the upgrade request failed: {error}"));
        }
        Ok(Err(SendError::Sent(error))) => {
            return GateProblem::Broke.response(format!("the upgrade request failed: {error}"));
        }
        Err(_) => return GateProblem::TimedOut.response("the upstream did not answer the upgrade in time"),
    };
    shared.metrics.upstream(UpstreamOutcome::Answered);
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        let (mut head, body) = response.into_parts();
        crate::forward::strip_hop_by_hop(&mut head.headers);
        return Response::from_parts(head, GateBody::Upstream(Upstream::new(body, None, sender, shared)));
    }
    // The connection is the tunnel's now: it never goes back to the pool.
    drop(sender);
    let upstream_side = hyper::upgrade::on(&mut response);
    tokio::spawn(async move {
        let (Ok(client), Ok(upstream)) = (client_side.await, upstream_side.await) else { return };
        let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    });
    let (head, _) = response.into_parts();
    Response::from_parts(head, GateBody::Own(Full::new(Bytes::new())))
}
