//! The head of an HTTP/1.x response as the upstream client reads it:
//! status, framing, whether the connection may be reused, and which of its
//! fields go on to the client. Parsed in place (`httparse`, slots the
//! caller owns); nothing is copied here.

use std::mem::MaybeUninit;

use http::{Method, StatusCode, Version};

use super::body::{framing, Fields, Framing, FramingError};
use super::is_hop_by_hop;

/// The most header fields an upstream response may have (as hyper).
pub const MAX_HEADERS: usize = 100;
/// The largest response head read; beyond it the response is refused.
pub const MAX_HEAD: usize = 64 << 10;

/// Where `parse_head` puts the fields it finds. Left uninitialised:
/// zeroing 100 slots would write 3.2 KB per response, more than the head
/// itself.
pub type Slots<'b> = [MaybeUninit<httparse::Header<'b>>; MAX_HEADERS];

pub fn slots<'b>() -> Slots<'b> {
    [const { MaybeUninit::uninit() }; MAX_HEADERS]
}

/// Why a response head cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadError {
    /// Past `MAX_HEAD` bytes.
    TooLarge,
    Syntax(httparse::Error),
    /// A status code outside 100 to 999.
    Status(u16),
    Framing(FramingError),
}

impl std::fmt::Display for HeadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeadError::TooLarge => write!(f, "response head over {MAX_HEAD} bytes"),
            HeadError::Syntax(e) => e.fmt(f),
            HeadError::Status(code) => write!(f, "status {code}"),
            HeadError::Framing(e) => e.fmt(f),
        }
    }
}

/// What the front of the read buffer holds.
pub enum Parsed<'h, 'b> {
    /// An interim (1xx) response other than 101, of this many bytes: skip
    /// it and parse again.
    Interim(usize),
    Final(Head<'h, 'b>),
}

/// A final response head (or a 101).
pub struct Head<'h, 'b> {
    /// Its length in bytes.
    pub len: usize,
    pub status: StatusCode,
    pub framing: Framing,
    /// Whether the connection may carry another request once this
    /// response's body is read (its framing and `Connection`).
    pub keep_alive: bool,
    headers: &'h [httparse::Header<'b>],
    facts: Fields<'b>,
    head_request: bool,
}

/// Where a field of the head goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// On to the client as it is.
    Pass,
    /// The `Content-Length` of an answer to HEAD: the length of a body it
    /// has not got, which the client's head must carry (the writer of
    /// every other length is the server that frames the body).
    HeadLength,
}

/// Parses the response head at the front of `read`. `None`: more bytes
/// are needed.
pub fn parse_head<'h, 'b>(
    read: &'b [u8],
    method: &Method,
    slots: &'h mut Slots<'b>,
) -> Result<Option<Parsed<'h, 'b>>, HeadError> {
    if read.is_empty() {
        return Ok(None);
    }
    let mut parsed = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut parsed,
        read,
        slots,
    ) {
        Ok(httparse::Status::Complete(len)) if len <= MAX_HEAD => len,
        Ok(httparse::Status::Complete(_)) => return Err(HeadError::TooLarge),
        Ok(httparse::Status::Partial) if read.len() > MAX_HEAD => return Err(HeadError::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(HeadError::Syntax(e)),
    };
    let code = parsed.code.unwrap_or(0);
    let status = StatusCode::from_u16(code).map_err(|_| HeadError::Status(code))?;
    if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
        return Ok(Some(Parsed::Interim(len)));
    }
    let version = match parsed.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    // What the framing rules read, and the names `Connection` lists.
    let mut facts = Fields::default();
    for h in parsed.headers.iter() {
        facts.note(h.name.as_bytes(), h.value);
    }
    let (framing, mut keep_alive) =
        framing(&facts, status, method, version).map_err(HeadError::Framing)?;
    keep_alive &= match version {
        Version::HTTP_10 => facts.keep_alive,
        _ => !facts.close,
    };
    Ok(Some(Parsed::Final(Head {
        len,
        status,
        framing,
        keep_alive,
        headers: parsed.headers,
        facts,
        head_request: method == Method::HEAD,
    })))
}

