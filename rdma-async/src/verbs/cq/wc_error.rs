//! The `io::Error` of a work completion that failed: the kind a socket user expects, and a
//! [`CompletionError`] inside with the status and the vendor's code.

use std::io;

use super::WorkCompletion;
use crate::error::CompletionError;

/// The `io::Error` for a failed work completion, with the kind a socket user expects.
pub(crate) fn wc_error(
    wc: &WorkCompletion,
    peer: std::net::SocketAddr,
    sending: bool,
) -> io::Error {
    use rdma_async_sys::ibv_wc_status as st;
    let kind = match wc.status.0 {
        st::IBV_WC_RETRY_EXC_ERR | st::IBV_WC_RNR_RETRY_EXC_ERR => io::ErrorKind::TimedOut,
        st::IBV_WC_WR_FLUSH_ERR if sending => io::ErrorKind::BrokenPipe,
        st::IBV_WC_WR_FLUSH_ERR => io::ErrorKind::ConnectionReset,
        st::IBV_WC_REM_ACCESS_ERR | st::IBV_WC_LOC_PROT_ERR => io::ErrorKind::PermissionDenied,
        st::IBV_WC_LOC_LEN_ERR | st::IBV_WC_REM_INV_REQ_ERR => io::ErrorKind::InvalidData,
        _ => io::ErrorKind::Other,
    };
    let what = if sending { "send to" } else { "receive from" };
    let message = format!(
        "{what} {peer} failed: {} (work completion status {}, vendor error {:#x})",
        wc.status.describe(),
        wc.status.0,
        wc.vendor_err
    );
    completion_error(kind, wc, message)
}

/// The `io::Error` of kind `kind` for the failed work completion `wc`, told as `message`.
pub(crate) fn completion_error(
    kind: io::ErrorKind,
    wc: &WorkCompletion,
    message: String,
) -> io::Error {
    io::Error::new(
        kind,
        CompletionError::new(wc.status.0, wc.vendor_err, message),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{CompletionError, EarlierFailure, StickyError, cause};
    use crate::verbs::WcStatus;

    fn peer() -> std::net::SocketAddr {
        "10.0.0.2:7471".parse().unwrap()
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "names the status with libibverbs, a foreign call Miri cannot run"
    )]
    fn a_failed_completion_keeps_its_status_and_the_first_failure_wins() {
        let mut wc = WorkCompletion::EMPTY;
        wc.status = WcStatus(rdma_async_sys::ibv_wc_status::IBV_WC_RETRY_EXC_ERR);
        wc.vendor_err = 0x81;
        let sticky = StickyError::default();
        assert!(!sticky.is_set());
        assert!(sticky.report().is_none());
        assert!(sticky.set(wc_error(&wc, peer(), true)));
        assert!(
            !sticky.set(io::Error::other("later")),
            "the first failure stays"
        );
        for _ in 0..2 {
            let again = sticky.report_as("send refused").unwrap();
            assert_eq!(again.kind(), io::ErrorKind::TimedOut);
            let text = again.to_string();
            assert!(
                text.starts_with("send refused: the connection failed earlier (send to"),
                "{text}"
            );
            let wc_err = cause::<CompletionError>(&again).expect("the status behind the report");
            assert_eq!(wc_err.status(), 12);
            assert_eq!(wc_err.vendor_err(), 0x81);
            let earlier = again
                .get_ref()
                .unwrap()
                .downcast_ref::<EarlierFailure>()
                .unwrap();
            assert_eq!(earlier.first().kind(), io::ErrorKind::TimedOut);
        }
    }
}
