//! The shared-memory protocol spoken by hand, for tests that play a client
//! the library would never be (shm_access.rs); as in shm.rs.
#![allow(dead_code)]

use peregrine::{Client, TransportKind};
use peregrine_proto::frame::{self, Header, Opcode, HEADER_LEN};
use peregrine_proto::shm::{self as wire, Hello, Mapping, REGION_LEN};
use peregrine_testcluster::Cluster;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub fn socket(c: &Cluster) -> PathBuf {
    c.dir.path().join("peregrine-rank0.sock")
}

pub fn wait_log(c: &Cluster, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.engines[0].log_text().contains(needle) {
        if Instant::now() > deadline {
            panic!("engine log lacks {needle:?}:\n{}", c.logs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A connection that speaks the protocol by hand.
pub struct Raw {
    pub s: UnixStream,
    pub map: Mapping,
    pub hello: Hello,
    pub wake: OwnedFd,
    pub page: OwnedFd,
    pub ack_flags: u64,
}

/// Connect and send a hello (with `fds`).
pub fn raw_hello(sock: &Path, hello: &Hello, fds: &[&OwnedFd]) -> UnixStream {
    let s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let fds: Vec<_> = fds.iter().map(|f| f.as_raw_fd()).collect();
    wire::send_with_fds(s.as_raw_fd(), &hello.encode(), &fds).unwrap();
    s
}

pub fn raw_connect(sock: &Path, target: u32) -> Raw {
    raw_connect_with(sock, Hello::standard(REGION_LEN, target))
}

/// The handshake of `hello` on a new connection.
pub fn raw_connect_with(sock: &Path, hello: Hello) -> Raw {
    let s = UnixStream::connect(sock).unwrap();
    raw_handshake(s, hello)
}

/// The handshake of `hello` on connection `s`.
pub fn raw_handshake(s: UnixStream, hello: Hello) -> Raw {
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let fd = wire::memfd_sealed("raw", hello.total).unwrap();
    wire::send_with_fds(s.as_raw_fd(), &hello.encode(), &[fd.as_raw_fd()]).unwrap();
    let mut ack = [0u8; wire::ACK_LEN];
    let (n, fds) = wire::recv_with_fds(s.as_raw_fd(), &mut ack).unwrap();
    assert_eq!(n, wire::ACK_LEN, "handshake refused");
    let (_, ack_flags) = wire::check_ack(&ack).unwrap();
    let [wake, page]: [OwnedFd; 2] = fds.try_into().unwrap();
    let map = Mapping::map(fd.as_raw_fd(), hello.total).unwrap();
    Raw {
        s,
        map,
        hello,
        wake,
        page,
        ack_flags,
    }
}

impl Raw {
    pub fn word(&self, at: u64) -> &AtomicU64 {
        self.map.word(self.hello.ctl_off + at).unwrap()
    }

    /// Put `bytes` in the request region.
    pub fn write(&self, bytes: &[u8]) {
        self.map.write(self.hello.req_off, bytes).unwrap();
    }

    /// Mark a request of `len` bytes pending and wake the target.
    pub fn post(&self, len: u64) {
        self.word(wire::REQ_LEN).store(len, Ordering::Relaxed);
        self.word(wire::RESP_STATE)
            .store(wire::RESP_WAITING, Ordering::Relaxed);
        self.word(wire::REQ_STATE)
            .store(wire::REQ_PENDING, Ordering::SeqCst);
        let one = 1u64.to_ne_bytes();
        // SAFETY: 8 bytes to the target's eventfd.
        assert_eq!(
            // SAFETY: 8 bytes from the live `one` to the target's eventfd, which `self` owns.
            unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) },
            8
        );
    }

    /// Whether the reply is there (without waiting).
    pub fn answered(&self) -> bool {
        self.word(wire::RESP_STATE).load(Ordering::SeqCst) == wire::RESP_DONE
    }

    /// The reply's length, or None if the engine closed the connection.
    pub fn reply(&self) -> Option<u64> {
        let st = self.word(wire::RESP_STATE);
        if st
            .compare_exchange(
                wire::RESP_WAITING,
                wire::RESP_SLEEPING,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
        {
            let mut db = [0u8; 8];
            match wire::recv_exact(self.s.as_raw_fd(), &mut db) {
                Ok(true) => {}
                Ok(false) => return None,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                Err(e) => panic!("waiting for a reply: {e}"),
            }
        }
        assert_eq!(st.load(Ordering::SeqCst), wire::RESP_DONE);
        Some(self.word(wire::RESP_LEN).load(Ordering::SeqCst))
    }

    pub fn ping(&self, id: u64) -> bool {
        let f = frame::encode_frame(Opcode::Ping, 0, id, &[], &[]).unwrap();
        self.write(&f);
        self.post(f.len() as u64);
        let Some(n) = self.reply() else {
            return false;
        };
        let buf = self.map.read_vec(self.hello.resp_off, n as usize).unwrap();
        let (f, _) = frame::decode_frame(&buf).unwrap();
        f.header.request_id == id && f.header.flags & frame::FLAG_RESPONSE != 0
    }

    /// The response frame's status and body of the reply to the request posted.
    pub fn response(&self) -> Option<(peregrine_proto::data::Response, Vec<u8>)> {
        let n = self.reply()?;
        let buf = self.map.read_vec(self.hello.resp_off, n as usize).unwrap();
        let h = Header::decode(buf[..HEADER_LEN].try_into().unwrap()).unwrap();
        let (b, m) = if h.flags & wire::FLAG_BULK_AT_PAGE != 0 {
            let b = wire::BULK_PAGE_OFF as usize;
            (b, b + h.bulk_len as usize)
        } else {
            (HEADER_LEN + h.msg_len as usize, HEADER_LEN)
        };
        let msg = &buf[m..m + h.msg_len as usize];
        let bulk = buf[b..b + h.bulk_len as usize].to_vec();
        Some((prost::Message::decode(msg).unwrap(), bulk))
    }

    /// Post the frame already in the request region; its answer.
    pub fn call(&self, len: u64) -> (peregrine_proto::data::Response, Vec<u8>) {
        self.post(len);
        self.response().expect("the engine answered")
    }

    /// Write `value` as array akey "a" of `dkey` from its place in this
    /// process's memory (a remote bulk); the status code of the answer, or
    /// None if the engine closed the connection.
    pub fn update_remote(
        &self,
        addr: &peregrine_proto::data::Address,
        dkey: &[u8],
        epoch: u64,
        value: &[u8],
    ) -> Option<i32> {
        let parts = [wire::RemotePart {
            addr: value.as_ptr() as u64,
            len: value.len() as u64,
        }];
        let list = wire::RemotePart::encode_all(&parts);
        let (f, _) = update_frame(addr, dkey, epoch, value, &list, wire::FLAG_BULK_REMOTE);
        self.write(&f);
        self.post(f.len() as u64);
        let (resp, _) = self.response()?;
        Some(resp.status.map_or(0, |s| s.code))
    }
}

/// The engine must close the connection: end of stream, not an answer or a hang.
pub fn expect_closed(s: &UnixStream, what: &str) {
    let mut b = [0u8; 64];
    match wire::recv_exact(s.as_raw_fd(), &mut b[..8]) {
        Ok(false) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("{what}: expected the connection closed, got {other:?}"),
    }
}

/// A frame that writes the whole of `value` (with its CRC) as array akey
/// "a" of `dkey` at `addr`, at `epoch`; `bulk` is its bulk section (the
/// value itself, or a list of remote parts with `flags`). Returns the frame
/// and the length of its message.
pub fn update_frame(
    addr: &peregrine_proto::data::Address,
    dkey: &[u8],
    epoch: u64,
    value: &[u8],
    bulk: &[u8],
    flags: u32,
) -> (Vec<u8>, usize) {
    use peregrine_proto::data::{self, ValueKind};
    let req = data::UpdateReq {
        addr: Some(addr.clone()),
        epoch,
        dkey: dkey.to_vec(),
        iods: vec![data::Iod {
            akey: b"a".to_vec(),
            kind: ValueKind::Array as i32,
            offset: 0,
            len: value.len() as u64,
            crc: peregrine_isal::crc32c(value),
            has_crc: true,
            ..Default::default()
        }],
        insert_only: false,
        sync: false,
        dtx: None,
        conditions: Vec::new(),
    };
    let msg = prost::Message::encode_to_vec(&req);
    let mut f = frame::encode_frame(Opcode::Update, 0, epoch, &msg, &[bulk]).unwrap();
    let mut h = Header::decode(f[..HEADER_LEN].try_into().unwrap()).unwrap();
    h.flags |= flags;
    f[..HEADER_LEN].copy_from_slice(&h.encode());
    (f, msg.len())
}

/// The address of object 0.77 of the cluster's container, on target 0.
pub fn object_address(c: &Cluster) -> peregrine_proto::data::Address {
    let client =
        Client::connect_with_transport(&c.mgmt_addr(), &c.security(), TransportKind::Tcp).unwrap();
    let pool = client.pool_connect("pool").unwrap();
    let cont = pool.cont_open("cont").unwrap();
    peregrine_proto::data::Address {
        pool: pool.uuid().as_bytes().to_vec(),
        cont: cont.uuid().as_bytes().to_vec(),
        oid: Some(peregrine_proto::data::ObjectId { hi: 0, lo: 77 }),
        shard: 0,
        target: 0,
        map_version: pool.map().version,
        handle: cont.handle().to_vec(),
    }
}

impl Raw {
    /// Fetch `len` bytes at `offset` of array akey "a" of `dkey`: the
    /// value's answer and the bytes, and whether they came in place.
    pub fn fetch(
        &self,
        addr: &peregrine_proto::data::Address,
        dkey: &[u8],
        offset: u64,
        len: u64,
    ) -> (peregrine_proto::data::FetchedValue, Vec<u8>) {
        use peregrine_proto::data::{self, ValueKind};
        let fetch = data::FetchReq {
            addr: Some(addr.clone()),
            epoch: u64::MAX,
            dkey: dkey.to_vec(),
            iods: vec![data::Iod {
                akey: b"a".to_vec(),
                kind: ValueKind::Array as i32,
                offset,
                len,
                ..Default::default()
            }],
        };
        let msg = prost::Message::encode_to_vec(&fetch);
        let f = frame::encode_frame(Opcode::Fetch, 0, 7, &msg, &[]).unwrap();
        self.write(&f);
        let (resp, bulk) = self.call(f.len() as u64);
        match resp.body {
            Some(data::response::Body::Fetch(mut got)) => (got.values.remove(0), bulk),
            // Refused whole: the status says why.
            _ => {
                let status = resp.status.map_or(-1, |s| s.code);
                (
                    data::FetchedValue {
                        status,
                        ..Default::default()
                    },
                    bulk,
                )
            }
        }
    }

    /// Whether the last reply's bulk was read straight into the region.
    pub fn last_in_place(&self) -> bool {
        let buf = self.map.read_vec(self.hello.resp_off, HEADER_LEN).unwrap();
        let h = Header::decode(buf[..].try_into().unwrap()).unwrap();
        h.flags & wire::FLAG_BULK_AT_PAGE != 0
    }
}
