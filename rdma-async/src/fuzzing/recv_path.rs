//! Target `recv_path`: the immediates, data writes, SGL updates and connection data of a hostile
//! peer through the receiver's `handle_recv_completion`, against the invariants of
//! `proto::hostile`.

/// One hostile peer's run, decoded from `bytes` (see `proto::hostile`); panics when the
/// connection breaks an invariant.
pub fn recv_path(bytes: &[u8]) {
    crate::proto::hostile::run(bytes);
}
