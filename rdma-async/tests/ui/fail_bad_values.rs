#[rdma_async::test(flavor = "single_thread")]
async fn unknown_flavor() {}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 0)]
async fn zero_workers() {}

#[rdma_async::test(require_device = true, require_device = false)]
async fn repeated_argument() {}

#[rdma_async::test(require_device = "yes")]
async fn require_device_not_bool() {}

#[rdma_async::test(crate = "not a path")]
async fn bad_crate_path() {}

fn main() {}
