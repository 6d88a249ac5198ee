//! The wire tests, one module per subject, in one binary (one link instead of one per module):
//! they run on node 1 of a `scripts/softroce --pair` boot, their peers on node 2 (`wire-peer`,
//! the examples or librdmacm's C tools, started through `scripts/on-peer`).
//!
//! `scripts/wire-tests` runs each module in a process of its own (filtering on its tests'
//! names): the clean-wire ones (`transports`, `kill`, `soak`) two tests at a time, then those
//! that impair the wire with `tc netem` (`netem*`) one at a time. Several count this process's
//! RDMA resources (`kill`, `netem_listener`, `netem_vanish`, `soak`) and need no other test
//! beside them: run by hand, filter on one module, e.g. `wire --test-threads=1 netem_vanish::`.

mod kill;
mod netem;
mod netem_close;
mod netem_listener;
mod netem_vanish;
mod soak;
mod transports;
