//! Byte streams over RDMA that speak rsockets' wire protocol: [`RStream`] and [`RListener`],
//! drop-ins for Tokio's `TcpStream` and `TcpListener`.

mod driver;
mod listener;
mod options;
mod rstream;

pub use listener::RListener;
pub use options::RStreamOptions;
pub use rstream::RStream;
