// A region a peer may write is never viewed through a reference: copies only.
use rdma_async::rdma::RdmaConnection;

fn view(conn: &RdmaConnection) {
    let shared = conn.reg_write(64).unwrap();
    let bytes: &[u8] = &shared;
    let first = shared[0];
    let _ = (bytes, first);
}

fn main() {}
