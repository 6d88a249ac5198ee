//! Work completions, copied out of the completion queue into plain Rust values.

use rdma_async_sys as sys;
use sys::ibv_wc_status as st;

/// The status of a work completion (`enum ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WcStatus(pub(crate) u32);

impl WcStatus {
    pub(crate) const SUCCESS: WcStatus = WcStatus(st::IBV_WC_SUCCESS);
    pub(crate) const FLUSH: WcStatus = WcStatus(st::IBV_WC_WR_FLUSH_ERR);
    pub(crate) const REMOTE_ACCESS: WcStatus = WcStatus(st::IBV_WC_REM_ACCESS_ERR);

    pub(crate) fn is_success(self) -> bool {
        self == Self::SUCCESS
    }

    /// libibverbs' description, e.g. "transport retry counter exceeded".
    pub(crate) fn describe(self) -> String {
        // SAFETY: ibv_wc_status_str accepts any value and returns a static C string.
        let ptr = unsafe { sys::ibv_wc_status_str(self.0) };
        // SAFETY: `ptr` is a valid, NUL-terminated, static string.
        let s = unsafe { std::ffi::CStr::from_ptr(ptr) };
        s.to_string_lossy().into_owned()
    }
}

/// A work completion: what finished, how, and how many bytes it carried.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkCompletion {
    pub(crate) wr_id: u64,
    pub(crate) status: WcStatus,
    pub(crate) byte_len: u32,
    /// The immediate data (host order) of a receive completion that carried one.
    pub(crate) imm_data: Option<u32>,
    pub(crate) vendor_err: u32,
    /// Datagram (UD) receives: the sender's queue pair number.
    pub(crate) src_qp: u32,
    /// `ibv_wc_flags` (`IBV_WC_GRH`, `IBV_WC_WITH_IMM`).
    pub(crate) wc_flags: u32,
    /// Datagram receives: what `ibv_create_ah_from_wc` needs besides the GRH.
    pub(crate) slid: u16,
    pub(crate) sl: u8,
    pub(crate) dlid_path_bits: u8,
    pub(crate) pkey_index: u16,
    /// The local queue pair the completion belongs to (which connection, for a shared receive
    /// queue).
    pub(crate) qp_num: u32,
    /// `ibv_wc_opcode`: what completed (meaningful only with a success status).
    pub(crate) opcode: u32,
}

impl WorkCompletion {
    pub(crate) const EMPTY: WorkCompletion = WorkCompletion {
        wr_id: 0,
        status: WcStatus::SUCCESS,
        byte_len: 0,
        imm_data: None,
        vendor_err: 0,
        src_qp: 0,
        wc_flags: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
        pkey_index: 0,
        qp_num: 0,
        opcode: 0,
    };

    /// Whether a receive was consumed by an RDMA write with immediate
    /// (`IBV_WC_RECV_RDMA_WITH_IMM`): the data went to the memory the peer wrote, not into
    /// the receive's buffer, and `byte_len` is the write's length.
    pub(crate) fn is_rdma_write_with_imm(&self) -> bool {
        self.opcode == sys::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM
    }

    pub(super) fn from_sys(wc: &sys::ibv_wc) -> Self {
        WorkCompletion {
            wr_id: wc.wr_id,
            status: WcStatus(wc.status),
            byte_len: wc.byte_len,
            // SAFETY: with IBV_WC_WITH_IMM the union holds the immediate data (network order).
            imm_data: (wc.wc_flags & sys::ibv_wc_flags::IBV_WC_WITH_IMM != 0)
                .then(|| u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data })),
            vendor_err: wc.vendor_err,
            src_qp: wc.src_qp,
            wc_flags: wc.wc_flags,
            slid: wc.slid,
            sl: wc.sl,
            dlid_path_bits: wc.dlid_path_bits,
            pkey_index: wc.pkey_index,
            qp_num: wc.qp_num,
            opcode: wc.opcode,
        }
    }
}
