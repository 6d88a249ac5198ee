//! On a machine with no RDMA device, the API fails with a clear `io::Error`, never a panic.
//!
//! `scripts/test` runs this on the host (which has no device) with
//! `RDMA_ASYNC_EXPECT_NO_DEVICE=1`, so it cannot pass vacuously there.

use std::io;

use rdma_async::cm::CmListener;
use rdma_async::endpoint::{Endpoint, EndpointOptions};

/// Whether to run: on a machine with a device the behaviour under test cannot happen.
fn no_device_here() -> bool {
    let expected = std::env::var_os("RDMA_ASYNC_EXPECT_NO_DEVICE").is_some_and(|v| v == "1");
    let absent = rdma_async::__private::rdma_device_check().is_err();
    assert!(
        absent || !expected,
        "RDMA_ASYNC_EXPECT_NO_DEVICE=1 but this machine has an RDMA device"
    );
    if !absent {
        eprintln!("this machine has an RDMA device: the no-device checks do not apply");
    }
    absent
}

fn assert_no_device_error(err: &io::Error) {
    assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
    assert!(
        err.to_string().contains("no RDMA device"),
        "the message says why: {err}"
    );
}

#[tokio::test]
async fn connect_without_a_device_is_a_clear_error() {
    if !no_device_here() {
        return;
    }
    let err = Endpoint::connect_with("127.0.0.1:7471", &EndpointOptions::new())
        .await
        .unwrap_err();
    assert_no_device_error(&err);
}

#[tokio::test]
async fn bind_without_a_device_is_a_clear_error() {
    if !no_device_here() {
        return;
    }
    let err = CmListener::bind("0.0.0.0:0").await.unwrap_err();
    assert_no_device_error(&err);
}

#[test]
fn device_list_is_empty_or_a_clear_error_without_a_device() {
    if !no_device_here() {
        return;
    }
    match rdma_async::device::devices() {
        Ok(devices) => assert!(devices.is_empty(), "{devices:?}"),
        Err(err) => assert_no_device_error(&err),
    }
}
