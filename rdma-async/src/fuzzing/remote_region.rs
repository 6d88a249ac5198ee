//! Target `remote_region`: the 16-byte descriptor of a peer's memory (rping's encoding), and the
//! slices of it that operations target.

use std::io;

use crate::rdma::RemoteRegion;

/// Decodes the first 16 bytes of `bytes` as a descriptor and slices it with offsets and lengths
/// from the next 8: a descriptor is valid exactly when it does not wrap the address space and
/// encodes back to its bytes; a slice is given exactly when it lies inside the region.
pub fn remote_region(bytes: &[u8]) {
    let region = match RemoteRegion::from_bytes(bytes) {
        Ok(r) => r,
        Err(e) => {
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            if let Some(head) = bytes.get(..RemoteRegion::ENCODED_LEN) {
                let addr = u64::from_be_bytes(head[..8].try_into().unwrap());
                let len = u32::from_be_bytes(head[12..16].try_into().unwrap());
                assert!(
                    addr.checked_add(u64::from(len)).is_none(),
                    "a valid descriptor was refused: {e}"
                );
            }
            return;
        }
    };
    assert_eq!(region.to_bytes()[..], bytes[..RemoteRegion::ENCODED_LEN]);
    assert_eq!(
        RemoteRegion::new(region.addr(), region.len(), region.rkey()).unwrap(),
        region
    );
    assert!(region.addr().checked_add(u64::from(region.len())).is_some());
    assert_eq!(region.whole(), region);
    let rest = &bytes[RemoteRegion::ENCODED_LEN..];
    for pair in rest.chunks_exact(8).take(16) {
        let offset = u32::from_le_bytes(pair[..4].try_into().unwrap());
        let len = u32::from_le_bytes(pair[4..].try_into().unwrap());
        let inside = u64::from(offset) + u64::from(len) <= u64::from(region.len());
        match region.slice(offset, len) {
            Ok(s) => {
                assert!(inside);
                assert_eq!(s.addr(), region.addr() + u64::from(offset));
                assert_eq!((s.len(), s.rkey()), (len, region.rkey()));
                assert!(s.addr() + u64::from(s.len()) <= region.addr() + u64::from(region.len()));
            }
            Err(e) => {
                assert!(!inside, "slice {offset}+{len} of {region:?} refused: {e}");
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            }
        }
    }
}
