//! Per-connection sizes and the protocol's fixed constants (rsocket-protocol.md §1.4).
//!
//! Sizes are purely local: nothing here is negotiated with the peer except what
//! [`ConnData`](super::ConnData) carries (credits = `rq_size`, the first receive half).

/// Entries in each side's target SGL (the array the peer writes buffer updates into).
pub(crate) const RS_SGL_SIZE: usize = 2;
/// Control messages (credit/SGL updates, CTRL, keepalive) allowed in flight; taken out of the SQ.
pub(crate) const RS_QP_CTRL_SIZE: u32 = 4;
/// Largest single RDMA write (one chunk).
pub(crate) const RS_MAX_TRANSFER: u32 = 65536;
/// First chunk size of every application write call; doubles per chunk up to `RS_MAX_TRANSFER`.
pub(crate) const RS_OLAP_START_SIZE: u32 = 2048;
/// Free send-buffer bytes needed before a chunk may be sent.
pub(crate) const RS_SNDLOWAT: u32 = 2048;
/// Smallest send/receive queue depth.
pub(crate) const RS_QP_MIN_SIZE: u32 = 16;
/// Largest send/receive queue depth (also the largest inline size C accepts).
pub(crate) const RS_QP_MAX_SIZE: u32 = 0xFFFE;
/// Size of one SGL entry on the wire, and of the largest control-message payload.
pub(crate) const RS_MAX_CTRL_MSG: usize = 16;

/// C's `def_wmem`.
pub(crate) const DEFAULT_SBUF_SIZE: u32 = 128 * 1024;
/// C's `def_mem`.
pub(crate) const DEFAULT_RBUF_SIZE: u32 = 128 * 1024;
/// C's `def_sqsize`.
pub(crate) const DEFAULT_SQ_SIZE: u32 = 384;
/// C's `def_rqsize`.
pub(crate) const DEFAULT_RQ_SIZE: u32 = 384;
/// C's `def_inline`.
pub(crate) const DEFAULT_INLINE_SIZE: u32 = 64;

/// Local sizes of one stream connection. Every setter clamps the way C rsockets does, so a
/// `Config` is always usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Config {
    sbuf_size: u32,
    rbuf_size: u32,
    sq_size: u32,
    rq_size: u32,
    inline_size: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self::new()
    }
}

impl Config {
    /// C rsockets' defaults: 128 KiB rings, 384-deep queues, 64 bytes inline.
    pub(crate) const fn new() -> Self {
        Self {
            sbuf_size: DEFAULT_SBUF_SIZE,
            rbuf_size: DEFAULT_RBUF_SIZE,
            sq_size: DEFAULT_SQ_SIZE,
            rq_size: DEFAULT_RQ_SIZE,
            inline_size: DEFAULT_INLINE_SIZE,
        }
    }

    /// Send ring size in bytes. Below `RS_SNDLOWAT` (2048) it becomes 4096, as in C: a smaller
    /// ring could never satisfy the 2048-free-bytes send condition.
    pub(crate) const fn with_sbuf_size(mut self, bytes: u32) -> Self {
        self.sbuf_size = if bytes < RS_SNDLOWAT {
            RS_SNDLOWAT << 1
        } else {
            bytes
        };
        self
    }

    /// Receive ring size in bytes, used as two halves. Rounded down to an even number and at
    /// least 2: C accepts 1, which advertises a 0-byte first half that every peer rejects.
    pub(crate) const fn with_rbuf_size(mut self, bytes: u32) -> Self {
        let even = bytes & !1;
        self.rbuf_size = if even < 2 { 2 } else { even };
        self
    }

    /// Send queue depth, clamped to `[16, 0xFFFE]`; 4 entries are reserved for control messages.
    pub(crate) const fn with_sq_size(mut self, depth: u32) -> Self {
        self.sq_size = clamp_qp(depth);
        self
    }

