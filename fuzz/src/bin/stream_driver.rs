//! Fuzz target `stream_driver`: see `rdma_async::__fuzz::stream_driver` for what it checks.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        rdma_async::__fuzz::stream_driver(data);
    });
}
