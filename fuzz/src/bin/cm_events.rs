//! Fuzz target `cm_events`: see `rdma_async::__fuzz::cm_events` for what it checks.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        rdma_async::__fuzz::cm_events(data);
    });
}
