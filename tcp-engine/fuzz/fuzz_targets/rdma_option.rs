//! The TCP RDMA option (draft-csapuntz-tcprdma-00) on arbitrary bytes: the checked view never
//! panics, whatever it accepts parses and re-emits to the very octets it was read from, and
//! checking the data it describes against any payload length never panics and stays inside
//! that payload.
//!
//! Input: two octets of payload length, then the option's octets.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tcp_engine::wire::rdma::{RdmaOption, RdmaOptionView};

fuzz_target!(|data: &[u8]| {
    let [a, b, rest @ ..] = data else {
        return;
    };
    let payload = usize::from(u16::from_be_bytes([*a, *b]));
    let Ok(view) = RdmaOptionView::new_checked(rest) else {
        return;
    };
    let option = RdmaOption::parse(&view);
    let mut out = [0u8; 20];
    let n = option.emit(&mut out).expect("an option fits 20 octets");
    assert_eq!(n, usize::from(view.length()));
    assert_eq!(&out[..n], &rest[..n], "parse/emit changed the option");
    if let RdmaOption::Transfer(t) = option {
        if let Ok(r) = t.data_range(payload) {
            assert!(
                r.start <= r.end && r.end <= payload,
                "{r:?} outside {payload}"
            );
            assert_eq!(
                t.buffer_range().end - t.buffer_range().start,
                r.len() as u64
            );
        }
    }
});
