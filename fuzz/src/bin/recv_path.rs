//! Fuzz target `recv_path`: see `rdma_async::__fuzz::recv_path` for what it checks.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        rdma_async::__fuzz::recv_path(data);
    });
}
