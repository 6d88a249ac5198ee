//! tonic 0.14 glue: `Connected for RStream`, so a gRPC server serves over RDMA and its
//! handlers still see `Request::remote_addr()`.
//!
//! Server: [`RListener::into_incoming`](crate::stream::RListener::into_incoming) is the
//! incoming stream for `serve_with_incoming`. Handshakes run concurrently, each bounded by the
//! listener's `accept_timeout`; a request that fails (one the server could not set up, such as
//! `EMFILE`, or one the peer broke) is logged and skipped, so it never stops the server; a
//! listener that fails for good (its device was removed) yields its error once and then ends
//! the stream, so the server returns instead of spinning.
//!
//! ```no_run
//! use rdma_async::stream::RListener;
//! # use tonic::service::Routes;
//!
//! # async fn demo(routes: Routes) -> Result<(), Box<dyn std::error::Error>> {
//! let listener = RListener::bind("10.77.0.1:50051").await?;
//! tonic::transport::Server::builder()
//!     .add_routes(routes)
//!     .serve_with_incoming(listener.into_incoming())
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Client: the hyper connector [`RConnector`](crate::integration::hyper::RConnector) is also a
//! tonic connector (there is no ALPN over rdma_cm, and tonic speaks HTTP/2 with prior
//! knowledge, so nothing else is needed):
//!
//! ```no_run
//! use rdma_async::integration::hyper::RConnector;
//! use tonic::transport::Endpoint;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let channel = Endpoint::from_static("http://10.77.0.1:50051")
//!     .connect_with_connector(RConnector::new())
//!     .await?;
//! # let _ = channel;
//! # Ok(()) }
//! ```

use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::stream::RStream;

impl Connected for RStream {
    /// tonic's `Request::remote_addr()` and `local_addr()` look only for `TcpConnectInfo`, so an
    /// RDMA stream reports its addresses as one: handlers written for TCP keep working.
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        TcpConnectInfo {
            local_addr: self.local_addr().ok(),
            remote_addr: self.peer_addr().ok(),
        }
    }
}
