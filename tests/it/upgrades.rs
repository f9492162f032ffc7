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
