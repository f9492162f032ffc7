//! The Helm chart (deploy/helm/tollgate), rendered by Helm itself with
//! several value sets (tests/chart/render.py: helm-python-sdk, Helm's Go
//! SDK without the binary), linted with `helm lint --strict`, and every
//! object validated against the Kubernetes 1.25 and 1.37 schemas
//! (kubernetes-validate, strict). Then what a user would trip on: the
//! config in the ConfigMap passes `tollgate check`, the pod runs it with
//! `--watch`, the probes, ports, Secrets, volumes, autoscaler and
//! ServiceMonitor point at things that exist, the pod is locked down.
//! scripts/test installs the tools in target/chart-venv.

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::common::process::BIN;
use crate::common::TestCa;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn chart() -> PathBuf {
    Path::new(ROOT).join("deploy/helm/tollgate")
}

/// The Python that has the chart tools: $TOLLGATE_CHART_PYTHON, else the
/// venv scripts/test makes.
fn chart_python() -> PathBuf {
    if let Some(p) = std::env::var_os("TOLLGATE_CHART_PYTHON") {
        return p.into();
    }
    let venv = Path::new(ROOT).join("target/chart-venv/bin/python");
    assert!(
        venv.exists(),
        "the chart tests need Helm's renderer and the Kubernetes schemas; run scripts/test, \
         or: python3 -m venv target/chart-venv && target/chart-venv/bin/pip install \
         helm-python-sdk==0.2.2 kubernetes-validate==1.37.0 PyYAML"
    );
    venv
}

struct Rendered {
    docs: Vec<Value>,
    notes: String,
}

/// Renders the chart as release `edge` in namespace `web`: the objects,
/// or Helm's error. Schema and lint findings fail the test here.
fn render(values: Value) -> Result<Rendered, String> {
    let out = Command::new(chart_python())
        .arg(Path::new(ROOT).join("tests/chart/render.py"))
        .arg(chart())
        .args(["edge", "web"])
        .arg(values.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "render.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    if let Some(error) = report["error"].as_str() {
        return Err(error.to_owned());
    }
    assert_eq!(report["invalid"], json!([]), "schema errors for {values}");
    assert_eq!(report["lint"], json!([]), "helm lint --strict for {values}");
    for kind in report["unvalidated"].as_array().unwrap() {
        assert_eq!(kind, "ServiceMonitor", "no schema for {kind}");
    }
    Ok(Rendered {
        docs: report["documents"].as_array().unwrap().clone(),
        notes: report["notes"].as_str().unwrap().to_owned(),
    })
}

impl Rendered {
    fn kinds(&self) -> Vec<&str> {
        let mut kinds: Vec<&str> = self
            .docs
            .iter()
            .map(|d| d["kind"].as_str().unwrap())
            .collect();
        kinds.sort();
        kinds
    }

    fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.docs
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
    }

    fn get(&self, kind: &str, name: &str) -> &Value {
        self.find(kind, name)
            .unwrap_or_else(|| panic!("no {kind}/{name} in {:?}", self.kinds()))
    }

    /// The tollgate config the ConfigMap holds.
    fn config(&self) -> (String, serde_yaml::Value) {
        let text = self.get("ConfigMap", "edge-tollgate")["data"]["tollgate.yaml"]
            .as_str()
            .unwrap()
            .to_owned();
        let parsed = serde_yaml::from_str(&text).unwrap();
        (text, parsed)
    }

    fn secret(&self, name: &str, key: &str) -> String {
        let data = self.get("Secret", name)["data"][key].as_str().unwrap();
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(data)
                .unwrap(),
        )
        .unwrap()
    }
}

fn pod(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]
}

fn container(workload: &Value) -> &Value {
    &pod(workload)["containers"][0]
}

