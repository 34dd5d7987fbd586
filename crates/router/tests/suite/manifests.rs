//! The Kubernetes manifests of `deploy/epp` (the router as an InferencePool's endpoint
//! picker) agree with each other and with the router: its arguments are the router's, the
//! Service and the InferencePool name the port it serves the picker on, the pool's selector
//! and target port are the ones it discovers pods by, and its RBAC grants no more than it
//! reads. (`kubectl kustomize deploy/epp` is run by `.ci/run`.)

use crate::common::app::repo;

use serde_norway::Value;

/// Every document of the manifests' files, by kind.
fn documents() -> Vec<Value> {
    let mut docs = Vec::new();
    for file in ["rbac.yaml", "router.yaml", "inference-pool.yaml"] {
        let text = std::fs::read_to_string(repo(&format!("deploy/epp/{file}"))).unwrap();
        for doc in serde_norway::Deserializer::from_str(&text) {
            docs.push(<Value as serde::Deserialize>::deserialize(doc).unwrap());
        }
    }
    docs
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"].as_str() == Some(kind)).collect()
}

/// The value of flag `name` in `args` (`--name=V` or `--name V`).
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let eq = format!("{name}=");
    args.iter().enumerate().find_map(|(i, a)| match a.strip_prefix(&eq) {
        Some(v) => Some(v),
        None if a == name => args.get(i + 1).map(String::as_str),
        None => None,
    })
}

#[test]
fn the_epp_manifests_agree_with_each_other_and_with_the_router() {
    let docs = documents();
    let deployment = of_kind(&docs, "Deployment")[0];
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<String> =
        container["args"].as_sequence().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect();
    // The router takes these arguments: they parse, and it goes on to look for the API server
    // (none here), instead of refusing a flag.
    let home = std::env::temp_dir().join(format!("sgl-router-manifests-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sgl-router"))
        .args(&args)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", &home)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&home);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(2), "the manifest's arguments are refused: {stderr}");
    assert!(stderr.contains("kubernetes configuration"), "it went on to find the API server: {stderr}");
    // The picker's port: the flag, the container port, the Service, the InferencePool.
    let epp_port: u64 = flag(&args, "--epp-port").unwrap().parse().unwrap();
    let ports = container["ports"].as_sequence().unwrap();
    let named = ports.iter().find(|p| p["containerPort"].as_u64() == Some(epp_port)).expect("a container port");
    let service = of_kind(&docs, "Service")[0];
    let service_port = service["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| p["targetPort"] == named["name"])
        .expect("the Service exposes the picker's port");
    assert_eq!(service["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"]);
    let pool = of_kind(&docs, "InferencePool")[0];
    assert_eq!(pool["apiVersion"].as_str(), Some("inference.networking.k8s.io/v1"));
    let picker = &pool["spec"]["endpointPickerRef"];
    assert_eq!(picker["name"], service["metadata"]["name"]);
    assert_eq!(picker["port"]["number"], service_port["port"]);
    // The readiness probe asks the picker's health service on its port.
    assert_eq!(container["readinessProbe"]["grpc"]["port"].as_u64(), Some(epp_port));
    // The pool's engines are the pods the router discovers.
    let (key, value) = flag(&args, "--selector").unwrap().split_once('=').unwrap();
    assert_eq!(pool["spec"]["selector"]["matchLabels"][key].as_str(), Some(value));
    let port = flag(&args, "--service-discovery-port").unwrap();
    assert_eq!(pool["spec"]["targetPorts"][0]["number"].as_u64().map(|n| n.to_string()).as_deref(), Some(port));
    // Least privilege: a namespaced Role reading pods, bound to the router's service account.
    assert!(of_kind(&docs, "ClusterRole").is_empty() && of_kind(&docs, "ClusterRoleBinding").is_empty());
    let role = of_kind(&docs, "Role")[0];
    for rule in role["rules"].as_sequence().unwrap() {
        let list =
            |k: &str| -> Vec<&str> { rule[k].as_sequence().unwrap().iter().map(|v| v.as_str().unwrap()).collect() };
        assert_eq!(list("resources"), ["pods"]);
        assert!(list("verbs").iter().all(|v| ["get", "list", "watch"].contains(v)), "{:?}", list("verbs"));
    }
    let sa = deployment["spec"]["template"]["spec"]["serviceAccountName"].clone();
    assert_eq!(of_kind(&docs, "RoleBinding")[0]["subjects"][0]["name"], sa);
    assert_eq!(of_kind(&docs, "ServiceAccount")[0]["metadata"]["name"], sa);
}
