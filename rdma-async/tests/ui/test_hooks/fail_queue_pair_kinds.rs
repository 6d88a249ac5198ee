// A connected queue pair is one of two kinds, and each posts only its own way: one that owns its
// registered buffers (`RStream`, `Endpoint`) cannot post caller memory, and one that posts caller
// memory through its in-flight table (`RdmaConnection`) has no buffers of its own to post from.
use rdma_async::__test_hooks::{CallerMemoryQueuePair, OwnedBufferQueuePair};

fn owned_buffers_post_caller_memory(qp: &OwnedBufferQueuePair) {
    let _ = qp.post_caller(any(), any(), any());
    let _ = qp.post_recv_caller(any(), any());
}

fn caller_memory_posts_owned_buffers(qp: &CallerMemoryQueuePair) {
    let _ = qp.post(any());
    let _ = qp.post_recv(any(), any());
    let _ = qp.buffer(0);
}

fn any<T>() -> T {
    unimplemented!()
}

fn main() {}
