// RegisteredBytes is sealed: outside types cannot claim to be registered memory.
use rdma_async::rdma::RegisteredBytes;

struct Fake(Vec<u8>);

impl RegisteredBytes for Fake {
    fn len(&self) -> usize {
        self.0.len()
    }
}

fn main() {}
