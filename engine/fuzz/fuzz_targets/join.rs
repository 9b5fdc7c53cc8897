//! Any byte string, as a management Join: decoded and validated, or refused
//! naming the field, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let _ = peregrine_engine::fuzz::join(bytes);
});
