//! `tollgate import-nginx` on a corpus of nginx configs that real
//! deployments look like (`tests/nginx/<case>/nginx.conf`): each imports
//! with the expected exit code, `tollgate check` accepts the result, and the
//! YAML is the reviewed one (`expected.yaml`); what cannot be translated is
//! named with its file and line.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

/// Every case and the exit code its import must give.
const CASES: [(&str, i32); 11] = [
    ("api-tier", 0),
    ("multi-zone", 0),
    ("delay", 0),
    ("limit-conn", 0),
    ("real-ip", 0),
    ("includes", 0),
    ("tls", 0),
    ("upstreams", 0),
    ("phases", 0),
    ("replay", 0),
    ("unsupported", 2),
];

fn corpus(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/nginx")
        .join(case)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The case in a temp dir (with certificates for the TLS case), imported.
struct Imported {
    dir: tempfile::TempDir,
    code: i32,
    stderr: String,
    yaml: String,
}

/// `tollgate import-nginx nginx.conf -o tollgate.yaml` run in `dir`.
fn import_in(dir: &Path) -> std::process::Output {
    Command::new(BIN)
        .args(["import-nginx", "nginx.conf", "-o", "tollgate.yaml"])
        .current_dir(dir)
        .output()
        .unwrap()
}

fn import(case: &str) -> Imported {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&corpus(case), dir.path());
    if case == "tls" {
        let ca = TestCa::new();
        std::fs::create_dir_all(dir.path().join("certs")).unwrap();
        for (file, name) in [("api", "api.example.com"), ("www", "www.example.com")] {
            let (cert, key) = ca.leaf(file, &[name]);
            std::fs::copy(cert, dir.path().join(format!("certs/{file}.pem"))).unwrap();
            std::fs::copy(key, dir.path().join(format!("certs/{file}.key"))).unwrap();
        }
    }
    imported(dir)
}

/// `nginx.conf` with `text` in a temp dir, imported.
fn import_text(text: &str) -> Imported {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("nginx.conf"), text).unwrap();
    imported(dir)
}

/// The `nginx.conf` in `dir`, imported.
fn imported(dir: tempfile::TempDir) -> Imported {
    let out = import_in(dir.path());
    let yaml = std::fs::read_to_string(dir.path().join("tollgate.yaml")).unwrap_or_default();
    Imported {
        code: out.status.code().unwrap_or(-1),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        yaml,
        dir,
    }
}

#[test]
fn every_corpus_config_imports_as_reviewed_and_passes_check() {
    let mut checked = 0;
    for (case, code) in CASES {
        let got = import(case);
        assert_eq!(got.code, code, "{case}: exit code; stderr:\n{}", got.stderr);
        let expected = std::fs::read_to_string(corpus(case).join("expected.yaml")).unwrap();
        assert_eq!(
            got.yaml, expected,
            "{case}: the YAML differs from tests/nginx/{case}/expected.yaml"
        );
        let check = Command::new(BIN)
            .args(["check", "--config", "tollgate.yaml"])
            .current_dir(got.dir.path())
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "{case}: tollgate check refuses the import:\n{}",
            String::from_utf8_lossy(&check.stderr)
        );
        checked += 1;
    }
    assert_eq!(checked, CASES.len());
    assert!(CASES.len() >= 8);
}

#[test]
fn what_cannot_be_translated_is_named_with_its_line_and_exits_2() {
    let got = import("unsupported");
    assert_eq!(got.code, 2, "{}", got.stderr);
    assert!(
        got.stderr.contains(
            "nginx.conf:8: NOT EQUIVALENT: key $user_key comes from a map/geo/set at nginx.conf:4"
        ),
        "{}",
        got.stderr
    );
    assert!(
        got.stderr
            .contains("nginx.conf:15: NOT EQUIVALENT: a regex location with limits"),
        "{}",
        got.stderr
    );
    // The YAML is still written, and says so where a reader looks: the
    // zone where the zones would be, the route that does not list it, and
    // everything at the end.
    assert!(got.yaml.contains("# NOT EQUIVALENT"), "{}", got.yaml);
    assert!(
        got.yaml
            .contains("# zone per_user (limit_req_zone at nginx.conf:8) is NOT translated"),
        "{}",
        got.yaml
    );
    assert!(
        got.yaml
            .contains("# zone per_user (limit_req at nginx.conf:12) is NOT applied"),
        "{}",
        got.yaml
    );
    // Harmless directives are listed too, without failing the import.
    let api = import("api-tier");
    assert!(
        api.stderr
            .contains("nginx.conf:20: not translated: proxy_set_header"),
        "{}",
        api.stderr
    );
}

#[test]
fn an_unreadable_config_exits_1_with_the_place() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("nginx.conf"),
        "http {\n  server {\n    listen 80\n  }\n}\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["import-nginx", "nginx.conf"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nginx.conf:4"), "{stderr}");
}

