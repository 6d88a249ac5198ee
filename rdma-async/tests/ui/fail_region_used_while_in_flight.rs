// A region handed to an operation cannot be touched until the operation gives it back.
use rdma_async::rdma::{RdmaConnection, RemoteSlice};

async fn write_then_touch(conn: &RdmaConnection, remote: RemoteSlice) {
    let mut buf = conn.reg_msgs(64).unwrap();
    let write = conn.write(buf, .., remote);
    buf[0] = 1;
    let _ = write.await;
}

fn main() {}
