//! Fuzz target `datagram_peers`: see `rdma_async::__fuzz::datagram_peers` for what it checks.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        rdma_async::__fuzz::datagram_peers(data);
    });
}
