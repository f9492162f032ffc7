//! PROXY protocol v1 (text) and v2 (binary), read before TLS and HTTP on
//! listeners with `proxy_protocol: true`. The listener only calls this for
//! peers in `client_ip.trusted_proxies`; anyone else is disconnected before
//! a byte is read, so a client cannot claim an address this way.
//!
//! The header is parsed from a small `BufReader`, which then stays the
//! connection's stream: bytes after the header are not lost, and large reads
//! bypass the buffer once it is drained.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};

const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// v1 headers are at most 107 bytes including CRLF.
const V1_MAX: usize = 107;
/// Larger v2 headers (big TLV sections) are refused.
const V2_MAX_PAYLOAD: usize = 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProxyHeaderError {
    #[error("connection closed before a PROXY header")]
    Closed,
    #[error("not a PROXY protocol header")]
    Missing,
    #[error("malformed PROXY header: {0}")]
    Malformed(&'static str),
}

/// Reads one PROXY header. `Ok(None)` for `LOCAL` / `UNKNOWN` (health checks
/// from the proxy itself): keep the socket's peer.
pub async fn read_header<R: AsyncRead + Unpin>(
    stream: &mut BufReader<R>,
) -> Result<Option<SocketAddr>, ProxyHeaderError> {
    let head = stream
        .fill_buf()
        .await
        .map_err(|_| ProxyHeaderError::Closed)?;
    if head.is_empty() {
        return Err(ProxyHeaderError::Closed);
    }
    if head.starts_with(b"PROXY ") || (head.len() < 6 && b"PROXY ".starts_with(head)) {
        return read_v1(stream).await;
    }
    if head.starts_with(&V2_SIGNATURE[..head.len().min(12)]) {
        return read_v2(stream).await;
    }
    Err(ProxyHeaderError::Missing)
}

async fn read_v1<R: AsyncRead + Unpin>(
    stream: &mut BufReader<R>,
) -> Result<Option<SocketAddr>, ProxyHeaderError> {
    let mut line = Vec::with_capacity(V1_MAX);
    let mut limited = (&mut *stream).take(V1_MAX as u64);
    limited
        .read_until(b'\n', &mut line)
        .await
        .map_err(|_| ProxyHeaderError::Closed)?;
    parse_v1(&line)
}

/// `PROXY TCP4 203.0.113.7 10.0.0.1 51234 443\r\n`
pub fn parse_v1(line: &[u8]) -> Result<Option<SocketAddr>, ProxyHeaderError> {
    let line = line
        .strip_suffix(b"\r\n")
        .ok_or(ProxyHeaderError::Malformed(
            "v1 line must end in CRLF within 107 bytes",
        ))?;
    let text = std::str::from_utf8(line)
        .map_err(|_| ProxyHeaderError::Malformed("v1 header is not ASCII"))?;
    let mut parts = text.split(' ');
    if parts.next() != Some("PROXY") {
        return Err(ProxyHeaderError::Missing);
    }
    let family = parts
        .next()
        .ok_or(ProxyHeaderError::Malformed("v1 family missing"))?;
    if family == "UNKNOWN" {
        return Ok(None);
    }
    let fields: Vec<&str> = parts.collect();
    let [src, _dst, sport, _dport] = fields[..] else {
        return Err(ProxyHeaderError::Malformed(
            "v1 needs source, destination and two ports",
        ));
    };
    let ip: IpAddr = match family {
        "TCP4" => IpAddr::V4(
            src.parse::<Ipv4Addr>()
                .map_err(|_| ProxyHeaderError::Malformed("bad v1 IPv4 source"))?,
        ),
        "TCP6" => IpAddr::V6(
            src.parse::<Ipv6Addr>()
                .map_err(|_| ProxyHeaderError::Malformed("bad v1 IPv6 source"))?,
        ),
        _ => {
            return Err(ProxyHeaderError::Malformed(
                "v1 family must be TCP4, TCP6 or UNKNOWN",
            ))
        }
    };
    let port: u16 = sport
        .parse()
        .map_err(|_| ProxyHeaderError::Malformed("bad v1 source port"))?;
    Ok(Some(SocketAddr::new(ip, port)))
}

async fn read_v2<R: AsyncRead + Unpin>(
    stream: &mut BufReader<R>,
) -> Result<Option<SocketAddr>, ProxyHeaderError> {
    let mut fixed = [0u8; 16];
    stream
        .read_exact(&mut fixed)
        .await
        .map_err(|_| ProxyHeaderError::Closed)?;
    let len = u16::from_be_bytes([fixed[14], fixed[15]]) as usize;
    if len > V2_MAX_PAYLOAD {
        return Err(ProxyHeaderError::Malformed("v2 header too long"));
    }
    let mut payload = vec![0u8; len];
    stream
        .read_exact(&mut payload)
        .await
        .map_err(|_| ProxyHeaderError::Closed)?;
    parse_v2(&fixed, &payload)
}

/// The 16-byte fixed part and the address payload of a v2 header.
pub fn parse_v2(fixed: &[u8; 16], payload: &[u8]) -> Result<Option<SocketAddr>, ProxyHeaderError> {
    if fixed[..12] != V2_SIGNATURE {
        return Err(ProxyHeaderError::Missing);
    }
    if fixed[12] >> 4 != 2 {
        return Err(ProxyHeaderError::Malformed("v2 version must be 2"));
    }
    match fixed[12] & 0x0f {
        0 => return Ok(None), // LOCAL
        1 => {}               // PROXY
        _ => {
            return Err(ProxyHeaderError::Malformed(
                "v2 command must be LOCAL or PROXY",
            ))
        }
    }
    match fixed[13] >> 4 {
        1 if payload.len() >= 12 => {
            let ip = Ipv4Addr::new(payload[0], payload[1], payload[2], payload[3]);
            Ok(Some(SocketAddr::new(
                IpAddr::V4(ip),
                u16::from_be_bytes([payload[8], payload[9]]),
            )))
        }
        2 if payload.len() >= 36 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&payload[..16]);
            let port = u16::from_be_bytes([payload[32], payload[33]]);
            Ok(Some(SocketAddr::new(
                IpAddr::V6(Ipv6Addr::from(octets)),
                port,
            )))
        }
        0 | 3 => Ok(None), // UNSPEC or UNIX: keep the socket peer
        1 | 2 => Err(ProxyHeaderError::Malformed("v2 address block too short")),
        _ => Err(ProxyHeaderError::Malformed("v2 address family unknown")),
    }
}

