//! Connected pairs, `(server, client)`, on the test address: each transport's listener accepts
//! while its client connects, under the hang guard.

use rdma_async::cm::CmListener;
use rdma_async::endpoint::{Endpoint, EndpointOptions};
use rdma_async::rdma::{RdmaConnection, RdmaOptions};
use rdma_async::stream::{RListener, RStream, RStreamOptions};

use crate::guard;
use crate::sockets::{listener, rlistener_with};

/// A connected pair of [`RdmaConnection`]s (server, client) on the test address.
pub async fn rdma_pair(opts: &RdmaOptions) -> (RdmaConnection, RdmaConnection) {
    rdma_pair_on(&listener().await, opts, opts).await
}

/// A connected pair of [`RdmaConnection`]s through `listener`: the server accepts with
/// `server_opts`, the client connects with `client_opts`.
pub async fn rdma_pair_on(
    listener: &CmListener,
    server_opts: &RdmaOptions,
    client_opts: &RdmaOptions,
) -> (RdmaConnection, RdmaConnection) {
    let addr = listener.local_addr().unwrap();
    let server = async {
        let request = listener.accept_request().await?;
        RdmaConnection::accept(request, server_opts).await
    };
    let (server, client) = guard("RDMA connection", async {
        tokio::join!(server, RdmaConnection::connect_with(addr, client_opts))
    })
    .await;
    (server.expect("accept"), client.expect("connect"))
}

/// A connected pair of [`Endpoint`]s (server, client) on the test address, both with `opts`.
pub async fn endpoint_pair(opts: &EndpointOptions) -> (Endpoint, Endpoint) {
    endpoint_pair_on(&listener().await, opts, opts).await
}

/// A connected pair of [`Endpoint`]s through `listener`: the server accepts with
/// `server_opts`, the client connects with `client_opts`.
pub async fn endpoint_pair_on(
    listener: &CmListener,
    server_opts: &EndpointOptions,
    client_opts: &EndpointOptions,
) -> (Endpoint, Endpoint) {
    let addr = listener.local_addr().unwrap();
    let server = async {
        let request = listener.accept_request().await?;
        Endpoint::accept(request, server_opts).await
    };
    let (server, client) = guard("connect", async {
        tokio::join!(server, Endpoint::connect_with(addr, client_opts))
    })
    .await;
    (server.expect("accept"), client.expect("connect"))
}

/// A connected pair of [`RStream`]s (server, client) on the test address, both with `options`.
pub async fn stream_pair(options: RStreamOptions) -> (RStream, RStream) {
    stream_pair_on(&rlistener_with(options.clone()).await, &options).await
}

/// A connected pair of [`RStream`]s: `listener` accepts (with its own options), the client
/// connects with `options`.
pub async fn stream_pair_on(listener: &RListener, options: &RStreamOptions) -> (RStream, RStream) {
    let addr = listener.local_addr().expect("listener address");
    let (accepted, connected) = guard("connect", async {
        tokio::join!(listener.accept(), RStream::connect_with(addr, options))
    })
    .await;
    (accepted.expect("accept").0, connected.expect("connect"))
}
