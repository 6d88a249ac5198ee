#[rdma_async::test]
async fn takes_arguments(port: u16, gid: &str) {
    let _ = (port, gid);
}

fn main() {}
