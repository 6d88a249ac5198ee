#[rdma_async::test]
async fn returns_a_number() -> u32 {
    0
}

#[rdma_async::test]
async fn returns_ok_value() -> Result<u32, std::io::Error> {
    Ok(0)
}

fn main() {}