/// YAML 1.1 readers (PyYAML, Ansible, Go's yaml.v2 in many Helm tools)
/// read `127_0_0_1_9000` or `on` unquoted as a number or a boolean: every
/// upstream name an import writes stays a string to them, and every
/// route's upstream names one of them.
#[test]
fn imported_upstream_names_stay_strings_to_yaml_1_1_readers() {
    let python = "/usr/bin/python3";
    let has_yaml = Command::new(python)
        .args(["-c", "import yaml"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        has_yaml,
        "PyYAML is needed: apt-get install -y python3-yaml (scripts/test installs it)"
    );
    let got = import_text(
        "events {}
http {
    upstream on { server 127.0.0.1:9001; }
    upstream 1e3 { server 127.0.0.1:9002; }
    server {
        listen 8080;
        location /a/ { proxy_pass http://127.0.0.1:9000; }
        location /b/ { proxy_pass http://on; }
        location /c/ { proxy_pass http://1e3; }
    }
}
",
    );
    assert_eq!(got.code, 0, "{}", got.stderr);
    let mut files = vec![got.dir.path().join("tollgate.yaml")];
    for (case, _) in CASES {
        files.push(corpus(case).join("expected.yaml"));
    }
    for file in files {
        let script = "import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
ups = c.get('upstreams') or {}
bad = [repr(k) for k in ups if not isinstance(k, str)]
for r in c.get('routes') or []:
    u = r.get('upstream')
    if u is not None and (not isinstance(u, str) or u not in ups):
        bad.append('route ' + repr(u))
print(' '.join(sorted(map(str, ups))))
if bad:
    sys.exit('not strings: ' + ', '.join(bad))
";
        let read = Command::new(python)
            .args(["-c", script, file.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            read.status.success(),
            "{}: {}",
            file.display(),
            String::from_utf8_lossy(&read.stderr)
        );
        if file.starts_with(got.dir.path()) {
            let names = String::from_utf8_lossy(&read.stdout);
            assert_eq!(
                names.trim(),
                "upstream_127_0_0_1_9000 upstream_1e3 upstream_on",
                "{}",
                std::fs::read_to_string(&file).unwrap()
            );
        }
    }
}

/// An upstream rule the import cannot keep (a hash key it cannot read,
/// a per-server parameter or directive it does not know, locations that
/// retry differently into one upstream) changes which target serves a
/// request: each is named with its line, and the import exits 2.
#[test]
fn upstream_rules_that_cannot_be_kept_are_named_and_exit_2() {
    let got = import_text(
        "events {}
http {
    upstream app {
        hash $upstream_addr;
        server 10.0.0.1:80;
        server 10.0.0.2:80 drain;
        ntlm;
    }
    server {
        listen 8080;
        location /one/ { proxy_next_upstream error http_502; proxy_pass http://app; }
        location /two/ { proxy_pass http://app; }
    }
}
",
    );
    let stderr = &got.stderr;
    assert_eq!(got.code, 2, "{stderr}");
    for want in [
        "nginx.conf:4: NOT EQUIVALENT: upstream app: hash key \"$upstream_addr\": $upstream_addr is not a variable",
        "nginx.conf:6: NOT EQUIVALENT: upstream app: drain: not translated",
        "nginx.conf:7: NOT EQUIVALENT: upstream app: ntlm is not translated",
        "nginx.conf:12: NOT EQUIVALENT: location /two/: proxy_next_upstream differs",
    ] {
        assert!(stderr.contains(want), "missing {want:?} in:\n{stderr}");
    }
    // What could be kept is kept.
    assert!(got.yaml.contains("- http_502"), "{}", got.yaml);
}

/// `server name resolve` (nginx 1.27.3+) with the http level's
/// `resolver address valid=` and `resolver_timeout`: a target that
/// resolves, and its upstream's resolver; the config checks.
#[test]
fn resolved_servers_and_their_resolver_are_imported() {
    let got = import_text(
        "events {}
http {
    resolver 10.0.0.2:5353 10.0.0.3 valid=30s;
    resolver_timeout 2s;
    upstream app {
        zone app 64k;
        server backend.internal:8080 resolve max_fails=2;
        server 10.0.0.9:8080 backup;
    }
    server {
        listen 8080;
        location / { proxy_pass http://app; }
    }
}
",
    );
    let (stderr, yaml) = (&got.stderr, &got.yaml);
    assert_eq!(got.code, 0, "{stderr}");
    assert!(stderr.contains("resolver: 10.0.0.3 left out"), "{stderr}");
    for want in [
        "address: backend.internal:8080",
        "resolve: true",
        "address: 10.0.0.2:5353",
        "valid: 30s",
        "timeout: 2s",
    ] {
        assert!(yaml.contains(want), "missing {want:?} in:\n{yaml}");
    }
    let check = Command::new(BIN)
        .args(["check", "--config", "tollgate.yaml"])
        .current_dir(got.dir.path())
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

#[test]
fn nginx_plus_queue_becomes_the_upstreams_queue() {
    let got = import_text(
        "events {}
http {
    upstream api {
        server 127.0.0.1:9001 max_conns=20;
        queue 100 timeout=70;
    }
    upstream bare { server 127.0.0.1:9002 max_conns=5; queue 10; }
    server {
        listen 8080;
        location /a/ { proxy_pass http://api; }
        location /b/ { proxy_pass http://bare; }
    }
}
",
    );
    assert_eq!(got.code, 0, "{}", got.stderr);
    let yaml = &got.yaml;
    let config = tollgate::Config::from_yaml(yaml, &|_| None);
    let config = match config {
        Ok(c) => c,
        Err(e) => panic!("{e}\n{yaml}"),
    };
    let queue = |name: &str| {
        let u = config.upstreams.iter().find(|u| u.name == name).unwrap();
        let q = u.queue.as_ref().unwrap();
        (q.size, q.timeout.as_secs())
    };
    // nginx Plus's default timeout is 60 s.
    assert_eq!(queue("api"), (100, 70), "{yaml}");
    assert_eq!(queue("bare"), (10, 60), "{yaml}");
}
