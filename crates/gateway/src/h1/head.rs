//! How both front ends answer a request head the HTTP/1.1 codec refuses
//! ([`h1_codec::Refusal`]): a malformed head (400), a request line longer than
//! the head limit (414), a head over the size or header-count limit (431), a
//! client too slow with its head or body (408). Each gets the gateway's JSON
//! error body and the connection closes: after such a head the byte stream
//! cannot be trusted. Which heads are refused is the codec's (its `check`
//! and `parse_head`).

use h1_codec::{MAX_HEAD_BYTES, MAX_HEADERS, Refusal};

use crate::GatewayError;

/// The answers to the codec's refusals.
pub(crate) trait Answer {
    /// The gateway error this refusal answers with (its one mapping to HTTP).
    fn gateway_error(&self) -> GatewayError;

    /// The whole answer, closing the connection.
    fn answer(&self) -> Vec<u8>;
}

impl Answer for Refusal {
    /// The gateway error this refusal answers with (its one mapping to HTTP).
    fn gateway_error(&self) -> GatewayError {
        match self {
            Refusal::Malformed(m) => GatewayError::BadRequest(m.clone()),
            Refusal::HeadTimeout(t) => {
                GatewayError::ClientTimeout(format!("the request head did not arrive within {t:?}"))
            }
            Refusal::BodyTimeout(t) => {
                GatewayError::ClientTimeout(format!("the request body did not arrive within {t:?}"))
            }
            Refusal::BodyStall(t) => GatewayError::ClientTimeout(format!("no byte of the request body came for {t:?}")),
            Refusal::UriTooLong => GatewayError::UriTooLong(format!("request line longer than {MAX_HEAD_BYTES} bytes")),
            Refusal::TooManyHeaders => {
                GatewayError::HeaderFieldsTooLarge(format!("more than {MAX_HEADERS} header fields"))
            }
            Refusal::HeadTooLarge => {
                GatewayError::HeaderFieldsTooLarge(format!("request head larger than {MAX_HEAD_BYTES} bytes"))
            }
        }
    }

    /// The whole answer, closing the connection.
    fn answer(&self) -> Vec<u8> {
        let e = self.gateway_error();
        let body = e.body().to_string();
        let status = e.status();
        let mut out = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(body.as_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn every_refusal_answers_json_and_closes() {
        for (r, status) in [
            (Refusal::Malformed("x".into()), 400),
            (Refusal::UriTooLong, 414),
            (Refusal::HeadTooLarge, 431),
            (Refusal::TooManyHeaders, 431),
            (Refusal::HeadTimeout(Duration::from_secs(1)), 408),
            (Refusal::BodyTimeout(Duration::from_secs(1)), 408),
            (Refusal::BodyStall(Duration::from_secs(1)), 408),
        ] {
            let answer = String::from_utf8(r.answer()).unwrap();
            let (head, body) = answer.split_once("\r\n\r\n").unwrap();
            assert!(head.starts_with(&format!("HTTP/1.1 {status} ")), "{head}");
            assert!(head.contains("\r\nconnection: close") && head.contains("application/json"), "{head}");
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(v["error"]["code"], status, "{v}");
            assert!(v["error"]["type"].is_string() && v["error"]["message"].is_string(), "{v}");
        }
    }
}
