//! The fast path's reading of request heads: what it serves, what it
//! hands to hyper and why, what it refuses itself.

use super::*;

const LIMITS: HeadLimits = (64 << 10, 100);

fn parsed(raw: &str) -> Parsed {
    parse(raw.as_bytes(), LIMITS, &mut Head::default())
}

fn head(raw: &str) -> Head {
    let mut h = Head::default();
    match parse(raw.as_bytes(), LIMITS, &mut h) {
        Parsed::Head => h,
        Parsed::Partial => panic!("partial: {raw:?}"),
        Parsed::Hyper(why) => panic!("handed to hyper ({why:?}): {raw:?}"),
        Parsed::Refuse(why) => panic!("refused ({why:?}): {raw:?}"),
    }
}

#[test]
fn simple_requests_stay_on_the_fast_path_with_their_keep_alive() {
    assert!(head("GET / HTTP/1.1\r\nHost: a\r\n\r\n").keep_alive);
    assert!(!head("GET / HTTP/1.1\r\nConnection: close\r\n\r\n").keep_alive);
    assert!(!head("GET / HTTP/1.0\r\n\r\n").keep_alive);
    assert!(head("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
    assert!(
        !head("GET / HTTP/1.0\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n").keep_alive,
        "close wins"
    );
    let post = head("POST /x HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
    assert_eq!(post.body, 5);
    assert_eq!(post.headers.len(), 1);
}

#[test]
fn anything_but_the_simple_case_goes_to_hyper() {
    use Handover::*;
    for (raw, why) in [
        (
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            Chunked,
        ),
        (
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
            Expect,
        ),
        (
            "GET / HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
            Upgrade,
        ),
        ("GET / HTTP/1.1\r\nUpgrade: h2c\r\n\r\n", Upgrade),
        (
            "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
            Head,
        ),
        ("POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello", Head),
        ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", Http2),
        ("GET / HTTP/1.1\r\nX-A: a\0b\r\n\r\n", Head),
        ("GET / HTTP/1.1\r\nHost : a\r\n\r\n", Head),
    ] {
        match parsed(raw) {
            Parsed::Hyper(got) => assert_eq!(got, why, "{raw:?}"),
            _ => panic!("kept on the fast path: {raw:?}"),
        }
    }
}

#[test]
fn heads_past_the_largest_taken_are_refused_here_not_by_hyper() {
    let many: String = (0..101).map(|i| format!("X-{i}: v\r\n")).collect();
    let raw = format!("GET / HTTP/1.1\r\n{many}\r\n");
    assert!(matches!(
        parse(raw.as_bytes(), LIMITS, &mut Head::default()),
        Parsed::Refuse(Refusal::TooMany(101))
    ));
    // Still arriving, and past the most already.
    assert!(matches!(
        parse(
            &raw.as_bytes()[..raw.len() - 2],
            LIMITS,
            &mut Head::default()
        ),
        Parsed::Refuse(Refusal::TooMany(101))
    ));
    // Past the fast path's 128 slots but within the limit: hyper's.
    let many: String = (0..150).map(|i| format!("X-{i}: v\n")).collect();
    let raw = format!("GET / HTTP/1.1\n{many}\n");
    assert!(matches!(
        parse(raw.as_bytes(), (64 << 10, 200), &mut Head::default()),
        Parsed::Hyper(Handover::Head)
    ));
    let raw = format!("GET / HTTP/1.1\r\nX-A: {}\r\n\r\n", "a".repeat(1000));
    assert!(matches!(
        parse(raw.as_bytes(), (512, 100), &mut Head::default()),
        Parsed::Refuse(Refusal::TooLarge(_))
    ));
    // Not complete and not yet too long: wait for more.
    assert!(matches!(
        parsed("GET / HTTP/1.1\r\nHost: a\r\n"),
        Parsed::Partial
    ));
    let partial = format!("GET / HTTP/1.1\r\nX-A: {}", "a".repeat(1000));
    assert!(matches!(
        parse(partial.as_bytes(), (512, 100), &mut Head::default()),
        Parsed::Refuse(Refusal::TooLarge(_))
    ));
}

#[test]
fn codings_other_than_a_lone_chunked_are_refused_and_lengths_read_by_the_one_rule() {
    for raw in [
        "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
    ] {
        assert!(
            matches!(parsed(raw), Parsed::Refuse(Refusal::Coding)),
            "{raw:?}"
        );
    }
    // Equal duplicates are one length; leading zeros are digits.
    let h = head("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello");
    assert_eq!(h.body, 5);
    let h = head("POST / HTTP/1.1\r\nContent-Length: 000000000000000000005\r\n\r\nhello");
    assert_eq!(h.body, 5);
}

#[test]
fn a_head_hyper_must_answer_is_put_back_whole() {
    // httparse takes this target; `Uri` refuses it, so hyper answers.
    let bad = "GET /<q> HTTP/1.1\r\nHost: a\r\n\r\nNEXT";
    let mut h = head(bad);
    let mut buf = BytesMut::from(bad.as_bytes());
    assert!(h.take(&mut buf).is_none());
    assert_eq!(&buf[..], bad.as_bytes(), "every byte back, in order");
    let mut buf = BytesMut::from("GET /x?y=1 HTTP/1.1\r\nHost: a\r\n\r\nGET /next".as_bytes());
    // The same `Head` parses the next request: nothing of the last stays.
    assert!(matches!(parse(&buf, LIMITS, &mut h), Parsed::Head));
    let (req, first, body_len) = h.take(&mut buf).unwrap();
    assert_eq!((first.len(), body_len), (0, 0), "no body");
    assert_eq!(req.uri(), "/x?y=1");
    assert_eq!(req.headers()["host"], "a");
    assert_eq!(
        &buf[..],
        b"GET /next",
        "the next request stays in the buffer"
    );
}
