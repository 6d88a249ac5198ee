#include "shim.h"

int rdma_async_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	return ibv_post_send(qp, wr, bad_wr);
}

int rdma_async_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	return ibv_post_recv(qp, wr, bad_wr);
}

int rdma_async_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	return ibv_post_srq_recv(srq, wr, bad_wr);
}

int rdma_async_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, num_entries, wc);
}

int rdma_async_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return ibv_req_notify_cq(cq, solicited_only);
}

int rdma_async_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *port_attr)
{
	return ibv_query_port(context, port_num, port_attr);
}

/* ibv_reg_mr is a macro that picks between entry points by access flags; keep that choice in C. */
struct ibv_mr *rdma_async_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr(pd, addr, length, access);
}

struct ibv_mr *rdma_async_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
					int access)
{
	return ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access);
}

/* Allocates a memory window of `type` (IBV_MW_TYPE_1 or _2); NULL with errno set (EOPNOTSUPP when the
 * provider has none). */
struct ibv_mw *rdma_async_alloc_mw(struct ibv_pd *pd, int type)
{
	return ibv_alloc_mw(pd, (enum ibv_mw_type)type);
}

int rdma_async_dealloc_mw(struct ibv_mw *mw)
{
	return ibv_dealloc_mw(mw);
}

int rdma_async_query_odp_caps(struct ibv_context *context, uint64_t *general_caps, uint32_t *rc_odp_caps)
{
	struct ibv_device_attr_ex attr = { 0 };
	int ret = ibv_query_device_ex(context, NULL, &attr);

	if (ret)
		return ret;
	*general_caps = attr.odp_caps.general_caps;
	*rc_odp_caps = attr.odp_caps.per_transport_caps.rc_odp_caps;
	return 0;
}

int rdma_async_prefetch_mr(struct ibv_pd *pd, uint64_t addr, uint32_t length, uint32_t lkey)
{
	struct ibv_sge sge = { .addr = addr, .length = length, .lkey = lkey };

	return ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1);
}

struct sockaddr *rdma_async_get_local_addr(struct rdma_cm_id *id)
{
	return rdma_get_local_addr(id);
}

struct sockaddr *rdma_async_get_peer_addr(struct rdma_cm_id *id)
{
	return rdma_get_peer_addr(id);
}
