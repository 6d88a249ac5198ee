// A view of a region cannot outlive handing the region to the device.
use rdma_async::rdma::RdmaConnection;

async fn recv_into_viewed(conn: &RdmaConnection) {
    let buf = conn.reg_msgs(64).unwrap();
    let view: &[u8] = &buf;
    let (_, _buf) = conn.recv(buf, ..).await;
    println!("{}", view[0]);
}

fn main() {}
