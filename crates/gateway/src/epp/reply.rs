//! What the picker says to the gateway: the chosen endpoint (the header and
//! the `envoy.lb` metadata) with the request's edits, an answer made here
//! instead of a worker's (a refusal, a cached answer), and the subset hint
//! read from what the gateway sent. Owns no state.

use std::collections::{BTreeMap, HashSet};

use bytes::Bytes;
use ext_proc::proto::{
    HeaderMutation, HeaderValueOption, HttpStatus, ImmediateResponse, Kind, Metadata, ProcessingResponse, Reply,
    Struct, Value,
};
use h1_codec::Route;
use planner::Subset;

use super::{DESTINATION_HEADER, FALLBACK_KEY, LB_NAMESPACE, SUBSET_KEY, SUBSET_NAMESPACE};
use crate::GatewayError;
use crate::pools::HeaderEdits;

/// What the request sent to the chosen worker carries besides its endpoint.
#[derive(Debug, Default)]
pub(super) struct Edits<'a> {
    /// The data-parallel rank that holds its prefix (`X-Data-Parallel-Rank`).
    pub(super) rank: Option<u32>,
    /// The decision's header edits.
    pub(super) edits: Option<&'a HeaderEdits>,
    /// The worker's credentials (`--api-key`), replacing the client's.
    pub(super) authorization: Option<Vec<u8>>,
    /// The client's own key must not reach the worker (client keys are configured).
    pub(super) strip_client_key: bool,
    /// The body's new length, when the router rewrote it.
    pub(super) content_length: Option<usize>,
    /// The request's id, as the router names it to workers.
    pub(super) request_id: Option<&'a str>,
}

impl<'a> Edits<'a> {
    /// What every pick carries: the workers' credentials in place of the client's (`client`,
    /// checked already), as on the HTTP port, and the request's id.
    pub(super) fn new(gw: &crate::Gateway, client: Option<&[u8]>, request_id: &'a str) -> Self {
        Edits {
            authorization: crate::pipeline::auth::worker_credentials(gw, client),
            strip_client_key: !gw.client_keys.is_empty(),
            request_id: Some(request_id),
            ..Default::default()
        }
    }
}

/// The header mutation that sends a request to `endpoint`, with `edits`.
pub(super) fn pick(endpoint: &str, edits: Edits<'_>) -> HeaderMutation {
    let mut set: Vec<(&str, Vec<u8>)> = vec![(DESTINATION_HEADER, endpoint.as_bytes().to_vec())];
    let mut remove: Vec<String> = Vec::new();
    if let Some(rank) = edits.rank {
        set.push((h1_codec::RANK_HEADER, rank.to_string().into_bytes()));
    }
    // Anthropic's `x-api-key` is read as `Authorization` and never passed on as sent (as on the
    // HTTP port); the client's own key never reaches a worker when client keys are configured.
    remove.push(h1_codec::API_KEY_HEADER.to_owned());
    // The explain's control-plane key and the plugin mode are the router's, never a worker's.
    remove.extend([h1_codec::ROUTE_DEBUG_HEADER, h1_codec::ROUTE_MODE_HEADER].map(str::to_owned));
    if edits.strip_client_key && edits.authorization.is_none() {
        remove.push("authorization".to_owned());
    }
    if let Some(auth) = edits.authorization {
        set.push(("authorization", auth));
    }
    if let Some(len) = edits.content_length {
        set.push(("content-length", len.to_string().into_bytes()));
    }
    if let Some(id) = edits.request_id {
        set.push((h1_codec::REQUEST_ID_HEADER, id.as_bytes().to_vec()));
    }
    if let Some(e) = edits.edits {
        set.extend(e.set.iter().map(|(n, v)| (n.as_str(), v.as_bytes().to_vec())));
        remove.extend(e.remove.iter().map(|n| n.as_str().to_owned()));
    }
    HeaderMutation {
        set_headers: set.into_iter().map(|(n, v)| HeaderValueOption::overwrite(n, v)).collect(),
        remove_headers: remove,
    }
}

/// The dynamic metadata that names `endpoint` to the gateway's load balancer, and the one
/// endpoint it may fall back to (the Endpoint Picker Protocol's single fallback), if any.
pub(super) fn lb_metadata(endpoint: &str, fallback: Option<&str>) -> Struct {
    let mut fields = BTreeMap::from([(DESTINATION_HEADER.to_owned(), Value::string(endpoint))]);
    if let Some(fallback) = fallback {
        fields.insert(FALLBACK_KEY.to_owned(), Value::string(fallback));
    }
    let inner = Struct { fields };
    Struct { fields: BTreeMap::from([(LB_NAMESPACE.to_owned(), Value { kind: Some(Kind::Struct(inner)) })]) }
}

/// An answer the gateway sends instead of a worker's, with `headers` and the request's id.
pub(super) fn immediate(
    status: u16,
    headers: &[(&str, &[u8])],
    (body, request_id): (Bytes, &str),
    details: &str,
) -> ProcessingResponse {
    let id = (h1_codec::REQUEST_ID_HEADER, request_id.as_bytes());
    let set = headers.iter().chain([&id]).map(|(n, v)| HeaderValueOption::overwrite(n, *v)).collect();
    let answer = ImmediateResponse {
        status: Some(HttpStatus { code: i32::from(status) }),
        headers: Some(HeaderMutation { set_headers: set, remove_headers: Vec::new() }),
        body,
        details: details.to_owned(),
    };
    ProcessingResponse { response: Some(Reply::ImmediateResponse(answer)), dynamic_metadata: None }
}

