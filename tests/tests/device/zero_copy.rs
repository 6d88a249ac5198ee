//! `RStream::write_region`: stream bytes sent straight from registered memory, with no copy into
//! the send ring; the reader cannot tell them from ordinary writes.

use std::future::Future;
use std::io;
use std::pin::pin;
use std::task::Poll;

use rdma_async::device::DeviceContext;
use rdma_async::stream::RStreamOptions;
use rdma_async_device_tests::data::pattern;
use rdma_async_device_tests::{err_kind, guard, stream_pair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_streams_without_a_copy_and_arrives_intact() {
    const LEN: usize = 8 << 20;
    let (mut server, mut client) = stream_pair(RStreamOptions::new()).await;
    let data = pattern(7, LEN);
    let mut region = client.context().reg_msgs(LEN).unwrap();
    region.copy_from_slice(&data);
    let reader = tokio::spawn(async move {
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.map(|_| got)
    });
    // Some copied bytes first, then the region in two ranges, then copied bytes again: the
    // reader sees one ordered stream.
    client.write_all(b"head").await.unwrap();
    let (r, region) = guard("write_region", client.write_region(region, ..LEN / 2 + 3)).await;
    r.unwrap();
    let region = region.expect("the region comes back");
    let (r, region) = guard("write_region", client.write_region(region, LEN / 2 + 3..)).await;
    r.unwrap();
    let region = region.expect("the region comes back");
    assert_eq!(&region[..], &data[..], "the region is unchanged");
    client.write_all(b"tail").await.unwrap();
    client.shutdown().await.unwrap();
    let got = guard("read to EOF", reader).await.unwrap().unwrap();
    assert_eq!(got.len(), LEN + 8);
    assert_eq!(&got[..4], b"head");
    assert!(got[4..4 + LEN] == data[..], "the streamed region differs");
    assert_eq!(&got[4 + LEN..], b"tail");
    let stats = client.stats();
    assert_eq!(stats.zero_copy_bytes, LEN as u64, "{stats:?}");
    assert_eq!(stats.bytes_sent, LEN as u64 + 8, "{stats:?}");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ranges_and_foreign_regions_are_refused_and_handed_back() {
    let (_server, mut client) = stream_pair(RStreamOptions::new()).await;
    let region = client.context().reg_msgs(100).unwrap();
    let (r, region) = client.write_region(region, 50..101).await;
    let (kind, msg) = err_kind(r);
    assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
    assert!(msg.contains("outside the 100-byte region"), "{msg}");
    assert_eq!(region.expect("handed back").len(), 100);

    // A region of another device context (protection domain) than the stream's.
    let other = DeviceContext::open(client.context().device_name()).unwrap();
    let mut foreign = other.reg_msgs(16).unwrap();
    foreign.copy_from_slice(b"0123456789abcdef");
    let (r, foreign) = client.write_region(foreign, ..).await;
    let (kind, msg) = err_kind(r);
    assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
    assert!(msg.contains("another device context"), "{msg}");
    assert_eq!(&foreign.expect("handed back")[..], b"0123456789abcdef");
    assert_eq!(client.stats().zero_copy_bytes, 0);
    // The stream is still fine.
    client.write_all(b"ok").await.unwrap();
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_region_write_sends_a_prefix_and_leaves_the_stream_usable() {
    const LEN: usize = 4 << 20;
    let (mut server, mut client) = stream_pair(RStreamOptions::new()).await;
    let data = pattern(11, LEN);
    let mut region = client.context().reg_msgs(LEN).unwrap();
    region.copy_from_slice(&data);
    {
        // One poll posts what the reader's grants allow (far less than 4 MiB: nobody reads
        // yet), then the write waits for more; dropping it hands the region to the stream.
        let mut write = pin!(client.write_region(region, ..));
        let first = std::future::poll_fn(|cx| Poll::Ready(write.as_mut().poll(cx))).await;
        assert!(
            first.is_pending(),
            "4 MiB cannot fit the reader's ring at once"
        );
    }
    assert!(client.stats().zero_copy_bytes > 0);
    assert!(client.stats().zero_copy_bytes < LEN as u64);
    let mut got = Vec::new();
    let (read, ()) = guard("write the rest and read to EOF", async {
        tokio::join!(server.read_to_end(&mut got), async {
            client.write_all(b"after").await.unwrap();
            client.shutdown().await.unwrap();
        })
    })
    .await;
    read.unwrap();
    let prefix = client.stats().zero_copy_bytes as usize;
    assert_eq!(got.len(), prefix + 5);
    assert!(got[..prefix] == data[..prefix], "the sent prefix differs");
    assert_eq!(&got[prefix..], b"after");
}
