// `#[rdma_async::test]` on the supported shapes expands without errors.
// (This file is built without `--test`, so the tests themselves are
// stripped; `tests/macro_ui.rs` compiles and runs the same shapes.)

#[rdma_async::test]
async fn returns_unit() {}

#[rdma_async::test]
async fn returns_explicit_unit() -> () {}

#[rdma_async::test]
async fn returns_io_result() -> Result<(), std::io::Error> {
    Ok(())
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2, require_device = false)]
async fn all_arguments() -> std::io::Result<()> {
    Ok(())
}

#[rdma_async::test(crate = "::rdma_async")]
async fn explicit_crate_path() {}

fn main() {}
