/* Everything rdma-async-sys binds. The bindings in src/bindings.rs are generated from this file by
 * scripts/regen-bindings; shim.c gives the static inline verbs a real symbol. */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include "shim.h"
