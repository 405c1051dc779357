/* emu_cudart: the part of the CUDA runtime the group's NCCL lane calls
 * (fs/group_nccl.c), on the host, for the test build (reshardfs-testhooks).
 *
 * One emulated device, 0.  Device memory is host memory.  A stream is a
 * worker thread running its queue in order (include/emu_stream.h), so an
 * operation the stand-in libnccl queues (fake_nccl.c) blocks what comes
 * after it, as on a GPU; an event is done when its stream has run what
 * was queued before it.  cudaFree waits for every stream to go idle, as
 * the real one synchronises the device.
 *
 * What it cannot check: real device memory, real kernels and copies, and
 * the errors a driver gives; NCCL itself is fake_nccl.c's.
 */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct op {
	int (*fn)(void *, int);
	void *arg;
	struct op *next;
} op;

typedef struct stream {
	struct emu_stream pub;
	op *head, *tail;
	uint64_t queued, done;
	bool quit, failed;
	struct stream *next;    /* the live streams */
} stream;

struct emu_event {
	stream *s;
	uint64_t mark;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static stream *streams;

static int enqueue(struct emu_stream *ps, int (*fn)(void *, int),
		   void *arg)
{
	stream *s = (stream *)ps;
	op *o = malloc(sizeof(*o));

	if (!o)
		return -1;
	*o = (op){ fn, arg, NULL };
	pthread_mutex_lock(&lock);
	if (s->tail)
		s->tail->next = o;
	else
		s->head = o;
	s->tail = o;
	s->queued++;
	pthread_cond_broadcast(&changed);
	pthread_mutex_unlock(&lock);
	return 0;
}

static void unlink_stream(stream *s)
{
	for (stream **p = &streams; *p; p = &(*p)->next)
		if (*p == s) {
			*p = s->next;
			return;
		}
}

static void *worker(void *arg)
{
	stream *s = arg;

	pthread_mutex_lock(&lock);
	for (;;) {
		op *o = s->head;

		if (!o) {
			if (s->quit)
				break;
			pthread_cond_wait(&changed, &lock);
			continue;
		}
		s->head = o->next;
		if (!s->head)
			s->tail = NULL;
		pthread_mutex_unlock(&lock);
		if (o->fn(o->arg, s->failed) != 0)
			s->failed = true;
		free(o);
		pthread_mutex_lock(&lock);
		s->done++;
		pthread_cond_broadcast(&changed);
	}
	unlink_stream(s);
	pthread_cond_broadcast(&changed);
	pthread_mutex_unlock(&lock);
	free(s);
	return NULL;
}

cudaError_t cudaSetDevice(int dev)
{
	return dev == 0 ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned flags)
{
	stream *s = calloc(1, sizeof(*s));
	pthread_t th;

	(void)flags;
	if (!s)
		return cudaErrorMemoryAllocation;
	s->pub.enqueue = enqueue;
	pthread_mutex_lock(&lock);
	if (pthread_create(&th, NULL, worker, s) != 0) {
		pthread_mutex_unlock(&lock);
		free(s);
		return cudaErrorMemoryAllocation;
	}
	pthread_detach(th);
	s->next = streams;
	streams = s;
	pthread_mutex_unlock(&lock);
	*out = &s->pub;
	return cudaSuccess;
}

/* The worker ends once its queue is run, and frees the stream. */
cudaError_t cudaStreamDestroy(cudaStream_t ps)
{
	pthread_mutex_lock(&lock);
	((stream *)ps)->quit = true;
	pthread_cond_broadcast(&changed);
	pthread_mutex_unlock(&lock);
	return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
	(void)flags;
	*e = calloc(1, sizeof(**e));
	return *e ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
	free(e);
	return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t ps)
{
	pthread_mutex_lock(&lock);
	e->s = (stream *)ps;
	e->mark = e->s->queued;
	pthread_mutex_unlock(&lock);
	return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
	cudaError_t r;

	pthread_mutex_lock(&lock);
	r = !e->s || e->s->done >= e->mark ? cudaSuccess : cudaErrorNotReady;
	pthread_mutex_unlock(&lock);
	return r;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
	*p = malloc(n ? n : 1);
	return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFree(void *p)
{
	pthread_mutex_lock(&lock);
	for (;;) {
		bool busy = false;

		for (stream *s = streams; s; s = s->next)
			busy |= s->done < s->queued;
		if (!busy)
			break;
		pthread_cond_wait(&changed, &lock);
	}
	pthread_mutex_unlock(&lock);
	free(p);
	return cudaSuccess;
}

typedef struct {
	void *dst;
	const void *src;
	size_t n;
} copy;

static int run_copy(void *arg, int skip)
{
	copy *c = arg;

	if (!skip)
		memcpy(c->dst, c->src, c->n);
	free(c);
	return 0;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
			    enum cudaMemcpyKind kind, cudaStream_t s)
{
	copy *c = malloc(sizeof(*c));

	(void)kind;
	if (!c)
		return cudaErrorMemoryAllocation;
	*c = (copy){ dst, src, n };
	if (s->enqueue(s, run_copy, c) != 0) {
		free(c);
		return cudaErrorMemoryAllocation;
	}
	return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n,
		       enum cudaMemcpyKind kind)
{
	(void)kind;
	memcpy(dst, src, n);
	return cudaSuccess;
}
