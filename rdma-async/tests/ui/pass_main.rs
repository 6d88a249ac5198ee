// `#[rdma_async::main]` builds a runtime and runs the body on it; trybuild
// runs this binary, so the assertions below execute.

use rdma_async::__private::tokio::runtime::{Handle, RuntimeFlavor};

#[rdma_async::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    assert_eq!(
        Handle::current().runtime_flavor(),
        RuntimeFlavor::MultiThread
    );
    let joined = rdma_async::__private::tokio::spawn(async { 6 * 7 }).await?;
    assert_eq!(joined, 42);
    Ok(())
}
