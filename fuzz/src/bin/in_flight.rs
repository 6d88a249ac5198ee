//! Fuzz target `in_flight`: see `rdma_async::__fuzz::in_flight` for what it checks.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        rdma_async::__fuzz::in_flight(data);
    });
}
