#![no_main]

#[allow(dead_code)]
#[path = "../harness/src/lib.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::chat_template(data));
