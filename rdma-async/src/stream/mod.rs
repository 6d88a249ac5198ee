//! Byte streams over RDMA that speak rsockets' wire protocol: [`RStream`] and [`RListener`],
//! drop-ins for Tokio's `TcpStream` and `TcpListener`.

mod listener;
mod options;
mod rstream;
mod side_wakers;
mod split;
mod stats;
mod stream_core;
mod write_probe;

pub use listener::{Incoming, RListener};
pub use options::RStreamOptions;
pub use rstream::RStream;
pub use split::{OwnedReadHalf, OwnedWriteHalf, ReadHalf, ReuniteError, WriteHalf};
pub use stats::StreamStats;
