/* Exported wrappers for the verbs that libibverbs and librdmacm define as static inline functions in
 * their headers. They dispatch through provider function pointers, so they must be compiled against
 * the installed headers rather than re-implemented in Rust. */
#ifndef RDMA_ASYNC_SHIM_H
#define RDMA_ASYNC_SHIM_H

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

int rdma_async_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
int rdma_async_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
int rdma_async_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
int rdma_async_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
int rdma_async_req_notify_cq(struct ibv_cq *cq, int solicited_only);
int rdma_async_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *port_attr);
struct ibv_mr *rdma_async_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access);
/* Registers a dma-buf; returns NULL with errno set (EOPNOTSUPP when the provider cannot). */
struct ibv_mr *rdma_async_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
					int access);
/* Allocates a memory window (type IBV_MW_TYPE_1 or _2); returns NULL with errno set (EOPNOTSUPP when the
 * provider has none). */
struct ibv_mw *rdma_async_alloc_mw(struct ibv_pd *pd, int type);
int rdma_async_dealloc_mw(struct ibv_mw *mw);
/* The device's on-demand paging capabilities (ibv_query_device_ex): 0, or an errno. */
int rdma_async_query_odp_caps(struct ibv_context *context, uint64_t *general_caps, uint32_t *rc_odp_caps);
/* Prefetches on-demand-paged memory (ibv_advise_mr, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE): 0, or an errno. */
int rdma_async_prefetch_mr(struct ibv_pd *pd, uint64_t addr, uint32_t length, uint32_t lkey);
struct sockaddr *rdma_async_get_local_addr(struct rdma_cm_id *id);
struct sockaddr *rdma_async_get_peer_addr(struct rdma_cm_id *id);

#endif
