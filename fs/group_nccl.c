/* The group's NCCL lane (group_lane.h): extent payloads GPU to GPU.
 *
 * Built where CMake finds the CUDA toolkit, nccl.h and MPI.  libnccl is
 * loaded at run time (dlopen of libnccl.so.2), so the daemon starts
 * where it is missing and the group goes on over MPI; the header gives
 * only the types.  The CUDA runtime is the executor's (linked
 * statically), on the executor's first device.
 *
 * One staging buffer on the device holds the one payload in flight.  A
 * send copies the reply into it and posts ncclSend; a receive posts
 * ncclRecv and, once an event after it has completed, copies the bytes
 * out into host memory, where the group keeps extents (the executors read
 * them as sources).  The communicator is non-blocking, so no call here
 * waits on a peer: completion is polled (cudaEventQuery,
 * ncclCommGetAsyncError), and a lane that must give up calls
 * ncclCommAbort.
 *
 * Not run on a GPU yet: see docs/TESTING.md.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "fs/clock.h"
#include "fs/group_lane.h"
#include "fs/log.h"

/* The entry points used, as libnccl exports them. */
#define NCCL_FUNCS(X)                                                        \
	X(ncclGetUniqueId, ncclResult_t, (ncclUniqueId *))                   \
	X(ncclCommInitRankConfig, ncclResult_t,                              \
	  (ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *))            \
	X(ncclCommGetAsyncError, ncclResult_t, (ncclComm_t, ncclResult_t *)) \
	X(ncclCommAbort, ncclResult_t, (ncclComm_t))                         \
	X(ncclSend, ncclResult_t,                                            \
	  (const void *, size_t, ncclDataType_t, int, ncclComm_t,            \
	   cudaStream_t))                                                    \
	X(ncclRecv, ncclResult_t,                                            \
	  (void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t))   \
	X(ncclGetErrorString, const char *, (ncclResult_t))

typedef struct {
#define X(name, ret, args) ret(*name) args;
	NCCL_FUNCS(X)
#undef X
} nccl_api;

enum { IDLE = 0, ENQUEUING, POSTED };

typedef struct {
	rs_group_lane pub;
	nccl_api api;
	ncclComm_t comm;
	cudaStream_t stream;
	cudaEvent_t done;
	void *staging;          /* device, pub.max_len bytes */
	int device;
	int state;
	bool recv;
	size_t len;
} nccl_lane;

/* libnccl.so.2 and its entry points, or -ENOTSUP.  Not unloaded: its
 * threads may outlive a lane. */
static int load(nccl_api *api)
{
	const char *lib = "libnccl.so.2";
	void *dl;

#ifdef RS_GROUP_TEST_HOOKS
	/* The test build's stand-in (tests/nccl_emu/fake_nccl.c). */
	if (getenv("RESHARDFS_TEST_NCCL_LIB"))
		lib = getenv("RESHARDFS_TEST_NCCL_LIB");
#endif
	dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!dl)
		return -ENOTSUP;
#define X(name, ret, args)                                                   \
	*(void **)&api->name = dlsym(dl, #name);                             \
	if (!api->name)                                                      \
		return -ENOTSUP;
	NCCL_FUNCS(X)
#undef X
	return 0;
}

bool rs_group_lane_nccl_available(void)
{
	nccl_api api;

	return load(&api) == 0;
}

/* The operation just issued: posted, or still being enqueued by the
 * non-blocking communicator. */
static int issued(nccl_lane *l, ncclResult_t r)
{
	if (r == ncclInProgress) {
		l->state = ENQUEUING;
		return 0;
	}
	if (r != ncclSuccess)
		return -EIO;
	if (cudaEventRecord(l->done, l->stream) != cudaSuccess)
		return -EIO;
	l->state = POSTED;
	return 0;
}

static int nccl_post_send(rs_group_lane *pl, int peer, const void *buf,
			  size_t len)
{
	nccl_lane *l = (nccl_lane *)pl;

	if (len > pl->max_len || l->state != IDLE)
		return -EINVAL;
	if (cudaSetDevice(l->device) != cudaSuccess ||
	    cudaMemcpyAsync(l->staging, buf, len, cudaMemcpyHostToDevice,
			    l->stream) != cudaSuccess)
		return -EIO;
	l->recv = false;
	l->len = len;
	return issued(l, l->api.ncclSend(l->staging, len, ncclUint8, peer,
					 l->comm, l->stream));
}

static int nccl_post_recv(rs_group_lane *pl, int peer, size_t len)
{
	nccl_lane *l = (nccl_lane *)pl;

	if (len > pl->max_len || l->state != IDLE)
		return -EINVAL;
	if (cudaSetDevice(l->device) != cudaSuccess)
		return -EIO;
	l->recv = true;
	l->len = len;
	return issued(l, l->api.ncclRecv(l->staging, len, ncclUint8, peer,
					 l->comm, l->stream));
}

