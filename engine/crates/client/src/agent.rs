//! The node agent (`peregrine-agent`, as DAOS's daos_agent): a process
//! without a certificate makes its management calls through the agent's
//! unix socket, and the agent, which holds the node's `client` certificate,
//! forwards them to the management service with the caller's credential
//! taken from the socket (SO_PEERCRED), never from the caller's words. The
//! service believes the credential because the agent's certificate vouches
//! for it (docs/access-control.md). The data plane is then the caller's
//! own: the handles the service returns are what the engines check.
//!
//! Frames, both ways: a little-endian u32 length, then the body. A request
//! body is a u8 name length, the call's name (`pool_connect`, ...) and the
//! request (protobuf); a reply body is an i32 (0, or a negative errno) and
//! the response (protobuf) or the error's message. Both lengths are checked
//! before anything is reserved for them.

use crate::error::{Error, Result};
use crate::mgmt::ControlSource;
use crate::shm::ShmConfig;
use crate::{Client, TransportKind};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where the agent listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/peregrine/agent.sock";
/// Environment variable the edges read for the agent's socket.
pub const ENV_SOCKET: &str = "PEREGRINE_AGENT_SOCKET";
/// Largest request body the agent reads (the four calls' requests are tiny).
pub const MAX_REQUEST: usize = 64 << 10;
/// Largest reply body a caller reads (a pool map of thousands of targets).
pub const MAX_REPLY: usize = 64 << 20;
/// The calls the agent forwards: those a `client` certificate may make
/// (engine/src/auth.rs). The rest need an administrator's certificate.
pub const FORWARDED: [&str; 4] = ["system_query", "pool_connect", "pool_query", "cont_query"];
/// How long a caller waits for one reply (pool connects create no shards:
/// the service answers in well under this).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

fn proto_err(what: impl std::fmt::Display) -> Error {
    Error::new(-libc::EPROTO, format!("agent protocol: {what}"))
}

/// A broken connection is ECONNRESET (the caller dials again); a reply
/// that does not come in time is ETIMEDOUT.
fn io_err(e: std::io::Error) -> Error {
    use std::io::ErrorKind::*;
    let code = match e.kind() {
        TimedOut | WouldBlock => libc::ETIMEDOUT,
        _ => libc::ECONNRESET,
    };
    Error::new(-code, format!("agent: {e}"))
}

fn read_frame(r: &mut impl Read, max: usize) -> Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(io_err)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(proto_err(format!("frame of {len} bytes (at most {max})")));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(io_err)?;
    Ok(body)
}

fn write_frame(w: &mut impl Write, parts: &[&[u8]]) -> Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let len = u32::try_from(len).map_err(|_| proto_err("frame over 4 GiB"))?;
    let mut buf = Vec::with_capacity(4 + len as usize);
    buf.extend_from_slice(&len.to_le_bytes());
    for p in parts {
        buf.extend_from_slice(p);
    }
    w.write_all(&buf).map_err(io_err)
}

/// Send one call.
pub fn write_request(w: &mut impl Write, rpc: &str, req: &[u8]) -> Result<()> {
    let name = u8::try_from(rpc.len()).map_err(|_| proto_err("call name over 255 bytes"))?;
    write_frame(w, &[&[name], rpc.as_bytes(), req])
}

/// Read one call: its name and request, bounded by [`MAX_REQUEST`].
pub fn read_request(r: &mut impl Read) -> Result<(String, Vec<u8>)> {
    let body = read_frame(r, MAX_REQUEST)?;
    let (&n, rest) = body
        .split_first()
        .ok_or_else(|| proto_err("empty request"))?;
    let n = n as usize;
    if rest.len() < n {
        return Err(proto_err("call name past the frame's end"));
    }
    let name = std::str::from_utf8(&rest[..n])
        .map_err(|_| proto_err("call name is not UTF-8"))?
        .to_string();
    Ok((name, rest[n..].to_vec()))
}

/// Answer one call: its response, or an error (negative errno and message).
pub fn write_reply(w: &mut impl Write, reply: &Result<Vec<u8>>) -> Result<()> {
    match reply {
        Ok(b) => write_frame(w, &[&0i32.to_le_bytes(), b]),
        Err(e) => {
            let code = if e.code < 0 { e.code } else { -libc::EIO };
            write_frame(w, &[&code.to_le_bytes(), e.msg.as_bytes()])
        }
    }
}

