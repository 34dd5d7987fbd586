//! The Kubernetes API server as discovery talks to it: found as kubectl
//! finds it (`KUBECONFIG`, then `~/.kube/config`, then the pod's service
//! account), authenticated by a bearer token (re-read from its file before
//! every list and watch: service-account tokens rotate) or a client
//! certificate, over TLS with the cluster's CA. It lists pods by label
//! selector in pages and watches them from a resource version with
//! bookmarks, reading the chunked stream of JSON events a line at a time
//! within size and idle bounds.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

use super::pod::{Pod, Status, WatchEvent};

/// Longest wait for a connection to the API server.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a list page may take.
pub const LIST_TIMEOUT: Duration = Duration::from_secs(30);
/// Pods asked per list page.
pub const LIST_PAGE: usize = 500;
/// Most pods one list returns in all (pages beyond are refused).
pub const MAX_LIST_PODS: usize = 20_000;
/// Largest list page body.
pub const MAX_PAGE_BYTES: usize = 64 * 1024 * 1024;
/// Largest single watch event (a pod is a few kilobytes).
pub const MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;
/// How long the server is asked to keep a watch open (it ends it then, cleanly).
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(290);
/// A watch silent this long past its timeout is dead (bookmarks come every minute or so).
pub const WATCH_IDLE_GRACE: Duration = Duration::from_secs(30);

const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Why the API server could not be used.
#[derive(Debug, thiserror::Error)]
pub enum K8sError {
    /// No usable configuration (kubeconfig or service account).
    #[error("kubernetes configuration: {0}")]
    Config(String),
    /// The request failed on the way (connection, TLS, timeout).
    #[error("kubernetes API request failed: {0}")]
    Http(String),
    /// The server answered with an error status.
    #[error("kubernetes API answered {code} {reason}: {message}")]
    Status {
        /// HTTP status (or the Status object's code).
        code: u16,
        /// The Status reason.
        reason: String,
        /// The server's message.
        message: String,
    },
    /// The answer could not be read (malformed, too large).
    #[error("kubernetes API answer unusable: {0}")]
    Decode(String),
}

/// A bearer token, fixed or read from a file each time.
#[derive(Debug, Clone)]
enum Token {
    None,
    Fixed(String),
    File(PathBuf),
}

/// The API server.
#[derive(Clone)]
pub struct ApiServer {
    base: String,
    client: reqwest::Client,
    token: Token,
}

/// One list's pods and the resource version to watch from.
#[derive(Debug, Clone, Default)]
pub struct PodList {
    /// The pods.
    pub pods: Vec<Pod>,
    /// The list's resource version.
    pub resource_version: String,
}

/// An open watch.
#[derive(Debug)]
pub struct Watch {
    pub(crate) response: reqwest::Response,
    pub(crate) buf: Vec<u8>,
    pub(crate) idle: Duration,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let token = match &self.token {
            Token::None => "none".to_owned(),
            Token::Fixed(_) => "fixed (hidden)".to_owned(),
            Token::File(p) => format!("file {}", p.display()),
        };
        f.debug_struct("ApiServer").field("base", &self.base).field("token", &token).finish()
    }
}

// === impl ApiServer ===

