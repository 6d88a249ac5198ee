//! Target `conn_data`: the 40 bytes of rsockets connection data a peer sends in its connect
//! request or accept reply.

use crate::proto::{Config, ConnData, ProtoErrorKind};

/// Decodes `bytes` as connection data. Valid data re-encodes to the same fields (and the same
/// bytes, but for the reserved ones and the iomap code's spelling) and is taken by a connection;
/// invalid data is an `InvalidData` error that says what is wrong.
pub fn conn_data(bytes: &[u8]) {
    match ConnData::decode(bytes) {
        Ok(data) => {
            let encoded = data.encode();
            assert_eq!(ConnData::decode(&encoded), Ok(data));
            assert_eq!(encoded[..4], bytes[..4]);
            assert_eq!(encoded[8..40], bytes[8..40]);
            let mut conn = super::connection(Config::new());
            conn.handle_peer_conn_data(&data)
                .expect("decoded connection data is accepted");
            assert!(conn.error().is_none());
        }
        Err(e) => {
            assert_eq!(e.kind(), ProtoErrorKind::InvalidConnData);
            let io = std::io::Error::from(e);
            assert_eq!(io.kind(), std::io::ErrorKind::InvalidData);
            assert!(io.to_string().len() > 40, "{io}");
        }
    }
}
