// Two threads copying into one region at once would be a data race: writing takes the region
// exclusively, so a region shared between threads (`Arc`) can be read but not written.
use std::sync::Arc;

use rdma_async::rdma::SharedRegion;

fn write_from_two_threads(shared: SharedRegion) {
    let shared = Arc::new(shared);
    let other = Arc::clone(&shared);
    let writer = std::thread::spawn(move || other.write_at(0, b"one"));
    shared.write_at(0, b"two").unwrap();
    let _ = writer.join();
}

fn main() {
    let _ = write_from_two_threads;
}