impl ApiServer {
    /// Finds the API server as kubectl does: the first file of `KUBECONFIG`,
    /// else `~/.kube/config` if it exists, else the service account of the
    /// pod this runs in.
    pub fn infer() -> Result<Self, K8sError> {
        if let Some(list) = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
            let first = std::env::split_paths(&list).find(|p| p.is_file());
            return match first {
                Some(path) => Self::from_kubeconfig(&path),
                None => Err(K8sError::Config(format!("KUBECONFIG={} names no readable file", list.to_string_lossy()))),
            };
        }
        if let Some(home) = std::env::var_os("HOME") {
            let path = Path::new(&home).join(".kube/config");
            if path.is_file() {
                return Self::from_kubeconfig(&path);
            }
        }
        Self::in_cluster()
    }

    /// The pod's own service account (`KUBERNETES_SERVICE_HOST`/`_PORT`, its token and CA).
    pub fn in_cluster() -> Result<Self, K8sError> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST").map_err(|_| {
            K8sError::Config(
                "no KUBECONFIG, no ~/.kube/config, and not in a pod (KUBERNETES_SERVICE_HOST unset)".into(),
            )
        })?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        let host = if host.contains(':') { format!("[{host}]") } else { host };
        let dir = Path::new(SERVICE_ACCOUNT);
        let ca = std::fs::read(dir.join("ca.crt"))
            .map_err(|e| K8sError::Config(format!("{SERVICE_ACCOUNT}/ca.crt: {e}")))?;
        Self::new(format!("https://{host}:{port}"), Some(&ca), None, Token::File(dir.join("token")))
    }

    /// The current context of a kubeconfig file.
    pub fn from_kubeconfig(path: &Path) -> Result<Self, K8sError> {
        let text = std::fs::read_to_string(path).map_err(|e| K8sError::Config(format!("{}: {e}", path.display())))?;
        let config: Kubeconfig =
            serde_norway::from_str(&text).map_err(|e| K8sError::Config(format!("{}: {e}", path.display())))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        config.resolve(dir).map_err(|e| K8sError::Config(format!("{}: {e}", path.display())))
    }

    fn new(
        base: String,
        ca_pem: Option<&[u8]>,
        identity: Option<(Vec<u8>, Vec<u8>)>,
        token: Token,
    ) -> Result<Self, K8sError> {
        let bad = |e: String| K8sError::Config(e);
        let mut roots = rustls::RootCertStore::empty();
        match ca_pem {
            Some(pem) => {
                let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
                    .collect::<Result<_, _>>()
                    .map_err(|e| bad(format!("cluster CA: {e}")))?;
                if certs.is_empty() {
                    return Err(bad("cluster CA: no PEM certificate".into()));
                }
                for c in certs {
                    roots.add(c).map_err(|e| bad(format!("cluster CA: {e}")))?;
                }
            }
            None => {
                roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            }
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        let mut tls = match identity {
            Some((cert, key)) => {
                let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert)
                    .collect::<Result<_, _>>()
                    .map_err(|e| bad(format!("client certificate: {e}")))?;
                let key = PrivateKeyDer::from_pem_slice(&key).map_err(|e| bad(format!("client key: {e}")))?;
                builder.with_client_auth_cert(chain, key).map_err(|e| bad(format!("client certificate: {e}")))?
            }
            None => builder.with_no_client_auth(),
        };
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| bad(format!("HTTP client: {e}")))?;
        Ok(Self { base: base.trim_end_matches('/').to_owned(), client, token })
    }

    /// A server at `base` with a fixed bearer token and the system's roots (tests, plain HTTP).
    pub fn with_token(base: &str, token: Option<&str>) -> Result<Self, K8sError> {
        Self::new(base.to_owned(), None, None, token.map_or(Token::None, |t| Token::Fixed(t.to_owned())))
    }

    /// The server's base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn pods_url(&self, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) => format!("{}/api/v1/namespaces/{}/pods", self.base, encode(ns)),
            None => format!("{}/api/v1/pods", self.base),
        }
    }

    fn request(&self, url: String) -> Result<reqwest::RequestBuilder, K8sError> {
        self.request_with(reqwest::Method::GET, url)
    }

    /// A request to `url` with the server's credentials.
    pub(crate) fn request_with(
        &self,
        method: reqwest::Method,
        url: String,
    ) -> Result<reqwest::RequestBuilder, K8sError> {
        let mut req = self.client.request(method, url).header(reqwest::header::ACCEPT, "application/json");
        let token = match &self.token {
            Token::None => None,
            Token::Fixed(t) => Some(t.clone()),
            Token::File(p) => Some(
                std::fs::read_to_string(p)
                    .map_err(|e| K8sError::Config(format!("token {}: {e}", p.display())))?
                    .trim()
                    .to_owned(),
            ),
        };
        if let Some(t) = token
            && let Some(v) = crate::bearer(&t)
        {
            req = req.header(reqwest::header::AUTHORIZATION, v);
        }
        Ok(req)
    }

    /// Every pod of `namespace` (all namespaces: `None`) matching `selector`, in pages.
    pub async fn list_pods(&self, namespace: Option<&str>, selector: &str) -> Result<PodList, K8sError> {
        #[derive(Deserialize)]
        struct ListMeta {
            #[serde(default, rename = "resourceVersion")]
            resource_version: String,
            #[serde(default, rename = "continue")]
            next: Option<String>,
        }
        #[derive(Deserialize)]
        struct Page {
            #[serde(default)]
            metadata: Option<ListMeta>,
            #[serde(default)]
            items: Vec<Pod>,
        }
        let mut out = PodList::default();
        let mut next: Option<String> = None;
        loop {
            let mut url = format!("{}?labelSelector={}&limit={LIST_PAGE}", self.pods_url(namespace), encode(selector));
            if let Some(token) = &next {
                url.push_str("&continue=");
                url.push_str(&encode(token));
            }
            let response =
                self.request(url)?.timeout(LIST_TIMEOUT).send().await.map_err(|e| K8sError::Http(e.to_string()))?;
            let body = read_body(response).await?;
            let page: Page = serde_json::from_slice(&body).map_err(|e| K8sError::Decode(format!("pod list: {e}")))?;
            out.pods.extend(page.items);
            if out.pods.len() > MAX_LIST_PODS {
                return Err(K8sError::Decode(format!("more than {MAX_LIST_PODS} pods match {selector:?}")));
            }
            let meta = page.metadata.unwrap_or(ListMeta { resource_version: String::new(), next: None });
            if out.resource_version.is_empty() {
                out.resource_version = meta.resource_version;
            }
            match meta.next.filter(|c| !c.is_empty()) {
                Some(c) => next = Some(c),
                None => return Ok(out),
            }
        }
    }

    /// Watches the pods of `namespace` matching `selector` after `resource_version`, with bookmarks.
    pub async fn watch_pods(
        &self,
        namespace: Option<&str>,
        selector: &str,
        resource_version: &str,
    ) -> Result<Watch, K8sError> {
        let url = format!(
            "{}?labelSelector={}&watch=1&allowWatchBookmarks=true&resourceVersion={}&timeoutSeconds={}",
            self.pods_url(namespace),
            encode(selector),
            encode(resource_version),
            WATCH_TIMEOUT.as_secs()
        );
        let response = self.request(url)?.send().await.map_err(|e| K8sError::Http(e.to_string()))?;
        if !response.status().is_success() {
            return Err(status_error(response).await);
        }
        Ok(Watch { response, buf: Vec::new(), idle: WATCH_TIMEOUT + WATCH_IDLE_GRACE })
    }
}

