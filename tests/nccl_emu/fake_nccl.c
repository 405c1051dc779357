/* fake_nccl: a stand-in libnccl.so.2 for the group's NCCL lane
 * (fs/group_nccl.c) in the test build, loaded through
 * RESHARDFS_TEST_NCCL_LIB.  It keeps what the lane's design depends on:
 *
 *  - point-to-point operations run on the caller's stream, in the order
 *    issued (the stream's worker, include/emu_stream.h), and a send does
 *    not complete until the peer's receive takes its bytes (each ordered
 *    pair of ranks is a FIFO in a directory named by the unique id,
 *    whose buffer is far smaller than a payload).  So two operations
 *    issued in a bad order deadlock here as they would on GPUs;
 *  - the communicator is non-blocking when asked: init and some sends and
 *    receives return ncclInProgress, and ncclCommGetAsyncError says
 *    ncclInProgress a few times before ncclSuccess;
 *  - a peer that dies makes a transfer fail (EOF or EPIPE), which
 *    ncclCommGetAsyncError reports; ncclCommAbort makes blocked
 *    operations fail at once.
 *
 * FAKE_NCCL_STALL_RANK=<rank>: that rank's sends never complete (until
 * it aborts).  What it cannot check: NCCL's own protocols, GPU memory,
 * real networks and real timing.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nccl.h>

struct ncclComm {
	int rank, n;
	char dir[NCCL_UNIQUE_ID_BYTES];
	int *out, *in;          /* per peer: FIFO fds, -1 until opened */
	bool *heard;            /* per peer: a writer has been seen */
	bool blocking, stall;
	_Atomic bool aborted;
	_Atomic int error;      /* ncclResult_t of a failed transfer */
	_Atomic int in_progress;/* GetAsyncError answers still to delay */
	_Atomic unsigned calls;
};

typedef struct {
	ncclComm_t comm;
	int peer;
	char *buf;
	size_t len;
	bool send;
} transfer;

static void fifo_path(char *out, size_t cap, ncclComm_t c, int from, int to)
{
	snprintf(out, cap, "%s/%d-%d", c->dir, from, to);
}

static void fail(ncclComm_t c, ncclResult_t r)
{
	int ok = ncclSuccess;

	atomic_compare_exchange_strong(&c->error, &ok, r);
}

/* Waits up to 10 ms for fd, or for a stall to pass. */
static void wait_fd(int fd, short events)
{
	struct pollfd p = { fd, events, 0 };

	if (fd < 0 || poll(&p, 1, 10) < 0)
		usleep(1000);
}

static int run_send(transfer *t)
{
	ncclComm_t c = t->comm;
	size_t at = 0;
	char path[NCCL_UNIQUE_ID_BYTES + 32];

	fifo_path(path, sizeof(path), c, c->rank, t->peer);
	while (!atomic_load(&c->aborted)) {
		if (c->stall) {
			usleep(1000);
			continue;
		}
		if (c->out[t->peer] < 0) {
			/* ENXIO: no reader yet; ENOENT: the peer has not
			 * joined yet. */
			c->out[t->peer] = open(path, O_WRONLY | O_NONBLOCK);
			if (c->out[t->peer] < 0) {
				if (errno != ENXIO && errno != ENOENT)
					return ncclSystemError;
				usleep(1000);
				continue;
			}
		}
		if (at == t->len)
			return ncclSuccess;
		ssize_t w = write(c->out[t->peer], t->buf + at, t->len - at);

		if (w > 0) {
			at += (size_t)w;
		} else if (w < 0 && errno == EAGAIN) {
			wait_fd(c->out[t->peer], POLLOUT);
		} else {
			return ncclRemoteError;     /* EPIPE: the peer is gone */
		}
	}
	return ncclInvalidUsage;
}

static int run_recv(transfer *t)
{
	ncclComm_t c = t->comm;
	size_t at = 0;

	while (!atomic_load(&c->aborted)) {
		if (at == t->len)
			return ncclSuccess;
		ssize_t r = read(c->in[t->peer], t->buf + at, t->len - at);

		if (r > 0) {
			at += (size_t)r;
			c->heard[t->peer] = true;
		} else if (r == 0 && c->heard[t->peer]) {
			return ncclRemoteError;     /* the writer is gone */
		} else if (r == 0) {
			usleep(1000);               /* no writer yet */
		} else if (errno == EAGAIN) {
			wait_fd(c->in[t->peer], POLLIN);
		} else {
			return ncclSystemError;
		}
	}
	return ncclInvalidUsage;
}

static int run_transfer(void *arg, int skip)
{
	transfer *t = arg;
	int r = skip ? ncclInvalidUsage
		     : t->send ? run_send(t) : run_recv(t);

	if (r != ncclSuccess)
		fail(t->comm, (ncclResult_t)r);
	free(t);
	return r != ncclSuccess;
}