fn port_of(bind: &serde_yaml::Value) -> u64 {
    bind.as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn named_port(container: &Value, name: &str) -> u64 {
    container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no container port {name}"))["containerPort"]
        .as_u64()
        .unwrap()
}

/// The env var `name` of the container, read from which Secret and key.
fn secret_env(container: &Value, name: &str) -> (String, String) {
    let var = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("no env {name}"));
    let key = &var["valueFrom"]["secretKeyRef"];
    (
        key["name"].as_str().unwrap().to_owned(),
        key["key"].as_str().unwrap().to_owned(),
    )
}

/// `tollgate check` on the rendered config, with the pod's environment
/// and the TLS Secrets' mount paths pointing at certificates made here.
fn check(config: &str, env: &[(&str, &str)]) -> (bool, String) {
    let ca = TestCa::new();
    let mut text = config.to_owned();
    let secrets: std::collections::BTreeSet<&str> = config
        .split("/etc/tollgate/tls/")
        .skip(1)
        .filter_map(|rest| rest.split('/').next())
        .collect();
    for name in secrets {
        let (cert, key) = ca.leaf(name, &[&format!("{name}.example.com")]);
        text = text
            .replace(&format!("/etc/tollgate/tls/{name}/tls.crt"), &cert)
            .replace(&format!("/etc/tollgate/tls/{name}/tls.key"), &key);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.yaml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(BIN)
        .arg("check")
        .arg("--config")
        .arg(&path)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn seconds(duration: &serde_yaml::Value) -> u64 {
    duration
        .as_str()
        .unwrap()
        .trim_end_matches('s')
        .parse()
        .unwrap()
}

#[test]
fn the_default_values_render_a_config_tollgate_accepts_in_a_locked_down_pod() {
    let r = render(json!({})).unwrap();
    assert_eq!(
        r.kinds(),
        [
            "ConfigMap",
            "Deployment",
            "PodDisruptionBudget",
            "Secret",
            "Service",
            "ServiceAccount"
        ]
    );
    let deploy = r.get("Deployment", "edge-tollgate");
    assert_eq!(deploy["spec"]["replicas"], 2);
    let c = container(deploy);

    // The pod runs the ConfigMap's file, watching it (reload, not restart).
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        args,
        [
            "run",
            "--config",
            "/etc/tollgate/config/tollgate.yaml",
            "--watch"
        ]
    );
    let mounts = c["volumeMounts"].as_array().unwrap();
    let config_mount = mounts.iter().find(|m| m["name"] == "config").unwrap();
    assert_eq!(config_mount["mountPath"], "/etc/tollgate/config");
    let volumes = pod(deploy)["volumes"].as_array().unwrap();
    let config_volume = volumes.iter().find(|v| v["name"] == "config").unwrap();
    assert_eq!(config_volume["configMap"]["name"], "edge-tollgate");

    // The config is one tollgate accepts, with the admin token from the
    // chart's Secret; without the token it names the variable.
    let (text, config) = r.config();
    let (token_secret, token_key) = secret_env(c, "TOLLGATE_ADMIN_TOKEN");
    let token = r.secret(&token_secret, &token_key);
    assert_eq!(token.len(), 32, "a random 32-character token");
    let (ok, out) = check(&text, &[("TOLLGATE_ADMIN_TOKEN", &token)]);
    assert!(
        ok,
        "tollgate check refused the chart's config:\n{out}\n{text}"
    );
    let (ok, out) = check(&text, &[]);
    assert!(!ok && out.contains("TOLLGATE_ADMIN_TOKEN"), "{out}");

    // Ports: the container's are the config's, the probes hit the admin
    // listener, the Service reaches the pods by their labels.
    assert_eq!(
        named_port(c, "http"),
        port_of(&config["listeners"][0]["bind"])
    );
    assert_eq!(named_port(c, "admin"), port_of(&config["admin"]["bind"]));
    assert_eq!(
        c["livenessProbe"]["httpGet"],
        json!({"path": "/healthz", "port": "admin"})
    );
    assert_eq!(
        c["readinessProbe"]["httpGet"],
        json!({"path": "/readyz", "port": "admin"})
    );
    let service = r.get("Service", "edge-tollgate");
    let labels = &deploy["spec"]["template"]["metadata"]["labels"];
    for (k, v) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&labels[k], v, "the Service selects the pods by {k}");
    }
    let pdb = r.get("PodDisruptionBudget", "edge-tollgate");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        service["spec"]["selector"]
    );

    // The drain outlasts the endpoints' lag, and the pod's grace outlasts
    // the drain plus the in-flight grace.
    let drain = seconds(&config["server"]["drain_delay"]);
    let grace = seconds(&config["server"]["shutdown_grace"]);
    assert_eq!(drain, 5);
    assert!(
        pod(deploy)["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap()
            > drain + grace
    );
    assert_eq!(
        deploy["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
        0
    );

    // Locked down: the image's non-root user, a read-only root with a
    // writable /tmp only, no capabilities, no service-account token.
    let dockerfile = std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).unwrap();
    let uid = pod(deploy)["securityContext"]["runAsUser"]
        .as_u64()
        .unwrap();
    assert!(
        dockerfile.contains(&format!("--uid {uid} tollgate")),
        "uid {uid}"
    );
    assert_eq!(pod(deploy)["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        c["securityContext"],
        json!({"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
               "capabilities": {"drop": ["ALL"]}})
    );
    let writable: Vec<&Value> = mounts.iter().filter(|m| m["readOnly"] != true).collect();
    assert_eq!(writable.len(), 1, "{writable:?}");
    assert_eq!(writable[0]["mountPath"], "/tmp");
    assert_eq!(pod(deploy)["automountServiceAccountToken"], false);
    assert!(r.notes.contains("kubectl port-forward svc/edge-tollgate"));
}

#[test]
fn every_option_on_renders_objects_wired_to_each_other() {
    let r = render(json!({
        "tls": { "secrets": ["api-tls", "www-tls"] },
        "redis": { "url": "redis://tollgate:${REDIS_PASSWORD}@redis.web.svc:6379/0",
                   "existingSecret": "redis-auth" },
        "admin": { "existingSecret": "ops-tokens", "existingSecretKey": "tollgate" },
        "autoscaling": { "enabled": true, "maxReplicas": 6 },
        "serviceMonitor": { "enabled": true, "labels": { "release": "prom" } },
        "grafanaDashboard": { "enabled": true },
        "alertRules": { "enabled": true },
        "config": { "admin": { "protect_metrics": true }, "server": { "drain_delay": "10s" } },
    }))
    .unwrap();
    assert_eq!(
        r.kinds(),
        [
            "ConfigMap",
            "ConfigMap",
            "ConfigMap",
            "Deployment",
            "HorizontalPodAutoscaler",
            "PodDisruptionBudget",
            "Service",
            "ServiceAccount",
            "ServiceMonitor"
        ],
        "the admin token's Secret is the existing one, not the chart's"
    );
    let deploy = r.get("Deployment", "edge-tollgate");
    let c = container(deploy);
    assert_eq!(
        deploy["spec"].get("replicas"),
        None,
        "the autoscaler owns replicas"
    );
    let hpa = r.get("HorizontalPodAutoscaler", "edge-tollgate");
    assert_eq!(
        hpa["spec"]["scaleTargetRef"],
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "edge-tollgate"})
    );
    assert_eq!(hpa["spec"]["maxReplicas"], 6);

    // Secrets by reference: the admin token and the Redis password.
    assert_eq!(
        secret_env(c, "TOLLGATE_ADMIN_TOKEN"),
        ("ops-tokens".into(), "tollgate".into())
    );
    assert_eq!(
        secret_env(c, "REDIS_PASSWORD"),
        ("redis-auth".into(), "password".into())
    );
    let (text, config) = r.config();
    assert_eq!(config["store"]["kind"], "redis");
    assert!(config["store"]["url"]
        .as_str()
        .unwrap()
        .contains("${REDIS_PASSWORD}"));
    assert!(
        !text.contains("tollgate:secret"),
        "no password in the ConfigMap"
    );
    assert_eq!(config["admin"]["protect_metrics"], true);
    assert_eq!(config["server"]["drain_delay"], "10s");

    // TLS: a listener serving each Secret's pair, mounted where it reads.
    let https = &config["listeners"][1];
    assert_eq!(port_of(&https["bind"]), named_port(c, "https"));
    let mounts = c["volumeMounts"].as_array().unwrap();
    let volumes = pod(deploy)["volumes"].as_array().unwrap();
    for (i, name) in ["api-tls", "www-tls"].iter().enumerate() {
        let cert = https["tls"]["certs"][i]["cert"].as_str().unwrap();
        let mount = mounts
            .iter()
            .find(|m| cert.starts_with(m["mountPath"].as_str().unwrap()))
            .unwrap_or_else(|| panic!("{cert} is not under any mount"));
        let volume = volumes.iter().find(|v| v["name"] == mount["name"]).unwrap();
        assert_eq!(volume["secret"]["secretName"], *name);
        assert!(cert.ends_with("/tls.crt"));
    }
    let service = r.get("Service", "edge-tollgate");
    let service_ports: Vec<&str> = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(service_ports, ["http", "https", "admin"]);
    let env = [
        ("TOLLGATE_ADMIN_TOKEN", "a-token-of-sixteen-plus"),
        ("REDIS_PASSWORD", "secret"),
    ];
    let (ok, out) = check(&text, &env);
    assert!(
        ok,
        "tollgate check refused the chart's config:\n{out}\n{text}"
    );

    // The ServiceMonitor (no schema to validate against here): it selects
    // the Service, scrapes its admin port, with the token metrics need.
    let monitor = r.get("ServiceMonitor", "edge-tollgate");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prom");
    for (k, v) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&service["metadata"]["labels"][k], v);
    }
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], "admin");
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(
        endpoint["authorization"]["credentials"],
        json!({"name": "ops-tokens", "key": "tollgate"})
    );

    // The dashboard and the alert rules are contrib/'s, byte for byte.
    let dashboard = r.get("ConfigMap", "edge-tollgate-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let contrib =
        |p: &str| std::fs::read_to_string(Path::new(ROOT).join("contrib").join(p)).unwrap();
    assert_eq!(
        dashboard["data"]["tollgate.json"]
            .as_str()
            .unwrap()
            .trim_end(),
        contrib("grafana/tollgate.json").trim_end()
    );
    let rules = r.get("ConfigMap", "edge-tollgate-alert-rules");
    assert_eq!(
        rules["data"]["tollgate.rules.yml"]
            .as_str()
            .unwrap()
            .trim_end(),
        contrib("prometheus/tollgate.rules.yml").trim_end()
    );
}

