//! WebSocket and other `Upgrade` requests are tunnelled only after the
//! upstream answers 101; a refused upgrade leaves an ordinary HTTP exchange.

use std::time::Duration;

use crate::common::*;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn websocket_echo_through_tollgate() {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&proxied(&up)).await;
    let url = format!("ws://{}/ws", proxy.addr());
    let (mut ws, resp) = tokio_tungstenite::connect_async(&url)
        .await
        .expect("upgrade through tollgate");
    assert_eq!(resp.status(), 101);
    for i in 0..10 {
        let text = format!("hello {i}");
        ws.send(Message::text(text.clone())).await.unwrap();
        let back = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(back.into_text().unwrap().as_str(), text);
    }
    ws.send(Message::binary(vec![0u8, 1, 2, 255]))
        .await
        .unwrap();
    let back = ws.next().await.unwrap().unwrap();
    assert_eq!(back.into_data().as_ref(), &[0u8, 1, 2, 255]);
    ws.close(None).await.unwrap();
}

async fn refused(status: u16) {
    let up = Upstream::spawn().await;
    let proxy = TestProxy::spawn(&proxied(&up)).await;
    let mut tcp = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let ask = format!(
        "GET /refuse-upgrade?status={status} HTTP/1.1\r\nhost: a\r\nconnection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    tcp.write_all(ask.as_bytes()).await.unwrap();
    let head = read_head(&mut tcp).await;
    assert!(head.starts_with(&format!("HTTP/1.1 {status}")), "{head}");
    assert!(head.contains("x-refused: 1"), "{head}");
    assert!(
        !head.to_ascii_lowercase().contains("upgrade: websocket"),
        "{head}"
    );

    // The connection is still plain HTTP: a second request is parsed and
    // answered, not tunnelled to the upstream as raw bytes.
    tcp.write_all(b"GET /after HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let next = read_head(&mut tcp).await;
    assert!(next.starts_with("HTTP/1.1 200"), "{next}");
    assert_eq!(up.hits(), 2);
}

/// Reads one response head and its content-length body.
async fn read_head(tcp: &mut tokio::net::TcpStream) -> String {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut byte))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            n,
            1,
            "connection closed mid-head: {}",
            String::from_utf8_lossy(&buf)
        );
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    tcp.read_exact(&mut body).await.unwrap();
    head
}

#[tokio::test]
async fn upgrade_refused_with_426_tunnels_nothing() {
    refused(426).await;
}

#[tokio::test]
async fn upgrade_answered_with_200_tunnels_nothing() {
    refused(200).await;
}

/// A tunnel is one request in the access log and the metrics, logged when
/// it closes, with its duration and the bytes it carried to the client.
#[tokio::test]
async fn a_tunnel_is_one_request_logged_when_it_closes() {
    let up = Upstream::spawn().await;
    let tg = crate::common::process::Running::forwarding_to(up.addr, true);
    let url = format!("ws://{}/ws", tg.addr);
    let (mut ws, resp) = tokio_tungstenite::connect_async(&url).await.unwrap();
    assert_eq!(resp.status(), 101);
    let text = "x".repeat(1000);
    for _ in 0..3 {
        ws.send(Message::text(text.clone())).await.unwrap();
        ws.next().await.unwrap().unwrap();
    }
    // Open for a while: the line comes when the tunnel closes, not at 101.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        tg.logs
            .lock()
            .unwrap()
            .iter()
            .all(|l| !l.contains("tollgate::access")),
        "logged before the tunnel closed"
    );
    ws.close(None).await.unwrap();
    drop(ws);
    let events = tg.access_events(1).await;
    let e = &events[0];
    assert_eq!(e["status"], 101, "{e}");
    assert_eq!(e["path"], "/ws", "{e}");
    assert!(e["duration_ms"].as_f64().unwrap() >= 600.0, "{e}");
    // Three echoed 1000-byte messages, framed.
    assert!(e["bytes"].as_u64().unwrap() >= 3000, "{e}");
    let metrics = tg.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tollgate_requests_total{")
                && l.contains("code=\"101\"")
                && l.ends_with(" 1")),
        "{metrics}"
    );
}

/// h2c is never tunnelled, even when a route lists it (`check` refuses
/// that config), and an h2c upgrade carries nothing past the limits: the
/// request is answered as HTTP/1.1 and counted once by the limit.
#[tokio::test]
async fn an_h2c_upgrade_is_served_as_plain_http1_and_counted_by_the_limits() {
    let up = Upstream::spawn().await;
    let refused = tollgate::Config::from_yaml(
        &format!(
            "listeners: [{{ bind: '127.0.0.1:0' }}]\nupstreams:\n  api: {{ targets: ['{}'] }}\nroutes:\n  - {{ match: {{ path_prefix: / }}, upstream: api, upgrades: [websocket, h2c] }}\n",
            up.addr
        ),
        &|_| None,
    );
    let Err(err) = refused else {
        panic!("a route listing h2c was accepted")
    };
    let err = err.to_string();
    assert!(
        err.contains("routes[0].upgrades[1]: h2c is never tunnelled"),
        "{err}"
    );

    let proxy = TestProxy::spawn(&config(&format!(
        "upstreams:\n  api: {{ targets: ['{}'] }}\nroutes:\n  - {{ match: {{ path_prefix: / }}, upstream: api, limits: [{{ name: two, algorithm: fixed_window, limit: 2, window: 1h, key: ip }}] }}\n",
        up.addr
    )))
    .await;
    let mut tcp = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    // The upgrade, then at once HTTP/2 requests, as an h2c client sends.
    let mut ask = b"GET / HTTP/1.1\r\nhost: a\r\nconnection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n".to_vec();
    ask.extend_from_slice(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    tcp.write_all(&ask).await.unwrap();
    let head = read_head(&mut tcp).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(!head.contains("101"), "{head}");
    assert!(head.contains("x-ratelimit-remaining: 1"), "{head}");
    assert_eq!(up.hits(), 1, "one request reached the upstream");
}
