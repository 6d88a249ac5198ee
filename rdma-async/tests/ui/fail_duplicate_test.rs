#[rdma_async::test]
#[test]
async fn builtin_test_too() {}

#[rdma_async::test]
#[rdma_async::test]
async fn applied_twice() {}

fn main() {}
