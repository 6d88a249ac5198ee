#[rdma_async::main(flavor = "current_thread", worker_threads = 2)]
fn main(args: Vec<String>) {
    let _ = args;
}
