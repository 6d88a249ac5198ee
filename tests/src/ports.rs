//! Every fixed port a test uses, in one table.
//!
//! A test that can listen on port 0 does. These are the ones that cannot: librdmacm's C tools
//! and our example programs take the port on their command line and cannot report an ephemeral
//! one, udaddy's port is built in, and the two-node tests start their peers on the other node
//! before they connect. Tests in one binary run side by side, so two that listen on one port
//! fail each other (only when they happen to overlap): every such port is named here once, and
//! its test, `no_two_fixed_ports_overlap`, fails when a new one collides with an old one.

/// Declares each port as a constant and lists them all in [`FIXED`], with how many consecutive
/// ports from it its test uses.
macro_rules! fixed_ports {
    ($($(#[$doc:meta])* $name:ident = $port:literal $(, $width:literal ports)?;)*) => {
        $($(#[$doc])* pub const $name: u16 = $port;)*

        /// Every fixed port above: its name, the first port and how many ports from it.
        pub const FIXED: &[(&str, u16, u16)] = &[$((stringify!($name), $port, fixed_ports!(@width $($width)?))),*];
    };
    (@width) => { 1 };
    (@width $width:literal) => { $width };
}

fixed_ports! {
    /// udaddy's built-in port (its `-p` selects the port space, not the port).
    UDADDY = 7174;
    /// A destination nothing listens on: the unreachable, silent and unresolvable peers of the
    /// connection-manager tests.
    UNREACHED = 7471;
    /// The TLS echo example.
    TLS_ECHO_EXAMPLE = 7480;
    /// Our rstream example's server, with C rstream as its client.
    RSTREAM_EXAMPLE_SERVER = 7481;
    /// Our rstream example as both ends.
    RSTREAM_EXAMPLE_PAIR = 7482;
    /// ncat over librspreload.
    NCAT_PRELOADED = 7488;
    /// The many-streams example, 16 connections.
    MANY_STREAMS_EXAMPLE = 7490;
    /// The serve-file example.
    SERVE_FILE_EXAMPLE = 7491;
    /// The zero-copy example.
    ZERO_COPY_EXAMPLE = 7492;
    /// The message-rate example: sends, then writes.
    MSG_RATE_EXAMPLE = 7493, 2 ports;
    /// The many-streams example, a thousand streams in one process.
    THOUSAND_STREAMS_EXAMPLE = 7495;
    /// msg_rate's writes in batches.
    MSG_RATE_BATCH_EXAMPLE = 7496;
    /// C rping's server.
    C_RPING_SERVER = 17174;
    /// C ucmatose's server.
    C_UCMATOSE_SERVER = 17471;
    /// C rstream servers: our client's runs (64 B, 64 KiB, 4 KiB with `-B`, 1 MiB,
    /// non-blocking) and, fourth, the server a test kills mid-transfer.
    C_RSTREAM_SERVERS = 17481, 6 ports;
    /// The two-node tests' stream echo.
    WIRE_STREAM_ECHO = 7601;
    /// The two-node tests' endpoint echo.
    WIRE_ENDPOINT_ECHO = 7602;
    /// The two-node tests' RDMA read/write peer.
    WIRE_RDMA = 7603;
    /// The two-node tests' datagram echo.
    WIRE_DATAGRAM_ECHO = 7604;
    /// The two-node tests' local datagram socket.
    WIRE_DATAGRAM_LOCAL = 7605;
    /// The two-node tests' HTTP server.
    WIRE_HTTP = 7606;
    /// The two-node tests' gRPC greeter.
    WIRE_GRPC = 7607;
    /// C rstream servers on the other node, one a run.
    WIRE_C_RSTREAM = 7610, 2 ports;
    /// C rping's server on the other node.
    WIRE_C_RPING = 7615;
    /// netem runs: a stream echo and an RDMA peer each (loss, reordering, duplication,
    /// corruption, all together).
    WIRE_NETEM = 7620, 10 ports;
    /// The HTTP server on an impaired wire.
    WIRE_NETEM_HTTP = 7630;
    /// The gRPC greeter on an impaired wire.
    WIRE_NETEM_GRPC = 7631;
    /// A host that vanishes: its stream echo and RDMA peer.
    WIRE_VANISH = 7640, 2 ports;
    /// The soak: a stream echo and an RDMA peer.
    WIRE_SOAK = 7650, 2 ports;
}

#[cfg(test)]
mod tests {
    use super::FIXED;

    #[test]
    fn no_two_fixed_ports_overlap() {
        for (i, &(name, first, width)) in FIXED.iter().enumerate() {
            assert!(width > 0, "{name} uses no port");
            let end = u32::from(first) + u32::from(width);
            for &(other, other_first, other_width) in &FIXED[i + 1..] {
                let other_end = u32::from(other_first) + u32::from(other_width);
                assert!(
                    end <= u32::from(other_first) || other_end <= u32::from(first),
                    "{name} ({first}..{end}) and {other} ({other_first}..{other_end}) share ports"
                );
            }
        }
    }
}
