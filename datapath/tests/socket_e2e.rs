//! End-to-end tests of the socket transport over 127.0.0.1: data transfers of every size class
//! in every MPA configuration, private data, reject, concurrent connections and disconnect.

mod common;

use common::*;
use datapath::Listener;

#[test]
fn all_sizes_rev2_crc_no_markers() {
    let p = params(mpa(2, true, false));
    let listener = Listener::bind(any_port(), p.clone()).unwrap();
    let addr = listener.local_addr().unwrap();
    let info = verified_transfers(&listener, addr, &p, &full_sizes(), 1);
    assert_eq!(info.client_negotiated.rev, 2);
    assert!(info.client_negotiated.crc && info.server_negotiated.crc);
    assert!(info.sizes.contains(&(16 << 20)));
}
