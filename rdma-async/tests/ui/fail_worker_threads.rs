#[rdma_async::test(flavor = "current_thread", worker_threads = 2)]
async fn explicit_current_thread() {}

// current_thread is also the default flavor.
#[rdma_async::test(worker_threads = 2)]
async fn default_flavor() {}

fn main() {}
