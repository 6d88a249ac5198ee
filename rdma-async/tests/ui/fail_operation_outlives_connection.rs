// An operation's future borrows its connection: it cannot outlive it (a spawned task needs 'static).
use rdma_async::rdma::RdmaConnection;

fn spawn_send(conn: RdmaConnection) {
    let buf = conn.reg_msgs(8).unwrap();
    tokio::spawn(conn.send(buf, ..));
    drop(conn);
}

fn main() {}
