//! Any byte string, as a shared-memory hello, ack or remote-bulk list:
//! decoded or refused, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let _ = peregrine_engine::fuzz::shm_hello(bytes);
});
