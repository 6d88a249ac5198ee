#[rdma_async::test(flavor = "multi_thread", threads = 4)]
async fn unknown_test_argument() {}

// `require_device` only means something for tests.
#[rdma_async::main(require_device = true)]
async fn main() {}
