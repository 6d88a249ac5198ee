//! Target `hello`: the private data of a SIDR request or reply (an rdma-async datagram socket's
//! hello, or anything another program sends).

use crate::datagram::hello::{Hello, LEN};

/// Decodes `bytes` as a hello: one is recognised only by its magic and version, carries a 24-bit
/// queue pair number, and encodes back to the bytes it came from (but for the reserved byte and
/// the queue pair number's unused top byte).
pub fn hello(bytes: &[u8]) {
    match Hello::decode(bytes) {
        Some(h) => {
            assert!(h.qpn <= 0x00ff_ffff, "{h:?}");
            let encoded = h.encode();
            assert_eq!(Hello::decode(&encoded), Some(h));
            assert_eq!(encoded[..5], bytes[..5]);
            assert_eq!(encoded[6..8], bytes[6..8]);
            assert_eq!(encoded[9..LEN], bytes[9..LEN]);
        }
        None => {
            let h = Hello { port: 1, qpn: 2 }.encode();
            assert!(
                bytes.len() < LEN || bytes[..5] != h[..5],
                "a hello was refused"
            );
        }
    }
}