/// Read one answer, bounded by [`MAX_REPLY`].
pub fn read_reply(r: &mut impl Read) -> Result<Vec<u8>> {
    let body = read_frame(r, MAX_REPLY)?;
    if body.len() < 4 {
        return Err(proto_err("reply shorter than its status"));
    }
    let code = i32::from_le_bytes([body[0], body[1], body[2], body[3]]);
    match code {
        0 => Ok(body[4..].to_vec()),
        c if c < 0 => Err(Error::new(c, String::from_utf8_lossy(&body[4..]))),
        c => Err(proto_err(format!(
            "status {c} is not 0 or a negative errno"
        ))),
    }
}

/// Management calls through the agent's socket: one connection, one call
/// at a time, made again once if the agent dropped it (it restarted).
pub struct AgentSource {
    path: PathBuf,
    conn: Mutex<Option<UnixStream>>,
}

impl AgentSource {
    /// Connect now, so that a missing agent is said at once.
    pub fn connect(path: &Path) -> Result<AgentSource> {
        let s = Self::dial(path)?;
        Ok(AgentSource {
            path: path.to_path_buf(),
            conn: Mutex::new(Some(s)),
        })
    }

    fn dial(path: &Path) -> Result<UnixStream> {
        let s = UnixStream::connect(path).map_err(|e| {
            Error::new(
                -e.raw_os_error().unwrap_or(libc::ECONNREFUSED),
                format!("peregrine-agent at {}: {e}", path.display()),
            )
        })?;
        s.set_read_timeout(Some(CALL_TIMEOUT))
            .and_then(|()| s.set_write_timeout(Some(CALL_TIMEOUT)))
            .map_err(|e| Error::new(-libc::EIO, format!("agent socket: {e}")))?;
        Ok(s)
    }

    fn once(s: &mut UnixStream, rpc: &str, req: &[u8]) -> Result<Vec<u8>> {
        write_request(s, rpc, req)?;
        read_reply(s)
    }
}

impl ControlSource for AgentSource {
    fn call(&self, rpc: &str, req: Vec<u8>) -> Result<Vec<u8>> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        for attempt in 0..2 {
            let s = match conn.as_mut() {
                Some(s) => s,
                None => conn.insert(Self::dial(&self.path)?),
            };
            match Self::once(s, rpc, &req) {
                // The connection broke (the agent restarted): once more on a new one.
                Err(e) if e.code == -libc::ECONNRESET && attempt == 0 => *conn = None,
                Err(e) if [libc::ECONNRESET, libc::EPROTO, libc::ETIMEDOUT].contains(&-e.code) => {
                    *conn = None;
                    return Err(e);
                }
                r => return r,
            }
        }
        unreachable!("the loop returns on its second attempt")
    }
}

/// A client whose management calls go through the agent at `socket`: for
/// processes without a certificate (the agent names their user).
pub fn connect(socket: &Path, kind: TransportKind, shm: ShmConfig) -> Result<Client> {
    let source = Arc::new(AgentSource::connect(socket)?);
    let name = format!("peregrine-agent at {}", socket.display());
    Ok(Client::connect_via_with_shm(&name, source, kind, shm))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_are_bounded() {
        let mut b = Vec::new();
        write_request(&mut b, "pool_connect", b"xyz").unwrap();
        let (n, r) = read_request(&mut &b[..]).unwrap();
        assert_eq!((n.as_str(), &r[..]), ("pool_connect", &b"xyz"[..]));

        let mut b = Vec::new();
        write_reply(&mut b, &Err(Error::new(-libc::EACCES, "no"))).unwrap();
        let e = read_reply(&mut &b[..]).unwrap_err();
        assert_eq!((e.code, e.msg.as_str()), (-libc::EACCES, "no"));

        // A length past the cap is refused before anything is reserved.
        let huge = (MAX_REQUEST as u32 + 1).to_le_bytes();
        let e = read_request(&mut &huge[..]).unwrap_err();
        assert_eq!(e.code, -libc::EPROTO, "{e}");
        // A name longer than the frame, an empty frame, a positive status.
        for body in [&[9u8, b'a'][..], &[]] {
            let mut b = (body.len() as u32).to_le_bytes().to_vec();
            b.extend_from_slice(body);
            assert_eq!(read_request(&mut &b[..]).unwrap_err().code, -libc::EPROTO);
        }
        let mut b = 4u32.to_le_bytes().to_vec();
        b.extend_from_slice(&5i32.to_le_bytes());
        assert_eq!(read_reply(&mut &b[..]).unwrap_err().code, -libc::EPROTO);
    }
}