// === impl Watch ===

impl Watch {
    /// The next event; `None` when the server ended the stream.
    pub async fn next(&mut self) -> Result<Option<WatchEvent>, K8sError> {
        match self.next_line().await? {
            Some(line) => WatchEvent::parse(&line).map(Some).map_err(K8sError::Decode),
            None => Ok(None),
        }
    }

    /// The next event's line (a JSON object, unparsed); `None` when the server ended the stream.
    pub async fn next_line(&mut self) -> Result<Option<Vec<u8>>, K8sError> {
        loop {
            if let Some(end) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                let line = line.trim_ascii();
                if line.is_empty() {
                    continue;
                }
                return Ok(Some(line.to_vec()));
            }
            let chunk = match tokio::time::timeout(self.idle, self.response.chunk()).await {
                Err(_) => return Err(K8sError::Http(format!("watch silent for {:?}", self.idle))),
                Ok(Err(e)) => return Err(K8sError::Http(format!("watch stream: {e}"))),
                Ok(Ok(None)) => {
                    let rest = std::mem::take(&mut self.buf);
                    let rest = rest.trim_ascii();
                    return Ok((!rest.is_empty()).then(|| rest.to_vec()));
                }
                Ok(Ok(Some(c))) => c,
            };
            if self.buf.len() + chunk.len() > MAX_EVENT_BYTES {
                return Err(K8sError::Decode(format!("watch event over {MAX_EVENT_BYTES} bytes")));
            }
            self.buf.extend_from_slice(&chunk);
        }
    }
}

