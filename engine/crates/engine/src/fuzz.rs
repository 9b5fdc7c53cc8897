//! The entry points of the fuzz targets (`engine/fuzz`, cargo-fuzz on a
//! nightly toolchain) and of `tests/fuzz_corpus.rs`, which feeds them each
//! corpus file and seeded mutations on stable Rust in `cargo test`: whatever
//! the bytes, each returns a result (an error naming what is wrong), never
//! panics, never allocates more than the limits allow.

use peregrine_proto::frame::{decode_frame, Header, HEADER_LEN};
use peregrine_proto::mgmt::JoinReq;
use peregrine_proto::shm::{check_ack, Hello, RemotePart, ACK_LEN};
use prost::Message;

/// The system name the management-message target checks Joins against.
pub const FUZZ_SYSTEM: &str = "test";

/// A data-plane request as either transport takes it: frame decode, message
/// decode, conversion to the storage's terms, then the checks every target
/// makes before it plans anything ([`peregrine_vos::check_request`]).
/// `Ok(None)`: a ping.
pub fn frame_request(bytes: &[u8]) -> Result<Option<&'static str>, String> {
    if let Ok(hb) = <&[u8; HEADER_LEN]>::try_from(bytes.get(..HEADER_LEN).unwrap_or(&[])) {
        let _ = Header::decode(hb);
    }
    let (f, _) = decode_frame(bytes).map_err(|e| e.to_string())?;
    let op = f.header.op();
    let Some(req) = crate::dataplane::decode_request(f).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let req = req.into_vos().map_err(|e| e.to_string())?;
    peregrine_vos::check_request(&req).map_err(|e| e.to_string())?;
    Ok(Some(match op {
        peregrine_proto::frame::Opcode::Update => "update",
        peregrine_proto::frame::Opcode::Fetch => "fetch",
        _ => "other",
    }))
}

/// A management Join as the service takes it: protobuf decode, then
/// [`crate::ms::validate_join`] against [`FUZZ_SYSTEM`].
pub fn join(bytes: &[u8]) -> Result<(), String> {
    let j = JoinReq::decode(bytes).map_err(|e| e.to_string())?;
    crate::ms::validate_join(&j, FUZZ_SYSTEM).map_err(|e| e.message().to_string())
}

/// The shared-memory handshake: the client's hello, the engine's ack, and
/// the remote-bulk descriptors of an update.
pub fn shm_hello(bytes: &[u8]) -> Result<(), String> {
    let hello = Hello::decode(bytes);
    if let Ok(b) = <&[u8; ACK_LEN]>::try_from(bytes) {
        let _ = check_ack(b);
    }
    let _ = RemotePart::decode_all(bytes);
    hello.map(|_| ())
}
