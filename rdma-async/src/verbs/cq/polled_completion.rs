//! [`PolledCompletion`]: a work completion as the provider wrote it, read in place.

use rdma_async_sys as sys;

use super::work_completion::{WcStatus, WorkCompletion};

/// One `ibv_wc` as `ibv_poll_cq` wrote it into a [`CompletionBatch`](super::CompletionBatch).
///
/// The data path reads the few fields it needs from here: copying every completion into a
/// [`WorkCompletion`] first (with, then, a full decode of every immediate) cost a streamed 64 B
/// message 33 instructions. Code that keeps a completion, or needs all of it, takes
/// [`Self::to_work_completion`].
#[repr(transparent)]
pub(crate) struct PolledCompletion(sys::ibv_wc);

impl PolledCompletion {
    /// Which work request completed.
    #[inline]
    pub(crate) fn wr_id(&self) -> u64 {
        self.0.wr_id
    }

    /// How it completed.
    #[inline]
    pub(crate) fn status(&self) -> WcStatus {
        WcStatus(self.0.status)
    }

    /// The bytes it carried.
    #[inline]
    pub(crate) fn byte_len(&self) -> u32 {
        self.0.byte_len
    }

    /// The immediate data (host order), when the completion carried one.
    #[inline]
    pub(crate) fn imm_data(&self) -> Option<u32> {
        (self.0.wc_flags & sys::ibv_wc_flags::IBV_WC_WITH_IMM != 0)
            // SAFETY: with IBV_WC_WITH_IMM the union holds the immediate data (network order);
            // either member is a plain `u32`, valid for any bits.
            .then(|| u32::from_be(unsafe { self.0.__bindgen_anon_1.imm_data }))
    }

    /// The whole completion, copied out.
    #[inline]
    pub(crate) fn to_work_completion(&self) -> WorkCompletion {
        WorkCompletion::from_sys(&self.0)
    }
}

impl From<WorkCompletion> for PolledCompletion {
    /// The entry a provider would have written for `wc` (fakes and tests hand these out).
    fn from(wc: WorkCompletion) -> Self {
        let mut wc_flags = wc.wc_flags;
        if wc.imm_data.is_some() {
            wc_flags |= sys::ibv_wc_flags::IBV_WC_WITH_IMM;
        } else {
            wc_flags &= !sys::ibv_wc_flags::IBV_WC_WITH_IMM;
        }
        PolledCompletion(sys::ibv_wc {
            wr_id: wc.wr_id,
            status: wc.status.0,
            opcode: wc.opcode,
            vendor_err: wc.vendor_err,
            byte_len: wc.byte_len,
            __bindgen_anon_1: sys::ibv_wc__bindgen_ty_1 {
                imm_data: wc.imm_data.unwrap_or(0).to_be(),
            },
            qp_num: wc.qp_num,
            src_qp: wc.src_qp,
            wc_flags,
            pkey_index: wc.pkey_index,
            slid: wc.slid,
            sl: wc.sl,
            dlid_path_bits: wc.dlid_path_bits,
        })
    }
}

impl std::fmt::Debug for PolledCompletion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.to_work_completion().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_back_what_it_was_made_from() {
        let wc = WorkCompletion {
            wr_id: 7,
            status: WcStatus::FLUSH,
            byte_len: 64,
            imm_data: Some(0x8000_0040),
            wc_flags: 0,
            qp_num: 3,
            opcode: 5,
            ..WorkCompletion::EMPTY
        };
        let polled = PolledCompletion::from(wc);
        assert_eq!(polled.wr_id(), 7);
        assert_eq!(polled.status(), WcStatus::FLUSH);
        assert_eq!(polled.byte_len(), 64);
        assert_eq!(polled.imm_data(), Some(0x8000_0040));
        let back = polled.to_work_completion();
        assert_eq!(back.imm_data, Some(0x8000_0040));
        assert_eq!(back.wc_flags, sys::ibv_wc_flags::IBV_WC_WITH_IMM);
        assert_eq!((back.qp_num, back.opcode), (3, 5));
        let plain = PolledCompletion::from(WorkCompletion {
            wc_flags: sys::ibv_wc_flags::IBV_WC_WITH_IMM,
            ..WorkCompletion::EMPTY
        });
        assert_eq!(plain.imm_data(), None);
    }
}