impl<'b> Head<'_, 'b> {
    /// The fields that go on, in order. Hop-by-hop fields and those
    /// `Connection` names stay behind, and so does `Content-Length` (the
    /// server writes the length of the body it sends; a transfer coding
    /// beside a length wins, and the length is a lie the client must not
    /// see, RFC 9112 section 6.3), but for a HEAD's answer. A 101's fields
    /// all go on, for the tunnel to pick from.
    pub fn fields(&self) -> impl Iterator<Item = (&'b [u8], &'b [u8], Field)> + '_ {
        let switching = self.status == StatusCode::SWITCHING_PROTOCOLS;
        self.headers.iter().filter_map(move |h| {
            let name = h.name.as_bytes();
            if switching {
                return Some((name, h.value, Field::Pass));
            }
            if is_hop_by_hop(name)
                || self
                    .facts
                    .named
                    .iter()
                    .any(|n| n.eq_ignore_ascii_case(name))
            {
                return None;
            }
            if name.eq_ignore_ascii_case(b"content-length") {
                let keep = self.head_request && self.facts.coding.is_none();
                return keep.then_some((name, h.value, Field::HeadLength));
            }
            Some((name, h.value, Field::Pass))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passed(head: &[u8], method: Method) -> (StatusCode, Framing, bool, Vec<(String, Field)>) {
        let mut slots = slots();
        let Some(Parsed::Final(h)) = parse_head(head, &method, &mut slots).unwrap() else {
            panic!("no final head in {head:?}");
        };
        let fields = h
            .fields()
            .map(|(n, v, f)| {
                let line = format!(
                    "{}: {}",
                    String::from_utf8_lossy(n),
                    String::from_utf8_lossy(v)
                );
                (line, f)
            })
            .collect();
        (h.status, h.framing, h.keep_alive, fields)
    }

    #[test]
    fn hop_by_hop_fields_and_the_ones_connection_names_stay_behind() {
        let (status, framing, keep, fields) = passed(
            b"HTTP/1.1 200 OK\r\nConnection: x-secret\r\nX-Secret: 1\r\nKeep-Alive: 5\r\nContent-Length: 2\r\nX-Kept: yes\r\n\r\nok",
            Method::GET,
        );
        assert_eq!(
            (status, framing, keep),
            (StatusCode::OK, Framing::Length(2), true)
        );
        assert_eq!(fields, [("X-Kept: yes".to_owned(), Field::Pass)]);
    }

    #[test]
    fn a_heads_answer_keeps_its_length_unless_a_coding_came_with_it() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n";
        let (_, framing, _, fields) = passed(head, Method::HEAD);
        assert_eq!(framing, Framing::Length(0));
        assert_eq!(
            fields,
            [("Content-Length: 99".to_owned(), Field::HeadLength)]
        );
        let head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 99\r\n\r\n";
        assert_eq!(passed(head, Method::HEAD).3, []);
    }

    #[test]
    fn a_101_passes_every_field_on_for_the_tunnel() {
        let head = b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n";
        let (status, _, _, fields) = passed(head, Method::GET);
        assert_eq!(status, StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(fields.len(), 2);
    }

    #[test]
    fn interim_answers_are_skipped_and_broken_heads_say_why() {
        let mut slots = super::slots();
        let read = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n";
        assert!(matches!(
            parse_head(read, &Method::GET, &mut slots),
            Ok(Some(Parsed::Interim(25)))
        ));
        let mut slots = super::slots();
        assert!(matches!(
            parse_head(b"HTTP/1.1 200 OK\r\n", &Method::GET, &mut slots),
            Ok(None)
        ));
        let mut slots = super::slots();
        let e = parse_head(b"HTTP/1.1 2000 OK\r\n\r\n", &Method::GET, &mut slots).err();
        assert_eq!(
            e.map(|e| e.to_string()),
            Some("invalid response status".to_owned())
        );
        let mut slots = super::slots();
        let e = parse_head(b"HTTP/1.1 099 Low\r\n\r\n", &Method::GET, &mut slots).err();
        assert_eq!(e, Some(HeadError::Status(99)));
        let mut slots = super::slots();
        let both = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
        let e = parse_head(both, &Method::GET, &mut slots).err();
        assert!(
            matches!(e, Some(HeadError::Framing(FramingError::Length(_)))),
            "{e:?}"
        );
    }
}
