/* A build without the NCCL lane (no CUDA toolkit, nccl.h or MPI at build
 * time): the group's payloads go over its transport (see group_lane.h). */
#include <errno.h>

#include "fs/group_lane.h"

int rs_group_lane_nccl(rs_group_lane **out, rs_group_transport *t,
		       int device, unsigned timeout_ms, rs_diag *d)
{
	(void)out;
	(void)t;
	(void)device;
	(void)timeout_ms;
	rs_diag_add(d, "group: this reshardfs was built without the NCCL lane (it needs the CUDA toolkit, NCCL's nccl.h and MPI at build time)");
	return -ENOTSUP;
}

bool rs_group_lane_nccl_available(void)
{
	return false;
}