    /// Receive queue depth (= the credits offered to the peer), clamped to `[16, 0xFFFE]`.
    pub(crate) const fn with_rq_size(mut self, depth: u32) -> Self {
        self.rq_size = clamp_qp(depth);
        self
    }

    /// Largest chunk sent inline. The driver should store back what the provider actually
    /// granted at QP creation (C does the same). At most 0xFFFE.
    pub(crate) const fn with_inline_size(mut self, bytes: u32) -> Self {
        self.inline_size = if bytes > RS_QP_MAX_SIZE {
            RS_QP_MAX_SIZE
        } else {
            bytes
        };
        self
    }

    /// Clamp both queue depths to the device's `max_qp_wr` (C's `rs_set_qp_size`), never below
    /// the protocol minimum of 16.
    #[cfg(test)]
    pub(crate) const fn with_device_max_qp_wr(mut self, max_qp_wr: u32) -> Self {
        let max = if max_qp_wr < RS_QP_MAX_SIZE {
            max_qp_wr
        } else {
            RS_QP_MAX_SIZE
        };
        if self.sq_size > max {
            self.sq_size = max;
        }
        if self.rq_size > max {
            self.rq_size = max;
        }
        self.sq_size = clamp_qp(self.sq_size);
        self.rq_size = clamp_qp(self.rq_size);
        self
    }

    /// Send ring size in bytes.
    pub(crate) const fn sbuf_size(&self) -> u32 {
        self.sbuf_size
    }

    /// Receive ring size in bytes.
    pub(crate) const fn rbuf_size(&self) -> u32 {
        self.rbuf_size
    }

    /// Send queue depth (data plus `RS_QP_CTRL_SIZE` control slots).
    pub(crate) const fn sq_size(&self) -> u32 {
        self.sq_size
    }

    /// Receive queue depth: how many receives the driver posts before connecting.
    pub(crate) const fn rq_size(&self) -> u32 {
        self.rq_size
    }

    /// Largest chunk sent inline.
    pub(crate) const fn inline_size(&self) -> u32 {
        self.inline_size
    }

    /// `rq_size` as the 16-bit credit count that goes on the wire (always fits: ≤ 0xFFFE).
    pub(crate) const fn credits(&self) -> u16 {
        self.rq_size as u16
    }
}

const fn clamp_qp(depth: u32) -> u32 {
    if depth < RS_QP_MIN_SIZE {
        RS_QP_MIN_SIZE
    } else if depth > RS_QP_MAX_SIZE {
        RS_QP_MAX_SIZE
    } else {
        depth
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_c() {
        let c = Config::new();
        assert_eq!(
            (
                c.sbuf_size(),
                c.rbuf_size(),
                c.sq_size(),
                c.rq_size(),
                c.inline_size()
            ),
            (131072, 131072, 384, 384, 64)
        );
        assert_eq!(Config::default(), c);
    }

    #[test]
    fn clamping() {
        let c = Config::new()
            .with_sbuf_size(2047)
            .with_rbuf_size(1)
            .with_sq_size(3)
            .with_rq_size(1_000_000)
            .with_inline_size(1 << 20);
        assert_eq!(c.sbuf_size(), 4096);
        assert_eq!(c.rbuf_size(), 2);
        assert_eq!(c.sq_size(), 16);
        assert_eq!(c.rq_size(), 0xFFFE);
        assert_eq!(c.inline_size(), 0xFFFE);
        assert_eq!(Config::new().with_sbuf_size(2048).sbuf_size(), 2048);
        assert_eq!(Config::new().with_rbuf_size(8193).rbuf_size(), 8192);
        let d = Config::new().with_device_max_qp_wr(100);
        assert_eq!((d.sq_size(), d.rq_size()), (100, 100));
        let e = Config::new().with_device_max_qp_wr(4);
        assert_eq!((e.sq_size(), e.rq_size()), (16, 16));
        assert_eq!(e.credits(), 16);
    }
}
