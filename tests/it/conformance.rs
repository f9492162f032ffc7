//! The conformance corpus (`tests/conformance/cases.yaml`): raw bytes on
//! both legs, each case with what the client must get (statuses, whether
//! the connection stays open) and the exact bytes the upstream must
//! receive. Every case runs against its own tollgate and its own raw
//! upstream, all at once. `CONFORMANCE_SHOW=1` prints what each case got
//! (for writing a new case: read it, then write down what is right).
//! `docs/conformance.md` describes every case; a test keeps the two in
//! step.

use crate::common::*;
use tokio::net::TcpStream;

#[path = "conformance_run.rs"]
pub mod run;

use run::{Case, Outcome, RawUpstream};

const CASES: &str = include_str!("../conformance/cases.yaml");

fn cases() -> Vec<Case> {
    run::parse(CASES)
}

/// The proxy every case runs against, forwarding to `up`.
fn proxy_config(up: std::net::SocketAddr) -> String {
    config(&format!(
        "upstreams:\n  api: {{ targets: ['{up}'], timeout: 5s }}\n\
         routes:\n\
         \x20 - {{ match: {{ path_prefix: /custom-upgrade }}, upstream: api, upgrades: [websocket, foo] }}\n\
         \x20 - {{ match: {{ path_prefix: /canned }}, respond: {{ status: 200, body: \"canned\\n\" }} }}\n\
         \x20 - {{ match: {{ path_prefix: / }}, upstream: api }}\n"
    ))
}

async fn run_case(case: &Case) -> Outcome {
    let up = RawUpstream::spawn(case.replies()).await;
    let proxy = TestProxy::spawn(&proxy_config(up.addr)).await;
    let tcp = TcpStream::connect(proxy.addr()).await.unwrap();
    let outcome = run::exchange(tcp, case, &up).await;
    drop(proxy);
    outcome
}

#[tokio::test]
async fn every_case_in_the_corpus_gets_its_expected_outcome() {
    let cases = cases();
    assert!(cases.len() >= 120, "the corpus has {} cases", cases.len());
    let outcomes =
        futures_util::future::join_all(cases.iter().map(|c| async move { run_case(c).await }))
            .await;
    let show = std::env::var_os("CONFORMANCE_SHOW").is_some();
    let mut wrong = Vec::new();
    for (case, got) in cases.iter().zip(&outcomes) {
        if show {
            println!("{}", run::show(case, got));
        }
        if let Err(why) = case.check(got) {
            wrong.push(format!(
                "{}: {why}\n  got: {}",
                case.id,
                run::show(case, got)
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases differ:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}

#[test]
fn the_corpus_covers_both_legs_and_every_case_is_documented() {
    let cases = cases();
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/conformance.md"))
        .expect("docs/conformance.md");
    let mut ids = std::collections::HashSet::new();
    for c in &cases {
        assert!(ids.insert(&c.id), "{} twice", c.id);
        assert!(
            doc.contains(&format!("`{}`", c.id)),
            "docs/conformance.md does not describe {}",
            c.id
        );
    }
    let upstream = cases.iter().filter(|c| c.leg == "upstream").count();
    assert!(upstream >= 30, "{upstream} upstream-leg cases");
    assert!(cases.len() - upstream >= 80, "client-leg cases");
}