/// A refusal or failure, as the route's JSON error (OpenAI's or Anthropic's) with its headers.
pub(super) fn error(e: &GatewayError, route: Option<Route>, request_id: &str) -> ProcessingResponse {
    let extra = e.extra_headers();
    let mut headers: Vec<(&str, &[u8])> = vec![("content-type", b"application/json")];
    headers.extend(extra.iter().map(|(n, v)| (*n, v.as_bytes())));
    let body = Bytes::from(e.body_for(route).to_string());
    immediate(e.status().as_u16(), &headers, (body, request_id), e.kind())
}

/// A response-cache hit (or a cascade's kept answer), with its route headers.
pub(super) fn cached(hit: &crate::cache::Hit, request_id: &str) -> ProcessingResponse {
    let mut headers: Vec<(&str, &[u8])> = hit.headers.0.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
    headers.extend(hit.answer.content_type.as_ref().map(|ct| ("content-type", ct.as_bytes())));
    let answer = (hit.answer.body.clone(), request_id);
    immediate(hit.answer.status, &headers, answer, "response_cache_hit")
}

/// The endpoints the gateway allows (`envoy.lb.subset_hint`), if it says: `None` when it
/// does not, a subset (perhaps empty: nothing may be picked) when it does.
pub(super) fn subset(metadata: Option<&Metadata>) -> Result<Option<Subset>, &'static str> {
    let Some(hint) = metadata.and_then(|m| m.filter_metadata.get(SUBSET_NAMESPACE)) else { return Ok(None) };
    let Some(value) = hint.fields.get(SUBSET_KEY) else { return Ok(None) };
    let Some(Kind::List(list)) = &value.kind else { return Err("the endpoint subset is not a list") };
    let mut allowed = HashSet::with_capacity(list.values.len());
    for v in &list.values {
        match &v.kind {
            Some(Kind::String(s)) => allowed.insert(s.trim().to_owned()),
            _ => return Err("an endpoint of the subset is not a string"),
        };
    }
    Ok(Some(Subset(allowed)))
}

/// The endpoints a test names (`test-epp-endpoint-selection: ip:port[,ip:port]`).
pub(super) fn named(value: &[u8]) -> Subset {
    let text = String::from_utf8_lossy(value);
    Subset(text.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext_proc::proto::ListValue;

    fn hint(values: Vec<Value>) -> Metadata {
        let list = Value { kind: Some(Kind::List(ListValue { values })) };
        let ns = Struct { fields: BTreeMap::from([(SUBSET_KEY.to_owned(), list)]) };
        Metadata { filter_metadata: [(SUBSET_NAMESPACE.to_owned(), ns)].into() }
    }

    #[test]
    fn the_subset_hint_is_read_as_the_protocol_writes_it() {
        assert_eq!(subset(None), Ok(None), "no metadata: any endpoint");
        let two = hint(vec![Value::string("10.0.0.1:8000"), Value::string("10.0.0.2:8000")]);
        let got = subset(Some(&two)).unwrap().unwrap();
        assert!(got.0.contains("10.0.0.1:8000") && got.0.contains("10.0.0.2:8000") && got.0.len() == 2);
        assert_eq!(subset(Some(&hint(vec![]))).unwrap().unwrap().0.len(), 0, "an empty list allows nothing");
        assert!(subset(Some(&hint(vec![Value { kind: Some(Kind::Bool(true)) }]))).is_err());
    }

    #[test]
    fn a_pick_names_its_endpoint_in_the_header_and_the_lb_metadata() {
        let m = pick("10.0.0.1:8000", Edits { rank: Some(1), content_length: Some(42), ..Default::default() });
        let set: Vec<(&str, &[u8])> =
            m.set_headers.iter().map(|o| o.header.as_ref().unwrap()).map(|h| (h.key.as_str(), h.bytes())).collect();
        assert_eq!(
            set,
            [(DESTINATION_HEADER, &b"10.0.0.1:8000"[..]), (h1_codec::RANK_HEADER, b"1"), ("content-length", b"42")]
        );
        // With client keys, the client's key never reaches the worker: the workers' key instead, or none.
        let keyed = pick(
            "e:1",
            Edits { strip_client_key: true, authorization: Some(b"Bearer w".to_vec()), ..Default::default() },
        );
        assert_eq!(keyed.remove_headers, ["x-api-key", "x-route-debug", "x-route-mode"]);
        assert!(keyed.set_headers.iter().any(|o| o.header.as_ref().unwrap().key == "authorization"));
        let anonymous = pick("e:1", Edits { strip_client_key: true, ..Default::default() });
        assert_eq!(anonymous.remove_headers, ["x-api-key", "x-route-debug", "x-route-mode", "authorization"]);
        let md = lb_metadata("10.0.0.1:8000", None);
        let Some(Kind::Struct(lb)) = &md.fields[LB_NAMESPACE].kind else { panic!("a struct") };
        assert_eq!(lb.fields[DESTINATION_HEADER], Value::string("10.0.0.1:8000"));
        assert!(!lb.fields.contains_key(FALLBACK_KEY));
        let md = lb_metadata("10.0.0.1:8000", Some("10.0.0.2:8000"));
        let Some(Kind::Struct(lb)) = &md.fields[LB_NAMESPACE].kind else { panic!("a struct") };
        assert_eq!(lb.fields[FALLBACK_KEY], Value::string("10.0.0.2:8000"));
    }
}