#[test]
fn a_daemonset_has_no_replicas_nor_budget_and_bad_values_name_themselves() {
    let r = render(json!({ "kind": "DaemonSet" })).unwrap();
    assert!(r.find("Deployment", "edge-tollgate").is_none());
    assert!(r.find("PodDisruptionBudget", "edge-tollgate").is_none());
    let ds = r.get("DaemonSet", "edge-tollgate");
    assert_eq!(ds["spec"].get("replicas"), None);
    assert!(container(ds)["args"]
        .as_array()
        .unwrap()
        .contains(&json!("--watch")));

    // A fixed number of replicas sharing Redis: each falls back to its
    // share of the limit when Redis fails (store.replicas).
    let r = render(json!({ "replicaCount": 3, "redis": { "url": "redis://redis:6379" } })).unwrap();
    assert_eq!(r.config().1["store"]["replicas"], 3);

    for (values, names) in [
        (
            json!({"kind": "DaemonSet", "autoscaling": {"enabled": true}}),
            "autoscaling.enabled",
        ),
        (json!({"kind": "StatefulSet"}), "kind"),
        // A misspelt value is refused (values.schema.json), not ignored.
        (json!({"replicas": 3}), "'replicas' not allowed"),
        (json!({"replicaCount": "two"}), "/replicaCount"),
        (
            json!({"service": {"exposeAdmn": false}}),
            "'exposeAdmn' not allowed",
        ),
        (json!({"config": {"listeners": []}}), "config.listeners"),
        (
            json!({"config": {"admin": {"bind": "127.0.0.1:9"}}}),
            "config.admin.bind",
        ),
        (json!({"admin": {"token": "short"}}), "admin.token"),
        (
            json!({"redis": {"existingSecret": "r"}}),
            "redis.existingSecret",
        ),
        (
            json!({"serviceMonitor": {"enabled": true}, "service": {"exposeAdmin": false}}),
            "service.exposeAdmin",
        ),
    ] {
        let error = render(values.clone())
            .err()
            .unwrap_or_else(|| panic!("{values} rendered"));
        assert!(error.contains(names), "{values}: {error}");
    }
}