/// Builds a v2 header (for tests and tools).
pub fn encode_v2(src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let mut out = V2_SIGNATURE.to_vec();
    out.push(0x21);
    match (src, dst) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            out.push(0x11);
            out.extend_from_slice(&12u16.to_be_bytes());
            out.extend_from_slice(&s.ip().octets());
            out.extend_from_slice(&d.ip().octets());
            out.extend_from_slice(&s.port().to_be_bytes());
            out.extend_from_slice(&d.port().to_be_bytes());
        }
        (s, d) => {
            let v6 = |a: SocketAddr| match a.ip() {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            out.push(0x21);
            out.extend_from_slice(&36u16.to_be_bytes());
            out.extend_from_slice(&v6(s).octets());
            out.extend_from_slice(&v6(d).octets());
            out.extend_from_slice(&s.port().to_be_bytes());
            out.extend_from_slice(&d.port().to_be_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read(bytes: &[u8]) -> (Result<Option<SocketAddr>, ProxyHeaderError>, Vec<u8>) {
        let mut r = BufReader::new(bytes);
        let got = read_header(&mut r).await;
        let mut rest = Vec::new();
        let _ = r.read_to_end(&mut rest).await;
        (got, rest)
    }

    #[tokio::test]
    async fn v1_headers_give_the_source_and_keep_what_follows() {
        let (got, rest) =
            read(b"PROXY TCP4 203.0.113.7 10.0.0.1 51234 443\r\nGET / HTTP/1.1\r\n").await;
        assert_eq!(got, Ok(Some("203.0.113.7:51234".parse().unwrap())));
        assert_eq!(rest, b"GET / HTTP/1.1\r\n");
        let (got, _) = read(b"PROXY TCP6 2001:db8::7 2001:db8::1 4000 443\r\n").await;
        assert_eq!(got, Ok(Some("[2001:db8::7]:4000".parse().unwrap())));
        let (got, _) = read(b"PROXY UNKNOWN\r\n").await;
        assert_eq!(got, Ok(None));
    }

    #[tokio::test]
    async fn v2_headers_give_the_source_and_keep_what_follows() {
        let mut bytes = encode_v2(
            "198.51.100.9:4444".parse().unwrap(),
            "10.0.0.1:443".parse().unwrap(),
        );
        bytes.extend_from_slice(b"GET /");
        let (got, rest) = read(&bytes).await;
        assert_eq!(got, Ok(Some("198.51.100.9:4444".parse().unwrap())));
        assert_eq!(rest, b"GET /");
        let v6 = encode_v2(
            "[2001:db8::9]:1".parse().unwrap(),
            "[2001:db8::1]:2".parse().unwrap(),
        );
        assert_eq!(
            read(&v6).await.0,
            Ok(Some("[2001:db8::9]:1".parse().unwrap()))
        );
        let mut local = V2_SIGNATURE.to_vec();
        local.extend_from_slice(&[0x20, 0x00, 0, 0]);
        assert_eq!(read(&local).await.0, Ok(None));
    }

    #[tokio::test]
    async fn garbage_is_refused() {
        assert_eq!(
            read(b"GET / HTTP/1.1\r\n\r\n").await.0,
            Err(ProxyHeaderError::Missing)
        );
        assert!(matches!(
            read(b"PROXY TCP4 nope 10.0.0.1 1 2\r\n").await.0,
            Err(ProxyHeaderError::Malformed(_))
        ));
        assert!(matches!(
            read(b"PROXY TCP4 1.2.3.4 10.0.0.1 1 2").await.0,
            Err(ProxyHeaderError::Malformed(_))
        ));
        let long = format!("PROXY TCP4 {}\r\n", "1".repeat(200));
        assert!(matches!(
            read(long.as_bytes()).await.0,
            Err(ProxyHeaderError::Malformed(_))
        ));
        assert_eq!(read(b"").await.0, Err(ProxyHeaderError::Closed));
    }
}
