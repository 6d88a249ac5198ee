// Only bytes can be registered: no MemoryRegion<T> over arbitrary types.
use rdma_async::rdma::RdmaConnection;

fn register_words(conn: &RdmaConnection) {
    let _ = conn.register(vec![1u64, 2, 3]);
}

fn main() {}
