//! Any byte string, as a data-plane request frame (either transport): frame
//! decode, message decode and the target's request checks yield a request or
//! an error, never a panic or an unbounded allocation.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let _ = peregrine_engine::fuzz::frame_request(bytes);
});