static int nccl_test(rs_group_lane *pl, void **buf)
{
	nccl_lane *l = (nccl_lane *)pl;
	ncclResult_t async = ncclSuccess;
	cudaError_t e;
	void *host;

	if (cudaSetDevice(l->device) != cudaSuccess)
		return -EIO;
	if (l->api.ncclCommGetAsyncError(l->comm, &async) != ncclSuccess ||
	    (async != ncclSuccess && async != ncclInProgress))
		return -EIO;
	if (l->state == ENQUEUING) {
		if (async == ncclInProgress)
			return 0;
		if (issued(l, ncclSuccess) != 0)
			return -EIO;
	}
	e = cudaEventQuery(l->done);
	if (e == cudaErrorNotReady)
		return 0;
	if (e != cudaSuccess)
		return -EIO;
	l->state = IDLE;
	if (!l->recv)
		return 1;
	host = malloc(l->len ? l->len : 1);
	if (!host)
		return -ENOMEM;
	if (cudaMemcpy(host, l->staging, l->len, cudaMemcpyDeviceToHost) !=
	    cudaSuccess) {
		free(host);
		return -EIO;
	}
	*buf = host;
	return 1;
}

static void nccl_abort(rs_group_lane *pl)
{
	nccl_lane *l = (nccl_lane *)pl;

	if (l->comm) {
		cudaSetDevice(l->device);
		l->api.ncclCommAbort(l->comm);
		l->comm = NULL;
	}
	l->state = IDLE;
}

static void nccl_free(rs_group_lane *pl)
{
	nccl_lane *l = (nccl_lane *)pl;

	/* Abort, not destroy: destroy waits for peers, which may be gone. */
	nccl_abort(pl);
	cudaSetDevice(l->device);
	if (l->staging)
		cudaFree(l->staging);
	if (l->done)
		cudaEventDestroy(l->done);
	if (l->stream)
		cudaStreamDestroy(l->stream);
	free(l);
}

/* The device side of the lane, before NCCL: 0 or -errno. */
static int open_device(nccl_lane *l, rs_diag *d)
{
	if (cudaSetDevice(l->device) != cudaSuccess ||
	    cudaStreamCreateWithFlags(&l->stream, cudaStreamNonBlocking) !=
		    cudaSuccess ||
	    cudaEventCreateWithFlags(&l->done, cudaEventDisableTiming) !=
		    cudaSuccess ||
	    cudaMalloc(&l->staging, l->pub.max_len) != cudaSuccess) {
		rs_diag_add(d, "group: NCCL lane: cannot set up CUDA device %d",
			    l->device);
		return -EIO;
	}
	return 0;
}

/* Joins the communicator within the group timeout, or 30 s if that is
 * shorter: a communicator of many nodes takes seconds to set up, and a
 * member that gives up only costs the lane (every member then goes on
 * over MPI). */
static int join(nccl_lane *l, ncclUniqueId id, int rank, int size,
		unsigned timeout_ms, rs_diag *d)
{
	ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
	ncclResult_t r, async = ncclInProgress;
	uint64_t deadline = rs_now_ns() +
			    (timeout_ms > 30000 ? timeout_ms : 30000) * 1000000ull;

	cfg.blocking = 0;
	r = l->api.ncclCommInitRankConfig(&l->comm, size, id, rank, &cfg);
	if (r != ncclSuccess && r != ncclInProgress)
		goto fail;
	while (l->api.ncclCommGetAsyncError(l->comm, &async) == ncclSuccess &&
	       async == ncclInProgress && rs_now_ns() < deadline)
		usleep(1000);
	r = async;
	if (r == ncclSuccess)
		return 0;
fail:
	rs_diag_add(d, "group: NCCL lane: joining the communicator failed: %s",
		    r == ncclInProgress ? "timed out"
					: l->api.ncclGetErrorString(r));
	return -EIO;
}

int rs_group_lane_nccl(rs_group_lane **out, rs_group_transport *t,
		       int device, unsigned timeout_ms, rs_diag *d)
{
	nccl_lane *l = calloc(1, sizeof(*l));
	ncclUniqueId id, *ids;
	int err = l ? load(&l->api) : -ENOMEM;

	memset(&id, 0, sizeof(id));
	if (l) {
		l->device = device;
		l->pub = (rs_group_lane){ "nccl", RS_GROUP_EXTENT + 4096,
					  nccl_post_send, nccl_post_recv,
					  nccl_test, nccl_abort, nccl_free };
	}
	if (!err)
		err = open_device(l, d);
	/* Every member takes part in the exchange, failed or not. */
	if (!err && t->rank == 0 && l->api.ncclGetUniqueId(&id) != ncclSuccess)
		err = -EIO;
	ids = malloc((size_t)t->size * sizeof(*ids));
	if (!ids || t->allgather(t, &id, sizeof(id), ids) != 0) {
		err = -EIO;
	} else if (!err) {
		err = join(l, ids[0], t->rank, t->size, timeout_ms, d);
	}
	free(ids);
	if (err) {
		if (l && err == -ENOTSUP)
			rs_diag_add(d, "group: NCCL lane: libnccl.so.2 not found");
		if (l)
			nccl_free(&l->pub);
		return err;
	}
	*out = &l->pub;
	return 0;
}
