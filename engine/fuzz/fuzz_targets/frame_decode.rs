//! Any byte string fed to the frame decoder and the message decoders must
//! yield a frame or an error, never a panic or an unbounded allocation.
#![no_main]
use libfuzzer_sys::fuzz_target;
use peregrine_proto::data;
use peregrine_proto::frame::{decode_frame, Opcode};

fuzz_target!(|bytes: &[u8]| {
    if let Ok((f, _)) = decode_frame(bytes) {
        let _ = match f.header.op() {
            Opcode::Update => f.message::<data::UpdateReq>("update").map(|_| ()),
            Opcode::Fetch => f.message::<data::FetchReq>("fetch").map(|_| ()),
            Opcode::Punch => f.message::<data::PunchReq>("punch").map(|_| ()),
            Opcode::List => f.message::<data::ListReq>("list").map(|_| ()),
            Opcode::QuerySize => f.message::<data::QuerySizeReq>("size").map(|_| ()),
            Opcode::Ping => Ok(()),
        };
    }
});
