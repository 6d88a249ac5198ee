#[rdma_async::test]
fn not_async() {}

fn main() {}
