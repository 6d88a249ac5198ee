//! [`RouteSlot`]: one entry of a datagram socket's route table, a route to one peer made once by
//! whichever sender needs it first, and what a datagram from that peer said about the way back
//! ([`ReplyPath`]) until then. A received datagram only records its reply path (a few dozen
//! bytes); the address handle is made when a send first needs it, off the runtime's threads,
//! since making it may block (see `AddressHandle::reply_to`).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::OnceCell;

use super::lru::LruMap;
use crate::verbs::{GRH_LEN, WorkCompletion};

/// What `ibv_create_ah_from_wc` needs to answer the sender of a received datagram: its
/// completion and the Global Route Header the device wrote in front of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplyPath {
    pub(crate) wc: WorkCompletion,
    pub(crate) grh: [u8; GRH_LEN],
    /// The sender numbers its datagrams to us (an rdma-async socket that knows us).
    pub(crate) sequenced: bool,
}

/// A route to one peer (`R`: the socket's `Arc<Route>`), made or being made, and the latest
/// reply path a datagram of the peer gave until it is made.
#[derive(Debug)]
pub(crate) struct RouteSlot<R> {
    route: OnceCell<R>,
    reply: Mutex<Option<ReplyPath>>,
}

impl<R> Default for RouteSlot<R> {
    fn default() -> Self {
        RouteSlot {
            route: OnceCell::new(),
            reply: Mutex::new(None),
        }
    }
}

impl<R> RouteSlot<R> {
    /// The route, once made.
    pub(crate) fn route(&self) -> Option<&R> {
        self.route.get()
    }

    fn reply(&self) -> std::sync::MutexGuard<'_, Option<ReplyPath>> {
        // A plain value replaced whole: a panic elsewhere cannot leave it half-changed.
        self.reply.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The route, made now if it is not yet: from the latest reply path with `from_reply`, or
    /// else with `resolve`. Concurrent callers share one making; a failed or cancelled one
    /// leaves the slot as it was (reply path included), so the next caller tries again.
    pub(crate) async fn get_or_make<FR, FS>(
        &self,
        from_reply: impl FnOnce(ReplyPath) -> FR,
        resolve: impl FnOnce() -> FS,
    ) -> io::Result<&R>
    where
        FR: Future<Output = io::Result<R>>,
        FS: Future<Output = io::Result<R>>,
    {
        let route = self
            .route
            .get_or_try_init(|| async {
                let reply = *self.reply();
                match reply {
                    Some(path) => from_reply(path).await,
                    None => resolve().await,
                }
            })
            .await?;
        // Made: the path is no longer needed.
        self.reply().take();
        Ok(route)
    }
}

/// Records the way back to `from` that one of its datagrams gave, unless a route to it is made:
/// the latest datagram's path replaces an older one, and the entry counts in the table's bound
/// like any route (a new sender can make the least recently used peer be forgotten).
pub(crate) fn note_reply_path<R>(
    routes: &mut LruMap<SocketAddr, Arc<RouteSlot<R>>>,
    from: SocketAddr,
    path: ReplyPath,
) {
    // Only sends keep a route recently used: a peek.
    if routes
        .peek(&from)
        .is_some_and(|slot| slot.route().is_some())
    {
        return;
    }
    let slot = routes.get_or_insert_with(from, Arc::default);
    *slot.reply() = Some(path);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    type Table = LruMap<SocketAddr, Arc<RouteSlot<u32>>>;

    fn path(src_qp: u32) -> ReplyPath {
        ReplyPath {
            wc: WorkCompletion {
                src_qp,
                ..WorkCompletion::EMPTY
            },
            grh: [0; GRH_LEN],
            sequenced: false,
        }
    }

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 77, 0, 1], port))
    }

    fn slot(table: &mut Table, port: u16) -> Arc<RouteSlot<u32>> {
        table.get_or_insert_with(addr(port), Arc::default).clone()
    }

    async fn unreachable_resolve() -> io::Result<u32> {
        panic!("a slot with a reply path is made from it")
    }

    #[test]
    fn thousands_of_new_senders_leave_at_most_max_peers_pending_paths() {
        let mut table = Table::new(64);
        for port in 0..5000u16 {
            note_reply_path(&mut table, addr(port), path(u32::from(port)));
            assert!(table.len() <= 64);
        }
        assert_eq!(table.len(), 64);
        let newest = table.peek(&addr(4999)).unwrap();
        assert_eq!(newest.reply().map(|p| p.wc.src_qp), Some(4999));
        assert!(table.peek(&addr(0)).is_none(), "the oldest were forgotten");
    }

    #[tokio::test]
    async fn a_reply_path_makes_the_route_and_the_latest_path_wins() {
        let mut table = Table::new(4);
        note_reply_path(&mut table, addr(1), path(7));
        note_reply_path(&mut table, addr(1), path(8));
        let slot = slot(&mut table, 1);
        let made = slot
            .get_or_make(|p| async move { Ok(p.wc.src_qp) }, unreachable_resolve)
            .await
            .unwrap();
        assert_eq!(*made, 8);
        assert!(slot.reply().is_none(), "the path is dropped once made");
        // A made route is kept: later datagrams record nothing, and no send makes it again.
        note_reply_path(&mut table, addr(1), path(9));
        assert!(slot.reply().is_none());
        let again = slot
            .get_or_make(|_| async { panic!("made twice") }, unreachable_resolve)
            .await
            .unwrap();
        assert_eq!(*again, 8);
    }

    #[tokio::test]
    async fn without_a_reply_path_the_peer_is_resolved() {
        let mut table = Table::new(4);
        let slot = slot(&mut table, 2);
        let made = slot
            .get_or_make(|_| async { panic!("no path") }, || async { Ok(42) })
            .await
            .unwrap();
        assert_eq!(*made, 42);
    }

    #[tokio::test]
    async fn a_failed_or_cancelled_making_leaves_the_path_for_the_next_send() {
        let mut table = Table::new(4);
        note_reply_path(&mut table, addr(3), path(5));
        let slot = slot(&mut table, 3);
        let err = slot
            .get_or_make(
                |_| async { Err(io::Error::other("ibv_create_ah_from_wc failed")) },
                unreachable_resolve,
            )
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "ibv_create_ah_from_wc failed");
        assert!(slot.route().is_none());
        // A send dropped while the handle is being made.
        let tries = AtomicUsize::new(0);
        let pending = slot.get_or_make(
            |_| async {
                tries.fetch_add(1, Ordering::Relaxed);
                std::future::pending().await
            },
            unreachable_resolve,
        );
        assert!(
            poll_once_then_drop(pending).await.is_none(),
            "the making is under way"
        );
        assert_eq!(tries.load(Ordering::Relaxed), 1);
        assert!(slot.route().is_none());
        let made = slot
            .get_or_make(|p| async move { Ok(p.wc.src_qp) }, unreachable_resolve)
            .await
            .unwrap();
        assert_eq!(*made, 5, "made from the path kept");
    }

    /// Polls `fut` once and drops it, as a `select!` that took another branch does.
    async fn poll_once_then_drop<F: Future>(fut: F) -> Option<F::Output> {
        let mut fut = std::pin::pin!(fut);
        std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
            std::task::Poll::Ready(v) => std::task::Poll::Ready(Some(v)),
            std::task::Poll::Pending => std::task::Poll::Ready(None),
        })
        .await
    }
}
