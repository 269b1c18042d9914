//! Putting a lease's token (and proof) on an outgoing request by hand: the
//! `Fencing-Token` header in canonical decimal, the `Fencing-Proof` header,
//! and their gRPC metadata twins. [`Lease::fence`](crate::Lease::fence) and
//! [`Lease::fence_reqwest`](crate::Lease::fence_reqwest) do both at once.
//!
//! The header names are the fencing layer's own ([`FENCING_TOKEN`],
//! [`FENCING_PROOF`]), defined once, where they are read.

use http::HeaderValue;

pub use fencing_layer::{FENCING_PROOF, FENCING_TOKEN};

/// `token` as a header value: canonical decimal (no sign, no padding, no leading zeros).
pub fn fencing_token_value(token: u64) -> HeaderValue {
    HeaderValue::from(token)
}

/// Sets the `Fencing-Token` header of `request` to `token`, replacing any value
/// already there (a repeated header would be rejected by the fencing layer).
pub fn set_fencing_token<B>(request: &mut http::Request<B>, token: u64) {
    request.headers_mut().insert(FENCING_TOKEN, fencing_token_value(token));
}

/// Adds the `Fencing-Token` header with `token` to a reqwest request.
///
/// reqwest 0.13's `RequestBuilder`, re-exported as
/// [`fencing_client::drivers::reqwest`](crate::drivers::reqwest): a builder
/// from another reqwest version is a different type.
pub fn fence_reqwest(request: reqwest::RequestBuilder, token: u64) -> reqwest::RequestBuilder {
    request.header(FENCING_TOKEN, fencing_token_value(token))
}

/// Sets the `Fencing-Proof` header of `request` to `proof` (a grant's
/// [`Grant::proof`](crate::Grant::proof)), replacing any value already there. A proof that is not a
/// valid header value (it never is one, from the lock service: URL-safe base64)
/// is left out, and the resource refuses the raise.
pub fn set_fencing_proof<B>(request: &mut http::Request<B>, proof: &str) {
    match HeaderValue::from_str(proof) {
        Ok(value) => {
            request.headers_mut().insert(FENCING_PROOF, value);
        }
        Err(_) => {
            request.headers_mut().remove(FENCING_PROOF);
        }
    }
}

/// Adds the `Fencing-Proof` header with `proof` to a reqwest request.
pub fn fence_reqwest_proof(request: reqwest::RequestBuilder, proof: &str) -> reqwest::RequestBuilder {
    request.header(FENCING_PROOF, proof)
}

/// Sets the `fencing-token` metadata of a tonic request to `token` (gRPC
/// metadata travels as HTTP/2 headers, so the fencing layer reads it as it reads
/// the header), replacing any value already there.
#[cfg(feature = "tonic")]
pub fn fence_tonic<T>(request: &mut tonic::Request<T>, token: u64) {
    request.metadata_mut().insert(metadata_key(&FENCING_TOKEN), tonic::metadata::MetadataValue::from(token));
}

/// Sets the `fencing-proof` metadata of a tonic request to `proof`, or removes
/// it when `proof` is not a valid metadata value (the resource then refuses a raise).
#[cfg(feature = "tonic")]
pub fn fence_tonic_proof<T>(request: &mut tonic::Request<T>, proof: &str) {
    match proof.parse() {
        Ok(value) => {
            request.metadata_mut().insert(metadata_key(&FENCING_PROOF), value);
        }
        Err(_) => {
            request.metadata_mut().remove(FENCING_PROOF.as_str());
        }
    }
}

/// `name` as a gRPC metadata key: metadata travels as HTTP/2 headers, so the
/// layer's header names are its keys.
#[cfg(feature = "tonic")]
fn metadata_key(name: &http::HeaderName) -> tonic::metadata::AsciiMetadataKey {
    // A lowercase header name without a `-bin` suffix is always an ASCII metadata key.
    tonic::metadata::AsciiMetadataKey::from_bytes(name.as_ref())
        .expect("the layer's header names are metadata keys")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "tonic")]
    #[test]
    fn sets_token_and_proof_metadata_on_a_tonic_request() {
        let mut request = tonic::Request::new(());
        request.metadata_mut().append("fencing-token", "7".parse().unwrap());
        fence_tonic(&mut request, 42);
        let values: Vec<_> = request.metadata().get_all("fencing-token").iter().collect();
        assert_eq!(values, ["42"]);
        fence_tonic_proof(&mut request, "abc_-");
        assert_eq!(request.metadata().get("fencing-proof").unwrap(), "abc_-");
        fence_tonic_proof(&mut request, "not\nvalid");
        assert!(request.metadata().get("fencing-proof").is_none());
        // As the layer reads it: the request's headers.
        let http = request.into_parts().0.into_headers();
        assert_eq!(http["fencing-token"], "42");
    }

    #[test]
    fn sets_canonical_header_on_http_request() {
        let mut req = http::Request::builder()
            .method("PUT")
            .uri("/docs/a")
            .header("fencing-token", "0007")
            .header("Fencing-Token", "1")
            .body(())
            .unwrap();
        set_fencing_token(&mut req, 42);
        let values: Vec<_> = req.headers().get_all("Fencing-Token").iter().collect();
        assert_eq!(values, vec!["42"]);
        set_fencing_token(&mut req, u64::MAX);
        assert_eq!(req.headers()["fencing-token"], "18446744073709551615");
        set_fencing_token(&mut req, 0);
        assert_eq!(req.headers()["fencing-token"], "0");
    }

    #[test]
    fn sets_header_on_reqwest_builder() {
        let client = reqwest::Client::new();
        let req = fence_reqwest(client.put("http://127.0.0.1:9/x"), 1234).build().unwrap();
        let values: Vec<_> = req.headers().get_all("Fencing-Token").iter().collect();
        assert_eq!(values, vec!["1234"]);
    }
}
