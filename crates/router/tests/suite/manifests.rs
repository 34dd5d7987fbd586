//! The Kubernetes manifests of `deploy/epp` (the router as an InferencePool's endpoint
//! picker) agree with each other and with the router: its arguments are the router's, the
//! Service and the InferencePool name the port it serves the picker on, the pool's selector
//! and target port are the ones it discovers pods by, and its RBAC grants no more than it
//! reads. The same for `deploy/routing` (the routing config as a `RoutingConfig` resource)
//! and the resource's definition in `deploy/crds`. (`kubectl kustomize` is run on each by
//! `.ci/run`.)

use crate::common::app::repo;

use serde_norway::Value;

/// Every document of the manifests' files.
fn documents() -> Vec<Value> {
    documents_of("deploy/epp", &["rbac.yaml", "router.yaml", "inference-pool.yaml", "inference-objectives.yaml"])
}

/// Every document of `files` in `dir`.
fn documents_of(dir: &str, files: &[&str]) -> Vec<Value> {
    let mut docs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(repo(&format!("{dir}/{file}"))).unwrap();
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
    // The router takes these arguments: they parse, and it goes on to look for the API server
    // (none here), instead of refusing a flag.
    let args = run_with_no_api_server(container, "epp");
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
    // The pool whose pods the router discovers is this one, in the kustomization's namespace,
    // and its objectives are the pool's.
    let kustomization: Value =
        serde_norway::from_str(&std::fs::read_to_string(repo("deploy/epp/kustomization.yaml")).unwrap()).unwrap();
    assert_eq!(flag(&args, "--pool-name"), pool["metadata"]["name"].as_str());
    assert_eq!(flag(&args, "--pool-namespace"), kustomization["namespace"].as_str());
    let objectives = of_kind(&docs, "InferenceObjective");
    assert!(!objectives.is_empty());
    for o in objectives {
        assert_eq!(o["apiVersion"].as_str(), Some("inference.networking.x-k8s.io/v1alpha2"));
        assert_eq!(o["spec"]["poolRef"]["name"], pool["metadata"]["name"]);
    }
    // Least privilege: a namespaced Role reading pods and the Inference Extension's two kinds.
    assert!(of_kind(&docs, "ClusterRole").is_empty() && of_kind(&docs, "ClusterRoleBinding").is_empty());
    let role = of_kind(&docs, "Role")[0];
    let mut read = Vec::new();
    for rule in role["rules"].as_sequence().unwrap() {
        let list =
            |k: &str| -> Vec<&str> { rule[k].as_sequence().unwrap().iter().map(|v| v.as_str().unwrap()).collect() };
        assert_eq!(list("verbs"), ["get", "list", "watch"]);
        read.extend(list("apiGroups").into_iter().flat_map(|g| list("resources").into_iter().map(move |r| (g, r))));
    }
    read.sort();
    let want = [
        ("", "pods"),
        ("inference.networking.k8s.io", "inferencepools"),
        ("inference.networking.x-k8s.io", "inferenceobjectives"),
    ];
    assert_eq!(read, want);
    let sa = deployment["spec"]["template"]["spec"]["serviceAccountName"].clone();
    assert_eq!(of_kind(&docs, "RoleBinding")[0]["subjects"][0]["name"], sa);
    assert_eq!(of_kind(&docs, "ServiceAccount")[0]["metadata"]["name"], sa);
}

/// The router's arguments in a Deployment, and what it printed when run with them and no
/// API server: they must parse, and the router must go on to look for the API server.
fn run_with_no_api_server(container: &Value, name: &str) -> Vec<String> {
    let args: Vec<String> =
        container["args"].as_sequence().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect();
    let home = std::env::temp_dir().join(format!("sgl-router-manifests-{name}-{}", std::process::id()));
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
    args
}

#[test]
fn the_routing_config_resource_manifests_agree_with_each_other_and_with_the_router() {
    use sgl_router::routing_resource::{API_VERSION, KIND, PLURAL};
    // The definition serves the group, version, kind and plural the router reads, with a status.
    let crd = &documents_of("deploy/crds", &["routingconfig.yaml"])[0];
    let (group, version) = API_VERSION.split_once('/').unwrap();
    assert_eq!(crd["metadata"]["name"].as_str(), Some(format!("{PLURAL}.{group}").as_str()));
    assert_eq!((crd["spec"]["group"].as_str(), crd["spec"]["scope"].as_str()), (Some(group), Some("Namespaced")));
    assert_eq!(
        (crd["spec"]["names"]["kind"].as_str(), crd["spec"]["names"]["plural"].as_str()),
        (Some(KIND), Some(PLURAL))
    );
    let served = &crd["spec"]["versions"][0];
    assert_eq!((served["name"].as_str(), served["served"].as_bool()), (Some(version), Some(true)));
    assert!(served["subresources"]["status"].is_mapping(), "the router writes the status subresource");

    let docs = documents_of("deploy/routing", &["rbac.yaml", "router.yaml", "routing-config.yaml"]);
    let deployment = of_kind(&docs, "Deployment")[0];
    let args = run_with_no_api_server(&deployment["spec"]["template"]["spec"]["containers"][0], "routing");
    // The resource the router follows is the one shipped, in the kustomization's namespace.
    let resource = of_kind(&docs, KIND)[0];
    assert_eq!(resource["apiVersion"].as_str(), Some(API_VERSION));
    let kustomization: Value =
        serde_norway::from_str(&std::fs::read_to_string(repo("deploy/routing/kustomization.yaml")).unwrap()).unwrap();
    let named =
        format!("{}/{}", kustomization["namespace"].as_str().unwrap(), resource["metadata"]["name"].as_str().unwrap());
    assert_eq!(flag(&args, "--routing-config-resource"), Some(named.as_str()));
    // Its spec is a valid routing config (`sgl-router check-config`).
    let file = std::env::temp_dir().join(format!("sgl-router-manifest-spec-{}.yaml", std::process::id()));
    std::fs::write(&file, serde_norway::to_string(&resource["spec"]).unwrap()).unwrap();
    let check =
        std::process::Command::new(env!("CARGO_BIN_EXE_sgl-router")).arg("check-config").arg(&file).output().unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    // Least privilege: pods read; the resource read; only its status written; nothing cluster-wide.
    assert!(of_kind(&docs, "ClusterRole").is_empty() && of_kind(&docs, "ClusterRoleBinding").is_empty());
    let mut granted: Vec<(String, String)> = Vec::new();
    for rule in of_kind(&docs, "Role")[0]["rules"].as_sequence().unwrap() {
        let list = |k: &str| -> Vec<String> {
            rule[k].as_sequence().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect()
        };
        for resource in list("resources") {
            granted.extend(list("verbs").into_iter().map(|v| (resource.clone(), v)));
        }
    }
    granted.sort();
    let want = [
        ("pods", "get"),
        ("pods", "list"),
        ("pods", "watch"),
        ("routingconfigs", "get"),
        ("routingconfigs", "list"),
        ("routingconfigs", "watch"),
        ("routingconfigs/status", "patch"),
    ];
    assert_eq!(granted, want.map(|(r, v)| (r.to_owned(), v.to_owned())));
    let sa = deployment["spec"]["template"]["spec"]["serviceAccountName"].clone();
    assert_eq!(of_kind(&docs, "RoleBinding")[0]["subjects"][0]["name"], sa);
}
