//! Getting in and being refused: bearer tokens (401), malformed requests
//! (400), unknown routes and methods, versions not reached yet (504), the
//! request log, and HTTPS with the CA the server made (and a kubeconfig).

mod common;

use common::{DEADLINE, assert_status, get, get_json, names, spawn, summary, watch_with};
use mock_k8s::{MockApiConfig, Pod, base64_encode};
use serde_json::json;

#[tokio::test]
async fn a_token_is_required_when_configured() {
    let server = spawn(MockApiConfig { token: Some("s3cret".into()), ..MockApiConfig::default() }).await;
    server.upsert_pod(Pod::new("ns", "a"));
    let client = reqwest::Client::new();
    let url = format!("{}/api/v1/namespaces/ns/pods", server.url());
    let want = json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401});
    for auth in [None, Some("Bearer wrong"), Some("Basic s3cret"), Some("s3cret")] {
        let mut request = client.get(&url);
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        let response = tokio::time::timeout(DEADLINE, request.send()).await.unwrap().unwrap();
        assert_eq!(response.status(), 401, "{auth:?}");
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body, want);
    }
    let watch_url = format!("{url}?watch=1");
    let refused = client.get(&watch_url).send();
    assert_eq!(tokio::time::timeout(DEADLINE, refused).await.unwrap().unwrap().status(), 401);
    assert_eq!(server.lists(), 0, "refused requests are not lists");

    let answer = client.get(&url).bearer_auth("s3cret").send();
    let answer = tokio::time::timeout(DEADLINE, answer).await.unwrap().unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(names(&answer.json().await.unwrap()), ["a"]);
    assert_eq!(server.lists(), 1);
    let log = server.requests();
    assert_eq!(log.len(), 6);
    assert_eq!(log[0], "GET /api/v1/namespaces/ns/pods");
    assert_eq!(log[4], "GET /api/v1/namespaces/ns/pods?watch=1");
}

#[tokio::test]
async fn malformed_requests_are_400_and_the_rest_have_their_status() {
    let server = spawn(MockApiConfig::default()).await;
    for bad in [
        "/api/v1/pods?labelSelector=app%20in%20(",
        "/api/v1/pods?labelSelector=app%3D%3D%3D",
        "/api/v1/pods?watch=1&labelSelector=a,",
        "/api/v1/pods?watch=maybe",
        "/api/v1/pods?limit=ten",
        "/api/v1/pods?timeoutSeconds=soon&watch=1",
        "/api/v1/pods?watch=1&resourceVersion=abc",
        "/api/v1/pods?resourceVersionMatch=Exact",
        "/api/v1/pods?continue=x&resourceVersion=3",
    ] {
        let status = get_json(&server, bad, 400).await;
        assert_status(&status, 400, "BadRequest");
    }
    let selector = get_json(&server, "/api/v1/pods?labelSelector=app%20in%20(", 400).await;
    assert!(selector["message"].as_str().unwrap().contains("unable to parse requirement"), "{selector}");
    assert_status(&get_json(&server, "/api/v1/services", 404).await, 404, "NotFound");
    let future = server.resource_version().0 + 5;
    for query in [format!("watch=1&resourceVersion={future}"), format!("resourceVersion={future}")] {
        let status = get_json(&server, &format!("/api/v1/pods?{query}"), 504).await;
        assert_status(&status, 504, "Timeout");
    }
    let post = reqwest::Client::new().post(format!("{}/api/v1/pods", server.url())).send();
    let post = tokio::time::timeout(DEADLINE, post).await.unwrap().unwrap();
    assert_eq!(post.status(), 405);
    assert_status(&post.json().await.unwrap(), 405, "MethodNotAllowed");

    // An exact list at an older version, while the history lasts.
    let rv = server.upsert_pod(Pod::new("ns", "a"));
    server.delete_pod("ns", "a");
    let then = get_json(&server, &format!("/api/v1/pods?resourceVersion={rv}&resourceVersionMatch=Exact"), 200).await;
    assert_eq!(
        (names(&then), then["metadata"]["resourceVersion"].as_str()),
        (vec!["a".to_owned()], Some(&*rv.to_string()))
    );
    assert_eq!(names(&get_json(&server, &format!("/api/v1/pods?resourceVersion={rv}"), 200).await).len(), 0);
    server.compact();
    let gone = get_json(&server, &format!("/api/v1/pods?resourceVersion={rv}&resourceVersionMatch=Exact"), 410).await;
    assert_status(&gone, 410, "Expired");
}

#[tokio::test]
async fn https_with_the_servers_ca() {
    let config = MockApiConfig { tls: true, token: Some("t0ken".into()), ..MockApiConfig::default() };
    let server = spawn(config).await;
    assert!(server.url().starts_with("https://127.0.0.1:"));
    let ca = server.ca_pem().expect("a CA with TLS on").to_owned();
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"));
    server.upsert_pod(Pod::running("ns", "a", "10.0.0.1"));

    let trusting = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca.as_bytes()).unwrap()])
        .default_headers([(reqwest::header::AUTHORIZATION, "Bearer t0ken".parse().unwrap())].into_iter().collect())
        .build()
        .unwrap();
    let port = server.addr().port();
    for base in [server.url(), format!("https://localhost:{port}")] {
        let list = get(&trusting, format!("{base}/api/v1/pods")).await;
        assert_eq!(list.status(), 200, "{base}");
        assert_eq!(names(&list.json().await.unwrap()), ["a"]);
    }
    let mut w = watch_with(&trusting, &server.url(), "/api/v1/pods?watch=1").await;
    assert_eq!(summary(&w.event().await).1, "a");
    server.delete_pod("ns", "a");
    assert_eq!(summary(&w.event().await).0, "DELETED");

    // Without the CA the certificate is not trusted; plain HTTP gets nowhere.
    let stranger = reqwest::Client::builder().tls_certs_only([]).build().unwrap();
    let refused = stranger.get(format!("{}/api/v1/pods", server.url())).send();
    assert!(tokio::time::timeout(DEADLINE, refused).await.unwrap().is_err());
    let plain = reqwest::Client::new().get(format!("http://127.0.0.1:{port}/api/v1/pods")).send();
    let plain = tokio::time::timeout(DEADLINE, plain).await.unwrap();
    assert!(plain.is_err() || plain.is_ok_and(|r| r.status() == 400), "no API over plain HTTP");

    let kubeconfig = server.kubeconfig("ns");
    assert!(kubeconfig.contains(&format!("    server: {}\n", server.url())), "{kubeconfig}");
    assert!(kubeconfig.contains(&format!("    certificate-authority-data: {}\n", base64_encode(ca.as_bytes()))));
    assert!(kubeconfig.contains("    token: t0ken\n") && kubeconfig.contains("    namespace: ns\n"));
}

#[tokio::test]
async fn a_kubeconfig_without_tls_or_token() {
    let server = spawn(MockApiConfig::default()).await;
    assert!(server.ca_pem().is_none());
    let kubeconfig = server.kubeconfig("default");
    assert!(!kubeconfig.contains("certificate-authority-data"));
    assert!(kubeconfig.contains("  user: {}\n") && kubeconfig.contains(&format!("server: {}", server.url())));
}
