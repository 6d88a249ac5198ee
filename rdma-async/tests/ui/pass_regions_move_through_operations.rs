// The intended pattern compiles: regions move into operations and come back with the result.
use rdma_async::rdma::{LocalRegion, RdmaConnection, RemoteSlice, SharedRegion};

async fn round_trip(conn: &RdmaConnection, remote: RemoteSlice) -> std::io::Result<LocalRegion> {
    let mut buf = conn.reg_msgs(64)?;
    buf.fill(1);
    let (res, buf) = conn.write(buf, ..32, remote).await;
    res?;
    let (res, mut buf) = conn.read(buf, 32.., remote).await;
    res?;
    buf[0] = 2;
    Ok(buf)
}

async fn shared_copies(conn: &RdmaConnection, mut shared: SharedRegion) -> Vec<u8> {
    shared.write_at(0, b"abc").unwrap();
    let (_, shared) = conn.send(shared, ..3).await;
    shared.to_vec()
}

fn main() {
    let _ = round_trip;
    let _ = shared_copies;
}