/* In a non-blocking communicator, every third call says ncclInProgress,
 * and the next two queries of the async error too. */
static ncclResult_t started(ncclComm_t c)
{
	if (c->blocking || atomic_fetch_add(&c->calls, 1) % 3)
		return ncclSuccess;
	atomic_store(&c->in_progress, 2);
	return ncclInProgress;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
	char dir[] = "/tmp/fake-nccl-XXXXXX";

	if (!mkdtemp(dir))
		return ncclSystemError;
	memset(id, 0, sizeof(*id));
	memcpy(id->internal, dir, sizeof(dir));
	return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int n, ncclUniqueId id,
				    int rank, ncclConfig_t *cfg)
{
	ncclComm_t c = calloc(1, sizeof(*c));
	const char *stall = getenv("FAKE_NCCL_STALL_RANK");
	char path[NCCL_UNIQUE_ID_BYTES + 32];

	if (!c || n < 1 || rank < 0 || rank >= n ||
	    !memchr(id.internal, 0, sizeof(id.internal)) || !id.internal[0])
		goto fail;
	memcpy(c->dir, id.internal, sizeof(c->dir));
	c->rank = rank;
	c->n = n;
	c->blocking = !cfg || cfg->blocking;
	c->stall = stall && atoi(stall) == rank;
	c->out = malloc((size_t)n * sizeof(int));
	c->in = malloc((size_t)n * sizeof(int));
	c->heard = calloc((size_t)n, sizeof(bool));
	if (!c->out || !c->in || !c->heard)
		goto fail;
	signal(SIGPIPE, SIG_IGN);
	for (int p = 0; p < n; p++) {
		c->out[p] = c->in[p] = -1;
		if (p == rank)
			continue;
		fifo_path(path, sizeof(path), c, p, rank);
		if (mkfifo(path, 0600) != 0 && errno != EEXIST)
			goto fail;
		c->in[p] = open(path, O_RDONLY | O_NONBLOCK);
		if (c->in[p] < 0)
			goto fail;
		fcntl(c->in[p], F_SETPIPE_SZ, 64 << 10);
	}
	*out = c;
	return started(c) == ncclInProgress && !c->blocking ? ncclInProgress
							  : ncclSuccess;
fail:
	if (c) {
		free(c->out);
		free(c->in);
		free(c->heard);
	}
	free(c);
	return ncclSystemError;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *r)
{
	int left = atomic_load(&c->in_progress);

	if (left > 0 && atomic_compare_exchange_strong(&c->in_progress, &left,
						       left - 1)) {
		*r = ncclInProgress;
		return ncclSuccess;
	}
	*r = (ncclResult_t)atomic_load(&c->error);
	return ncclSuccess;
}

/* The fds and the communicator are left to the process's exit: the
 * stream's worker may still be inside a transfer. */
ncclResult_t ncclCommAbort(ncclComm_t c)
{
	char path[NCCL_UNIQUE_ID_BYTES + 32];

	atomic_store(&c->aborted, true);
	for (int p = 0; p < c->n; p++)
		if (p != c->rank) {
			fifo_path(path, sizeof(path), c, p, c->rank);
			unlink(path);
		}
	if (c->rank == 0)
		rmdir(c->dir);
	return ncclSuccess;
}

static ncclResult_t post(const void *buf, size_t len, ncclDataType_t type,
			 int peer, ncclComm_t c, cudaStream_t s, bool send)
{
	transfer *t;

	if (atomic_load(&c->aborted) || type != ncclUint8 || peer < 0 ||
	    peer >= c->n || peer == c->rank)
		return ncclInvalidUsage;
	t = malloc(sizeof(*t));
	if (!t)
		return ncclSystemError;
	*t = (transfer){ c, peer, (char *)buf, len, send };
	if (s->enqueue(s, run_transfer, t) != 0) {
		free(t);
		return ncclSystemError;
	}
	return started(c);
}

ncclResult_t ncclSend(const void *buf, size_t len, ncclDataType_t type,
		      int peer, ncclComm_t c, cudaStream_t s)
{
	return post(buf, len, type, peer, c, s, true);
}

ncclResult_t ncclRecv(void *buf, size_t len, ncclDataType_t type, int peer,
		      ncclComm_t c, cudaStream_t s)
{
	return post(buf, len, type, peer, c, s, false);
}

const char *ncclGetErrorString(ncclResult_t r)
{
	return r == ncclSuccess ? "no error"
	       : r == ncclInProgress ? "operation in progress"
	       : r == ncclRemoteError ? "remote process exited or there was a network error"
	       : r == ncclInvalidUsage ? "invalid usage"
	       : "system error";
}
