//! Dropping connect and accept futures part-way leaks no rdma_cm id, queue pair or memory
//! region. One test in its own binary: it counts every RDMA resource this process owns.

use std::time::Duration;

use rdma_async::endpoint::{Endpoint, EndpointOptions};
use rdma_async_device_tests::{assert_no_rdma_resources, guard, listener, rdma_resources};

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connect_and_accept_futures_leak_nothing() {
    assert_no_rdma_resources("the test starts with no RDMA resources");
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    assert!(
        rdma_resources("cm_id").unwrap() >= 1,
        "the counter sees the listener's id"
    );

    // Cut connect and accept futures off at many different points, from "before the first
    // event" to "while the handshake is in flight".
    let opts = EndpointOptions::new();
    for round in 0..40u64 {
        let cut = Duration::from_micros(round * round * 25);
        let accept = async {
            let request = listener.accept_request().await?;
            Endpoint::accept(request, &opts).await
        };
        let connect = Endpoint::connect_with(addr, &opts);
        // Either side may win, finish, or be cut: all are fine, nothing may remain.
        let _ = tokio::time::timeout(cut, async { tokio::join!(accept, connect) }).await;
    }
    // A full connection after all that still works. Requests from cut-off rounds may still be
    // queued (their clients are gone), so accept each in its own task and take the first that
    // completes, as a server would; the others are dropped with the JoinSet.
    let server = async {
        let mut pending = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                request = listener.accept_request() => {
                    let (request, opts) = (request?, opts.clone());
                    pending.spawn(async move { Endpoint::accept(request, &opts).await });
                }
                Some(done) = pending.join_next() => {
                    if let Ok(Ok(endpoint)) = done {
                        return std::io::Result::Ok(endpoint);
                    }
                }
            }
        }
    };
    let (server, client) = guard("final connection", async {
        tokio::join!(server, Endpoint::connect_with(addr, &opts))
    })
    .await;
    let (server, client) = (server.unwrap(), client.unwrap());
    client.send(b"still works").await.unwrap();
    assert_eq!(&server.recv().await.unwrap()[..], b"still works");
    assert!(
        rdma_resources("qp").unwrap() >= 2,
        "the counter sees live queue pairs"
    );
    drop((server, client));
    drop(listener);
    // Requests the cut-off rounds left queued die with the listener; everything is gone.
    assert_no_rdma_resources("after the drops");
}
