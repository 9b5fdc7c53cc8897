//! The hello: a connection's memfd mapped and checked, and whether its
//! process's memory may be read directly.

use super::cma::Cma;
use super::peer::Peer;
use peregrine_proto::shm::{self as wire, Hello, Mapping};
use peregrine_vos::ReplyArea;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// One mapped connection.
pub(super) struct Conn {
    pub(super) hello: Hello,
    pub(super) map: Mapping,
    /// The client's process, when the engine may read its memory directly.
    pub(super) cma: Option<Cma>,
}

impl Conn {
    /// Where a fetch's bytes may go: the response region from
    /// [`wire::BULK_PAGE_OFF`] on, if that is page-aligned in this mapping.
    pub(super) fn reply_area(&self) -> Option<ReplyArea> {
        let h = &self.hello;
        let len = h.resp_len.checked_sub(wire::BULK_PAGE_OFF)? as usize;
        let addr = self.map.addr(h.resp_off + wire::BULK_PAGE_OFF, len)?;
        addr.is_multiple_of(4096).then_some(ReplyArea { addr, len })
    }

    pub(super) fn word(&self, at: u64) -> &std::sync::atomic::AtomicU64 {
        // In bounds and aligned: Hello::decode checked the control block.
        self.map
            .word(self.hello.ctl_off + at)
            .expect("control word inside the checked control block")
    }
}

pub(super) fn handshake(
    sock: &UnixStream,
    peer: &Peer,
    hello_timeout: Duration,
) -> Result<Conn, String> {
    let pid = peer.pid;
    sock.set_read_timeout(Some(hello_timeout))
        .map_err(|e| e.to_string())?;
    let mut buf = [0u8; wire::HELLO_LEN];
    let (n, fds) = wire::recv_with_fds(sock.as_raw_fd(), &mut buf)
        .map_err(|e| format!("receive hello: {e}"))?;
    if n == 0 {
        return Err("closed before the hello".into());
    }
    if n != wire::HELLO_LEN {
        return Err(format!("short hello ({n} of {} bytes)", wire::HELLO_LEN));
    }
    let [fd]: [std::os::fd::OwnedFd; 1] = fds.try_into().map_err(|v: Vec<_>| {
        format!(
            "hello came with {} descriptors, expected one memfd",
            v.len()
        )
    })?;
    let hello = Hello::decode(&buf)?;
    wire::check_memfd(fd.as_raw_fd(), hello.total)?;
    let map = Mapping::map(fd.as_raw_fd(), hello.total).map_err(|e| e.to_string())?;
    drop(fd); // the mapping keeps the memory
    sock.set_read_timeout(None).map_err(|e| e.to_string())?;
    let cma = Cma::probe(peer, &hello)
        .map_err(|e| {
            if hello.probe == 0 {
                tracing::debug!("shm pid {pid}: no direct reads of its memory: {e}");
            } else {
                tracing::info!("shm pid {pid}: no direct reads of its memory: {e}");
            }
        })
        .ok();
    Ok(Conn { hello, map, cma })
}
