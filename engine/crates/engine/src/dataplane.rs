//! The data-plane server: framed requests over TCP, executed by the targets.
//! (The shared-memory transport in [`crate::shm`] shares the decoding and
//! dispatch below.)
//!
//! Requests on one connection may be pipelined; they run concurrently on
//! their targets and the replies go back in request order. A frame that
//! fails to decode (bad magic, version, header checksum, oversized or
//! truncated lengths, undecodable message) closes that one connection with a
//! logged reason; the engine and its other connections carry on.

use crate::node::Node;
use peregrine_proto::data::{self, Response as DataResponse, Status as DataStatus};
use peregrine_proto::frame::{self, Frame, FrameError, Opcode, FLAG_RESPONSE};
use peregrine_vos::{ReplyRef, Request};
use prost::Message;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// Requests in flight per connection before the reader stops reading.
const PIPELINE_DEPTH: usize = 64;

pub(crate) type Reply = (DataResponse, Vec<u8>);

pub async fn serve(node: Arc<Node>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((sock, peer)) => {
                let _ = sock.set_nodelay(true);
                tokio::spawn(connection(node.clone(), sock, peer));
            }
            Err(e) => {
                tracing::warn!("data plane accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

pub(crate) fn error_reply(code: i32, message: String) -> Reply {
    (
        DataResponse {
            status: Some(DataStatus { code, message }),
            body: None,
        },
        Vec::new(),
    )
}

/// Decode a request frame into a storage request, naming what is malformed.
/// `None` is a ping. Shared by the TCP and the shared-memory transports.
pub(crate) fn decode_request(f: Frame) -> Result<Option<Request>, FrameError> {
    Ok(Some(match f.header.op() {
        Opcode::Ping => return Ok(None),
        Opcode::Update => Request::Update(f.message::<data::UpdateReq>("update")?, f.bulk.into()),
        Opcode::Fetch => Request::Fetch(f.message::<data::FetchReq>("fetch")?),
        Opcode::Punch => Request::Punch(f.message::<data::PunchReq>("punch")?),
        Opcode::List => Request::List(f.message::<data::ListReq>("list")?),
        Opcode::QuerySize => Request::QuerySize(f.message::<data::QuerySizeReq>("query-size")?),
        Opcode::Flush => Request::Flush(f.message::<data::FlushReq>("flush")?),
        Opcode::ListChanged => {
            Request::ListChanged(f.message::<data::ListChangedReq>("list-changed")?)
        }
        Opcode::ListRecords => {
            Request::ListRecords(f.message::<data::ListRecordsReq>("list-records")?)
        }
        Opcode::DtxDecide => Request::DtxDecide(f.message::<data::DtxDecideReq>("dtx-decide")?),
        Opcode::DtxQuery => Request::DtxQuery(f.message::<data::DtxQueryReq>("dtx-query")?),
    }))
}

/// Hand a decoded request to its target (or answer a ping / maintenance mode
/// at once). `reply` gets the one reply: on the target's thread for a queued
/// request (so it must be quick and must not block), else on the caller's.
pub(crate) fn dispatch(
    node: &Node,
    req: Option<Request>,
    reply: impl FnOnce(Reply) + Send + 'static,
) {
    match (req, node.storage()) {
        (None, _) => reply(error_reply(0, String::new())),
        (Some(_), Err(st)) => reply(error_reply(-libc::EAGAIN, st.message().to_string())),
        (Some(req), Ok(storage)) => {
            let mut track = node.io.track(&req);
            match node.pool_maps.admit(&req) {
                Err((code, message)) => {
                    if let Some(t) = track {
                        t.refused(code);
                    }
                    reply(error_reply(code, message))
                }
                // Handed to the target while admitted: see `crate::poolmap`.
                Ok(_admitted) => {
                    if let Some(t) = &mut track {
                        t.queued();
                    }
                    storage.submit_with(req, move |r: ReplyRef<'_>| {
                        if let Some(t) = track {
                            t.answered(&r);
                        }
                        reply(match r {
                            Ok((resp, bulk)) => (resp, bulk.into_vec()),
                            Err(e) => error_reply(e.code, e.msg),
                        })
                    })
                }
            }
        }
    }
}

async fn connection(node: Arc<Node>, sock: TcpStream, peer: SocketAddr) {
    let (mut rd, mut wr) = sock.into_split();
    let (tx, mut rx) = mpsc::channel::<(frame::Header, oneshot::Receiver<Reply>)>(PIPELINE_DEPTH);

    let writer = tokio::spawn(async move {
        while let Some((h, pending)) = rx.recv().await {
            let (resp, bulk) = pending.await.unwrap_or_else(|_| {
                error_reply(-libc::EIO, "request dropped by its target".into())
            });
            let msg = resp.encode_to_vec();
            if let Err(e) = frame::write_frame_async(
                &mut wr,
                h.op(),
                FLAG_RESPONSE,
                h.request_id,
                &msg,
                &[&bulk],
            )
            .await
            {
                tracing::debug!("data plane {peer}: write reply: {e}");
                return;
            }
        }
    });

    loop {
        let f = match frame::read_frame_async(&mut rd).await {
            Ok(f) => f,
            Err(FrameError::Closed) => break,
            Err(e) => {
                tracing::warn!("data plane {peer}: closing connection: {e}");
                break;
            }
        };
        let header = f.header;
        let req = match decode_request(f) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("data plane {peer}: closing connection: {e}");
                break;
            }
        };
        let (done, pending) = oneshot::channel();
        // The target completes the oneshot itself: no thread parked per request.
        dispatch(&node, req, move |reply| {
            let _ = done.send(reply);
        });
        if tx.send((header, pending)).await.is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}
