//! An axum app served over RDMA with `axum::serve`, showing the peer's address from
//! `ConnectInfo`.
//!
//! ```text
//! axum_app [address:port]           # default 10.77.0.1:8080
//! axum_app --help
//! ```
//!
//! Try it with `http_client http://10.77.0.1:8080/whoami`.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::serve::ListenerExt;
use clap::Parser;
use rdma_async::stream::RListener;

/// An axum app served over RDMA, showing the peer's address from `ConnectInfo` at /whoami.
#[derive(Debug, Parser)]
#[command(name = "axum_app")]
struct Options {
    /// The address and port to listen on.
    #[arg(value_name = "ADDRESS:PORT", default_value = "10.77.0.1:8080")]
    addr: String,
}

#[rdma_async::main(flavor = "multi_thread")]
async fn main() -> std::io::Result<()> {
    let Options { addr } = Options::parse();
    let listener = RListener::bind(addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    let app = Router::new()
        .route("/", get(|| async { "hello from axum over RDMA\n" }))
        .route("/whoami", get(whoami));
    // `tap_io` (a no-op tap) is how axum 0.8 offers `ConnectInfo<SocketAddr>` for a listener
    // other than its own `TcpListener`.
    axum::serve(
        listener.tap_io(|_| {}),
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}

async fn whoami(ConnectInfo(peer): ConnectInfo<SocketAddr>) -> String {
    format!("you are {peer}\n")
}
