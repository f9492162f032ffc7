//! An HTTP/2 upstream's body on its way to the client, frame by frame,
//! trailers included; a gRPC call the upstream does not end properly ends
//! with trailers that say why.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use hyper::body::Incoming;
use tokio::time::Sleep;

use super::{ResponseBodyError, Stall};
use crate::pipeline::response::grpc;

/// The next frame of an HTTP/2 upstream's body (see `Kind::Stream`).
pub(super) fn poll_stream(
    cx: &mut Context<'_>,
    inner: &mut Option<Incoming>,
    stall: &mut Stall,
    deadline: &mut Option<Pin<Box<Sleep>>>,
    grpc: bool,
) -> Poll<Option<Result<Frame<Bytes>, ResponseBodyError>>> {
    let Some(body) = inner.as_mut() else {
        return Poll::Ready(None);
    };
    if deadline
        .as_mut()
        .is_some_and(|d| d.as_mut().poll(cx).is_ready())
    {
        *inner = None;
        let trailers = grpc::trailers(grpc::Code::DeadlineExceeded, "the call's deadline passed");
        return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
    }
    let failed = match Pin::new(body).poll_frame(cx) {
        Poll::Ready(Some(Ok(frame))) => {
            stall.progressed();
            return Poll::Ready(Some(Ok(frame)));
        }
        Poll::Ready(None) => {
            *inner = None;
            return Poll::Ready(None);
        }
        Poll::Ready(Some(Err(e))) => ResponseBodyError::Stream(e),
        Poll::Pending if stall.expired(cx) => ResponseBodyError::IdleTimeout(stall.timeout),
        Poll::Pending => return Poll::Pending,
    };
    *inner = None;
    if !grpc {
        return Poll::Ready(Some(Err(failed)));
    }
    let code = match failed {
        ResponseBodyError::IdleTimeout(_) => grpc::Code::DeadlineExceeded,
        _ => grpc::Code::Unavailable,
    };
    Poll::Ready(Some(Ok(Frame::trailers(grpc::trailers(
        code,
        &failed.to_string(),
    )))))
}
