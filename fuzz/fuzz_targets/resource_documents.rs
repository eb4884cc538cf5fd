//! Arbitrary text read as the resource documents people write (`plan`'s
//! inputs, the files `standalone` follows): decoding may refuse, but
//! nothing may panic, and every refusal names its document.
#![no_main]

use libfuzzer_sys::fuzz_target;
use norsk_auto_manager::cli::documents::{Kind, decode_file};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(errors) = decode_file(text, &Kind::ALL) {
        assert!(!errors.is_empty());
        for error in errors {
            assert!(error.document >= 1);
            assert!(!error.problems.is_empty());
        }
    }
});
