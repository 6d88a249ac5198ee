//! The fuzz targets are the binaries in `src/bin/`, one per decoder of peer input; their
//! harnesses (and the invariants they assert) are in `rdma_async::__fuzz`.