/// The chart's README names every value: each top-level key, and each key
/// under a top-level map that is not free-form.
#[test]
fn the_charts_readme_names_every_value() {
    const FREE_FORM: &[&str] = &[
        "config",
        "resources",
        "podSecurityContext",
        "securityContext",
        "podAnnotations",
        "podLabels",
        "nodeSelector",
        "affinity",
    ];
    let values: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart().join("values.yaml")).unwrap())
            .unwrap();
    let readme = std::fs::read_to_string(chart().join("README.md")).unwrap();
    let mut missing = Vec::new();
    for (key, value) in values.as_mapping().unwrap() {
        let key = key.as_str().unwrap();
        let mut paths = vec![key.to_owned()];
        if let (Some(map), false) = (value.as_mapping(), FREE_FORM.contains(&key)) {
            paths = map
                .keys()
                .map(|k| format!("{key}.{}", k.as_str().unwrap()))
                .collect();
        }
        missing.extend(
            paths
                .into_iter()
                .filter(|p| !readme.contains(&format!("`{p}`"))),
        );
    }
    assert!(missing.is_empty(), "README.md does not name {missing:?}");
}

/// The migration's last step: the values `tollgate import-ingress` writes
/// install with the chart, and the config the pods get passes
/// `tollgate check`, the TLS Secrets mounted where it reads them.
#[test]
fn values_from_import_ingress_render_with_the_chart() {
    for case in ["tls", "rps-and-rpm", "kubectl-list"] {
        let manifests = Path::new(ROOT)
            .join("tests/ingress")
            .join(case)
            .join("ingress.yaml");
        let out = Command::new(BIN)
            .arg("import-ingress")
            .arg(&manifests)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{case}");
        let values: serde_yaml::Value = serde_yaml::from_slice(&out.stdout).unwrap();
        let values: Value = serde_json::to_value(values).unwrap();
        let r = render(values.clone()).unwrap();
        let (text, config) = r.config();
        assert_eq!(
            config["routes"],
            serde_yaml::to_value(&values["config"]["routes"]).unwrap()
        );
        let token = r.secret("edge-tollgate-admin", "token");
        let (ok, out) = check(&text, &[("TOLLGATE_ADMIN_TOKEN", &token)]);
        assert!(ok, "{case}: tollgate check refused:\n{out}\n{text}");
        let mounts = container(r.get("Deployment", "edge-tollgate"))["volumeMounts"].clone();
        for secret in values["tls"]["secrets"].as_array().into_iter().flatten() {
            let at = format!("/etc/tollgate/tls/{}", secret.as_str().unwrap());
            assert!(text.contains(&format!("{at}/tls.crt")), "{case}: {text}");
            assert!(mounts
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["mountPath"] == at.as_str()));
        }
    }
}