pub(crate) async fn read_body(response: reqwest::Response) -> Result<Vec<u8>, K8sError> {
    if !response.status().is_success() {
        return Err(status_error(response).await);
    }
    let mut response = response;
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| K8sError::Http(e.to_string()))? {
        if body.len() + chunk.len() > MAX_PAGE_BYTES {
            return Err(K8sError::Decode(format!("list page over {MAX_PAGE_BYTES} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The error of a non-2xx answer, from its `Status` body when it has one.
pub(crate) async fn status_error(response: reqwest::Response) -> K8sError {
    let code = response.status().as_u16();
    let body = crate::read_capped(response).await.unwrap_or_default();
    let status: Status = serde_json::from_slice(&body).unwrap_or_default();
    K8sError::Status {
        code,
        reason: if status.reason.is_empty() { "unknown".into() } else { status.reason },
        message: status.message,
    }
}

/// Percent-encodes a query value (everything but RFC 3986 unreserved characters).
pub(crate) fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The kubeconfig fields read.
#[derive(Debug, Deserialize)]
struct Kubeconfig {
    #[serde(default, rename = "current-context")]
    current_context: String,
    #[serde(default)]
    clusters: Vec<Named<Cluster>>,
    #[serde(default)]
    users: Vec<Named<User>>,
    #[serde(default)]
    contexts: Vec<Named<Context>>,
}

#[derive(Debug, Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "cluster", alias = "user", alias = "context")]
    value: T,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Cluster {
    server: String,
    #[serde(default)]
    certificate_authority: Option<PathBuf>,
    #[serde(default)]
    certificate_authority_data: Option<String>,
    #[serde(default)]
    insecure_skip_tls_verify: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct User {
    #[serde(default)]
    token: Option<String>,
    #[serde(default, rename = "tokenFile")]
    token_file: Option<PathBuf>,
    #[serde(default)]
    client_certificate: Option<PathBuf>,
    #[serde(default)]
    client_certificate_data: Option<String>,
    #[serde(default)]
    client_key: Option<PathBuf>,
    #[serde(default)]
    client_key_data: Option<String>,
    #[serde(default)]
    exec: Option<serde_norway::Value>,
    #[serde(default, rename = "auth-provider")]
    auth_provider: Option<serde_norway::Value>,
}

#[derive(Debug, Deserialize)]
struct Context {
    cluster: String,
    #[serde(default)]
    user: String,
}

// === impl Kubeconfig ===

impl Kubeconfig {
    fn resolve(self, dir: &Path) -> Result<ApiServer, String> {
        let context = self
            .contexts
            .iter()
            .find(|c| c.name == self.current_context)
            .ok_or_else(|| format!("current-context {:?} is not among its contexts", self.current_context))?;
        let cluster = self
            .clusters
            .iter()
            .find(|c| c.name == context.value.cluster)
            .ok_or_else(|| format!("cluster {:?} of the current context is not defined", context.value.cluster))?;
        let user = self.users.iter().find(|u| u.name == context.value.user).map(|u| &u.value);
        let cluster = &cluster.value;
        if cluster.insecure_skip_tls_verify {
            return Err("insecure-skip-tls-verify is not supported: give the cluster's certificate-authority".into());
        }
        let file = |p: &Path| {
            let p = if p.is_absolute() { p.to_path_buf() } else { dir.join(p) };
            std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))
        };
        let data = |what: &str, s: &str| {
            base64::engine::general_purpose::STANDARD.decode(s.trim()).map_err(|e| format!("{what}: {e}"))
        };
        let ca = match (&cluster.certificate_authority_data, &cluster.certificate_authority) {
            (Some(d), _) => Some(data("certificate-authority-data", d)?),
            (None, Some(p)) => Some(file(p)?),
            (None, None) => None,
        };
        let default = User::default();
        let user = user.unwrap_or(&default);
        if user.exec.is_some() || user.auth_provider.is_some() {
            return Err(
                "exec and auth-provider credentials are not supported: use a token, tokenFile or client certificate"
                    .into(),
            );
        }
        let cert = match (&user.client_certificate_data, &user.client_certificate) {
            (Some(d), _) => Some(data("client-certificate-data", d)?),
            (None, Some(p)) => Some(file(p)?),
            (None, None) => None,
        };
        let key = match (&user.client_key_data, &user.client_key) {
            (Some(d), _) => Some(data("client-key-data", d)?),
            (None, Some(p)) => Some(file(p)?),
            (None, None) => None,
        };
        let identity = match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => return Err("a client certificate needs its key, and a key its certificate".into()),
        };
        let token = match (&user.token, &user.token_file) {
            (Some(t), _) => Token::Fixed(t.clone()),
            (None, Some(p)) => Token::File(if p.is_absolute() { p.clone() } else { dir.join(p) }),
            (None, None) => Token::None,
        };
        ApiServer::new(cluster.server.clone(), ca.as_deref(), identity, token).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(encode("app=sglang,role in (prefill)"), "app%3Dsglang%2Crole%20in%20%28prefill%29");
        assert_eq!(encode("a-b_c.d~"), "a-b_c.d~");
    }

    #[test]
    fn kubeconfig_current_context_is_resolved() {
        let dir = std::env::temp_dir().join(format!("sgl-kubeconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("token"), "s3cret\n").unwrap();
        let path = dir.join("config");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\ncurrent-context: b\n\
             clusters:\n- name: one\n  cluster:\n    server: http://127.0.0.1:1/\n\
             - name: two\n  cluster:\n    server: http://127.0.0.1:2\n\
             users:\n- name: u\n  user:\n    tokenFile: token\n\
             contexts:\n- name: a\n  context:\n    cluster: one\n    user: u\n- name: b\n  context:\n    cluster: two\n    user: u\n",
        )
        .unwrap();
        let api = ApiServer::from_kubeconfig(&path).unwrap();
        assert_eq!(api.base_url(), "http://127.0.0.1:2");
        assert!(matches!(&api.token, Token::File(p) if p == &dir.join("token")));
        std::fs::write(&path, "current-context: x\ncontexts: []\n").unwrap();
        let e = ApiServer::from_kubeconfig(&path).unwrap_err().to_string();
        assert!(e.contains("current-context \"x\""), "{e}");
        std::fs::write(
            &path,
            "current-context: a\nclusters:\n- name: c\n  cluster:\n    server: https://x\n    insecure-skip-tls-verify: true\ncontexts:\n- name: a\n  context:\n    cluster: c\n",
        )
        .unwrap();
        let e = ApiServer::from_kubeconfig(&path).unwrap_err().to_string();
        assert!(e.contains("insecure-skip-tls-verify"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
