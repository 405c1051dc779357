/* fake_cudart: a stand-in CUDA runtime, so that the CUDA executor's real
 * host code (gpu/cuda.c) and real kernel bodies (gpu/cuda_kernels.cu,
 * turned into host C++ by gen_emu.py) run on a machine without a GPU.
 * It implements the part of the runtime API gpu/cuda.c calls, from
 * <cuda_runtime_api.h> itself, so names and types are the toolkit's.
 *
 * The model:
 *  - two devices by default (fake_cudart.h changes that and injects
 *    failures); the current device is per host thread, as in CUDA;
 *  - device memory and pinned memory are host memory, filled with 0xCD
 *    when allocated (never zero), 256-byte aligned, with guard bytes on
 *    both sides that are checked at every synchronisation and at free (in
 *    a build with AddressSanitizer, allocations are exact instead and ASan
 *    checks every access, the kernels' too);
 *  - a stream is a queue: copies, memsets, event records and kernels are
 *    only recorded when issued and run, in order, when the stream is
 *    synchronised (or destroyed).  So a result the host reads before
 *    synchronising is wrong here, as it may be on a GPU; a copy's host
 *    source is compared, when the copy runs, with what it held when issued
 *    (a host write to a buffer in flight aborts), and a device-to-host
 *    copy's destination is overwritten with 0xCD when issued;
 *  - every copy and memset is checked against its allocations: the range
 *    must lie inside one allocation of the right kind (pinned for host
 *    ends, device memory of the stream's own device for device ends), and
 *    a stream or event must be used on its own device.  A violation is a
 *    bug in the host code: the process aborts with a message;
 *  - a device fails (fake_cuda_fail_after, fake_cuda_kill_device) while
 *    running a stream operation: that synchronisation and every later call
 *    made on it fail with cudaErrorIllegalAddress, as a real context does
 *    after a fault (the error is sticky);
 *  - at exit, memory, streams or events still alive fail the process.
 *
 * What it cannot check: real timing (events measure host time; nothing
 * runs concurrently with the host, and copies have no bandwidth), the real
 * memory model (nothing runs until synchronisation, then everything in
 * order; no caches, no reordering, no visibility between blocks, no
 * concurrency between streams of one device), warp-level behaviour (a
 * kernel's threads run one after another, so there is no divergence,
 * coalescing, bank conflicts or lock-step; gen_emu.py refuses the
 * constructs this would get wrong), resource limits (registers, launch
 * bounds, the device's memory size), and the errors a real driver gives:
 * only the injected ones, with their codes, happen here, at the points
 * this file chooses (a launch or copy that a driver would reject for a
 * reason not modelled here succeeds).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/cuda_emu/fake_cudart.h"

#ifndef __has_feature
#define __has_feature(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer)
#define GUARD 0         /* ASan's redzones do better */
#else
#define GUARD 256
#endif
#define GUARD_BYTE 0xFD
#define ALIGN 256
#define NDEV_MAX 16

/* --- state --- */

static pthread_mutex_t glock = PTHREAD_MUTEX_INITIALIZER;
static int ndev = 2;                    /* under glock */
static _Atomic int dead[NDEV_MAX];
static _Atomic int doomed[NDEV_MAX];    /* fails at its next operation */
static _Atomic long fail_at = -1;       /* value of `executed` that fails */
static _Atomic long oom_left = -1;
static _Atomic int no_image;
static _Atomic int driver = CUDART_VERSION;     /* 0: none */
static _Atomic unsigned launch_seq;
static _Atomic long n_launches, n_threads, n_copies, n_copies_2d, n_memsets,
	executed, n_streams, n_events;
static __thread int cur;
static __thread cudaError_t last;

typedef struct alloc {
	uint8_t *base, *p;
	size_t n;
	int dev;                /* device memory: its device */
	int host;               /* pinned host memory */
	struct alloc *next;
} alloc;
static alloc *allocs;                   /* under glock */

typedef enum { OP_COPY, OP_COPY_2D, OP_MEMSET, OP_EVENT, OP_KERNEL } op_kind;

typedef struct sop {
	op_kind kind;
	void *dst;
	const void *src;
	void *snapshot;         /* a host source as it was when issued */
	size_t n, w, h, dpitch, spitch;
	int val;
	struct CUevent_st *ev;
	void (*run)(void *, unsigned);
	void (*drop)(void *);
	void *arg;
	unsigned order;
	struct sop *next;
} sop;

struct CUstream_st {
	int dev;
	pthread_mutex_t lock;
	sop *head, *tail;
};

struct CUevent_st {
	int dev;
	int recorded;
	_Atomic int done;
	struct timespec t;
};

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "FAKE CUDA: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	abort();
}

static cudaError_t ret(cudaError_t e)
{
	if (e != cudaSuccess)
		last = e;
	return e;
}

static int device_count(void)
{
	int n;

	pthread_mutex_lock(&glock);
	n = ndev;
	pthread_mutex_unlock(&glock);
	return n;
}

/* The current device's state: cudaSuccess or the error every call on it
 * gives. */
static cudaError_t check_current(void)
{
	if (cur < 0 || cur >= device_count())
		return ret(cudaErrorInvalidDevice);
	if (atomic_load(&dead[cur]))
		return ret(cudaErrorIllegalAddress);
	return cudaSuccess;
}

/* --- controls (fake_cudart.h) --- */

void fake_cuda_reset(int n)
{
	if (n < 0 || n > NDEV_MAX)
		die("fake_cuda_reset(%d): 0 to %d devices", n, NDEV_MAX);
	if (atomic_load(&n_streams) || atomic_load(&n_events))
		die("fake_cuda_reset with %ld streams and %ld events alive",
		    atomic_load(&n_streams), atomic_load(&n_events));
	pthread_mutex_lock(&glock);
	if (allocs)
		die("fake_cuda_reset with memory still allocated (%zu bytes at %p)",
		    allocs->n, (void *)allocs->p);
	ndev = n;
	pthread_mutex_unlock(&glock);
	for (int i = 0; i < NDEV_MAX; i++) {
		atomic_store(&dead[i], 0);
		atomic_store(&doomed[i], 0);
	}
	atomic_store(&fail_at, -1);
	atomic_store(&oom_left, -1);
	atomic_store(&no_image, 0);
	atomic_store(&driver, CUDART_VERSION);
}

void fake_cuda_fail_after(long nops)
{
	atomic_store(&fail_at, atomic_load(&executed) + nops);
}

void fake_cuda_kill_device(int dev)
{
	if (dev < 0 || dev >= NDEV_MAX)
		die("fake_cuda_kill_device(%d)", dev);
	atomic_store(&doomed[dev], 1);
}

void fake_cuda_oom_after(long n)
{
	atomic_store(&oom_left, n);
}

void fake_cuda_no_kernel_image(bool on)
{
	atomic_store(&no_image, on);
}

void fake_cuda_driver(int version)
{
	atomic_store(&driver, version);
}

void fake_cuda_get_counters(fake_cuda_counters *out)
{
	long live = 0;

	pthread_mutex_lock(&glock);
	for (alloc *a = allocs; a; a = a->next)
		live++;
	pthread_mutex_unlock(&glock);
	out->launches = atomic_load(&n_launches);
	out->threads = atomic_load(&n_threads);
	out->copies = atomic_load(&n_copies);
	out->copies_2d = atomic_load(&n_copies_2d);
	out->memsets = atomic_load(&n_memsets);
	out->ops = atomic_load(&executed);
	out->live = live + atomic_load(&n_streams) + atomic_load(&n_events);
}

/* --- errors and devices --- */

const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "no error";
	case cudaErrorInvalidValue: return "invalid argument";
	case cudaErrorMemoryAllocation: return "out of memory";
	case cudaErrorInvalidConfiguration: return "invalid configuration argument";
	case cudaErrorInvalidPitchValue: return "invalid pitch argument";
	case cudaErrorInvalidDevice: return "invalid device ordinal";
	case cudaErrorNoDevice: return "no CUDA-capable device is detected";
	case cudaErrorInsufficientDriver:
		return "CUDA driver version is insufficient for CUDA runtime version";
	case cudaErrorNoKernelImageForDevice:
		return "no kernel image is available for execution on the device";
	case cudaErrorInvalidResourceHandle: return "invalid resource handle";
	case cudaErrorNotReady: return "device not ready";
	case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
	default: return "unknown error (fake runtime)";
	}
}

cudaError_t cudaGetLastError(void)
{
	cudaError_t e = last;

	last = cudaSuccess;
	/* a failed device's error is sticky */
	if (e == cudaSuccess && cur >= 0 && cur < NDEV_MAX && atomic_load(&dead[cur]))
		e = cudaErrorIllegalAddress;
	return e;
}

cudaError_t cudaPeekAtLastError(void)
{
	return last;
}

cudaError_t cudaGetDeviceCount(int *n)
{
	/* as the real runtime: no driver, or an older one, is this error */
	if (atomic_load(&driver) < CUDART_VERSION)
		return ret(cudaErrorInsufficientDriver);
	*n = device_count();
	return *n ? cudaSuccess : ret(cudaErrorNoDevice);
}

cudaError_t cudaDriverGetVersion(int *v)
{
	*v = atomic_load(&driver);
	return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
	*v = CUDART_VERSION;
	return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d)
{
	*d = cur;
	return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
	if (d < 0 || d >= device_count())
		return ret(cudaErrorInvalidDevice);
	cur = d;
	return check_current();
}

cudaError_t cudaSetDeviceFlags(unsigned flags)
{
	return check_current();
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d)
{
	if (d < 0 || d >= device_count())
		return ret(cudaErrorInvalidDevice);
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "Fake GPU %d", d);
	p->major = 9;
	p->minor = 0;
	p->multiProcessorCount = 132;
	p->maxThreadsPerBlock = 1024;
	p->warpSize = 32;
	p->totalGlobalMem = 80ull << 30;
	return cudaSuccess;
}

cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *a, const void *f)
{
	cudaError_t e = check_current();

	if (e != cudaSuccess)
		return e;
	if (!f)
		return ret(cudaErrorInvalidDeviceFunction);
	if (atomic_load(&no_image))
		return ret(cudaErrorNoKernelImageForDevice);
	memset(a, 0, sizeof(*a));
	a->maxThreadsPerBlock = 1024;
	return cudaSuccess;
}

/* --- memory --- */

/* Aborts when a byte around the allocation was written: a copy, memset
 * or kernel (or the host) went past its ends. */
static void check_guards(const alloc *a, const char *when)
{
#if GUARD
	const uint8_t *tail = a->p + a->n;
	size_t tail_n = (a->n + ALIGN - 1) / ALIGN * ALIGN - a->n + GUARD;

	for (size_t i = 0; i < GUARD; i++)
		if (a->base[i] != GUARD_BYTE)
			die("%s: %s memory of %zu bytes at %p: byte %zd before it "
			    "was written", when, a->host ? "pinned" : "device",
			    a->n, (void *)a->p, (ssize_t)i - GUARD);
	for (size_t i = 0; i < tail_n; i++)
		if (tail[i] != GUARD_BYTE)
			die("%s: %s memory of %zu bytes at %p: byte %zu past its "
			    "end was written", when, a->host ? "pinned" : "device",
			    a->n, (void *)a->p, i);
#else
	(void)a;
	(void)when;
#endif
}

static cudaError_t do_alloc(void **p, size_t n, int host)
{
	size_t body = (n + ALIGN - 1) / ALIGN * ALIGN;
	alloc *a;
	void *base;

	*p = NULL;
	if (!host) {
		long left = atomic_load(&oom_left);

		while (left >= 0) {
			if (left == 0)
				return ret(cudaErrorMemoryAllocation);
			if (atomic_compare_exchange_weak(&oom_left, &left, left - 1))
				break;
		}
	}
	if (posix_memalign(&base, ALIGN, GUARD ? body + 2 * GUARD : (n ? n : 1)))
		return ret(cudaErrorMemoryAllocation);
	a = malloc(sizeof(*a));
	if (!a)
		die("out of host memory");
	a->base = base;
	a->p = a->base + GUARD;
	a->n = n;
	a->dev = cur;
	a->host = host;
#if GUARD
	memset(a->base, GUARD_BYTE, GUARD);
	memset(a->p + n, GUARD_BYTE, body - n + GUARD);
#endif
	memset(a->p, 0xCD, n);          /* device memory is never zero */
	pthread_mutex_lock(&glock);
	a->next = allocs;
	allocs = a;
	pthread_mutex_unlock(&glock);
	*p = a->p;
	return cudaSuccess;
}

static cudaError_t do_free(void *p, int host)
{
	alloc *a = NULL;

	if (!p)
		return cudaSuccess;
	pthread_mutex_lock(&glock);
	for (alloc **pp = &allocs; *pp; pp = &(*pp)->next)
		if ((*pp)->p == p && (*pp)->host == host) {
			a = *pp;
			*pp = a->next;
			break;
		}
	pthread_mutex_unlock(&glock);
	if (!a)
		die("%s(%p): not a live %s allocation", host ? "cudaFreeHost" : "cudaFree",
		    p, host ? "pinned" : "device");
	check_guards(a, host ? "cudaFreeHost" : "cudaFree");
	free(a->base);
	free(a);
	if (!host && cur >= 0 && cur < NDEV_MAX && atomic_load(&dead[cur]))
		return ret(cudaErrorIllegalAddress);
	return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
	cudaError_t e = check_current();

	return e != cudaSuccess ? e : do_alloc(p, n, 0);
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags)
{
	return do_alloc(p, n, 1);
}

cudaError_t cudaFree(void *p)
{
	return do_free(p, 0);
}

cudaError_t cudaFreeHost(void *p)
{
	return do_free(p, 1);
}

/* [p, p+n) must lie in one allocation: pinned (host) or device memory of
 * device `dev`. */
static void need(const void *p, size_t n, int host, int dev, const char *what)
{
	const uint8_t *b = p;
	const alloc *found = NULL;

	pthread_mutex_lock(&glock);
	for (const alloc *a = allocs; a && !found; a = a->next)
		if (b >= a->p && b <= a->p + a->n && n <= (size_t)(a->p + a->n - b))
			found = a;
	pthread_mutex_unlock(&glock);
	if (!found)
		die("%s: [%p, +%zu) is not inside one allocation", what, p, n);
	if (found->host != host)
		die("%s: [%p, +%zu) is %s memory, %s memory expected", what, p, n,
		    found->host ? "pinned" : "device", host ? "pinned" : "device");
	if (!host && found->dev != dev)
		die("%s: [%p, +%zu) is memory of device %d, used on device %d",
		    what, p, n, found->dev, dev);
}

/* --- streams --- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
	cudaError_t e = check_current();

	if (e != cudaSuccess)
		return e;
	*s = calloc(1, sizeof(**s));
	if (!*s)
		die("out of host memory");
	(*s)->dev = cur;
	pthread_mutex_init(&(*s)->lock, NULL);
	atomic_fetch_add(&n_streams, 1);
	return cudaSuccess;
}

static void check_stream(cudaStream_t st, const char *what)
{
	if (!st)
		die("%s: the legacy default stream is not emulated", what);
	if (st->dev != cur)
		die("%s: a stream of device %d used while device %d is current",
		    what, st->dev, cur);
}

static sop *new_op(op_kind kind)
{
	sop *o = calloc(1, sizeof(*o));

	if (!o)
		die("out of host memory");
	o->kind = kind;
	return o;
}

static void enqueue(cudaStream_t st, sop *o)
{
	pthread_mutex_lock(&st->lock);
	if (st->tail)
		st->tail->next = o;
	else
		st->head = o;
	st->tail = o;
	pthread_mutex_unlock(&st->lock);
}

static void free_op(sop *o)
{
	if (o->kind == OP_KERNEL)
		o->drop(o->arg);
	free(o->snapshot);
	free(o);
}

static void run_op(sop *o)
{
	switch (o->kind) {
	case OP_COPY:
		if (o->snapshot && memcmp(o->snapshot, o->src, o->n) != 0)
			die("cudaMemcpyAsync: its pinned source [%p, +%zu) was "
			    "changed by the host while the copy was in flight",
			    o->src, o->n);
		memcpy(o->dst, o->src, o->n);
		break;
	case OP_COPY_2D:
		for (size_t r = 0; r < o->h; r++)
			memcpy((uint8_t *)o->dst + r * o->dpitch,
			       (const uint8_t *)o->src + r * o->spitch, o->w);
		break;
	case OP_MEMSET:
		memset(o->dst, o->val, o->n);
		break;
	case OP_EVENT:
		clock_gettime(CLOCK_MONOTONIC, &o->ev->t);
		atomic_store(&o->ev->done, 1);
		break;
	case OP_KERNEL:
		o->run(o->arg, o->order);
		break;
	}
}

/* Runs what `st` holds, in order.  A failed device ends the run: what is
 * left is dropped and the error returned. */
static cudaError_t drain(cudaStream_t st)
{
	sop *o;

	pthread_mutex_lock(&st->lock);
	o = st->head;
	st->head = st->tail = NULL;
	pthread_mutex_unlock(&st->lock);
	while (o) {
		sop *next = o->next;
		long k = atomic_fetch_add(&executed, 1) + 1;

		if (k == atomic_load(&fail_at) || atomic_load(&doomed[st->dev]))
			atomic_store(&dead[st->dev], 1);
		if (atomic_load(&dead[st->dev])) {
			while (o) {
				next = o->next;
				free_op(o);
				o = next;
			}
			return ret(cudaErrorIllegalAddress);
		}
		run_op(o);
		free_op(o);
		o = next;
	}
	pthread_mutex_lock(&glock);
	for (const alloc *a = allocs; a; a = a->next)
		if (a->host || a->dev == st->dev)
			check_guards(a, "after cudaStreamSynchronize");
	pthread_mutex_unlock(&glock);
	return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t st)
{
	if (!st)
		die("cudaStreamSynchronize: the legacy default stream is not emulated");
	if (atomic_load(&dead[st->dev])) {
		(void)drain(st);
		return ret(cudaErrorIllegalAddress);
	}
	return drain(st);
}

/* As in CUDA, work still queued completes (unless the device failed). */
cudaError_t cudaStreamDestroy(cudaStream_t st)
{
	cudaError_t e;

	if (!st)
		return ret(cudaErrorInvalidResourceHandle);
	e = drain(st);
	pthread_mutex_destroy(&st->lock);
	free(st);
	atomic_fetch_sub(&n_streams, 1);
	return e;
}

cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n,
			    enum cudaMemcpyKind k, cudaStream_t st)
{
	cudaError_t e = check_current();
	sop *o;

	if (e != cudaSuccess)
		return e;
	check_stream(st, "cudaMemcpyAsync");
	if (k != cudaMemcpyHostToDevice && k != cudaMemcpyDeviceToHost &&
	    k != cudaMemcpyDeviceToDevice)
		die("cudaMemcpyAsync: copy kind %d not emulated", (int)k);
	need(d, n, k == cudaMemcpyDeviceToHost, st->dev, "cudaMemcpyAsync (destination)");
	need(s, n, k == cudaMemcpyHostToDevice, st->dev, "cudaMemcpyAsync (source)");
	atomic_fetch_add(&n_copies, 1);
	o = new_op(OP_COPY);
	o->dst = d;
	o->src = s;
	o->n = n;
	if (k == cudaMemcpyHostToDevice && n) {
		o->snapshot = malloc(n);
		if (!o->snapshot)
			die("out of host memory");
		memcpy(o->snapshot, s, n);
	}
	if (k == cudaMemcpyDeviceToHost)
		memset(d, 0xCD, n);     /* not valid until synchronised */
	enqueue(st, o);
	return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void *d, size_t dpitch, const void *s,
			      size_t spitch, size_t w, size_t h,
			      enum cudaMemcpyKind k, cudaStream_t st)
{
	cudaError_t e = check_current();
	sop *o;

	if (e != cudaSuccess)
		return e;
	check_stream(st, "cudaMemcpy2DAsync");
	if (dpitch < w || spitch < w)
		return ret(cudaErrorInvalidPitchValue);
	if (k != cudaMemcpyDeviceToDevice)
		die("cudaMemcpy2DAsync: only device-to-device copies are emulated");
	if (w == 0 || h == 0)
		return cudaSuccess;
	need(d, (h - 1) * dpitch + w, 0, st->dev, "cudaMemcpy2DAsync (destination)");
	need(s, (h - 1) * spitch + w, 0, st->dev, "cudaMemcpy2DAsync (source)");
	atomic_fetch_add(&n_copies_2d, 1);
	o = new_op(OP_COPY_2D);
	o->dst = d;
	o->src = s;
	o->dpitch = dpitch;
	o->spitch = spitch;
	o->w = w;
	o->h = h;
	enqueue(st, o);
	return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st)
{
	cudaError_t e = check_current();
	sop *o;

	if (e != cudaSuccess)
		return e;
	check_stream(st, "cudaMemsetAsync");
	need(d, n, 0, st->dev, "cudaMemsetAsync");
	atomic_fetch_add(&n_memsets, 1);
	o = new_op(OP_MEMSET);
	o->dst = d;
	o->val = v;
	o->n = n;
	enqueue(st, o);
	return cudaSuccess;
}

/* A kernel launch (gen_emu.py's rs_emu::launch): `run(arg, order)` runs
 * every thread, `drop(arg)` frees `arg`; both called once. */
cudaError_t fake_cuda_enqueue_kernel(cudaStream_t st, dim3 grid, dim3 block,
				     size_t shmem, void (*run)(void *, unsigned),
				     void (*drop)(void *), void *arg)
{
	cudaError_t e = check_current();
	uint64_t threads = (uint64_t)block.x * block.y * block.z;
	sop *o;

	if (e != cudaSuccess) {
		drop(arg);
		return e;
	}
	check_stream(st, "kernel launch");
	if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z ||
	    grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535 ||
	    block.x > 1024 || block.y > 1024 || block.z > 64 || threads > 1024 ||
	    shmem > 48 * 1024) {
		drop(arg);
		return ret(cudaErrorInvalidConfiguration);
	}
	atomic_fetch_add(&n_launches, 1);
	atomic_fetch_add(&n_threads, (long)((uint64_t)grid.x * grid.y * grid.z * threads));
	o = new_op(OP_KERNEL);
	o->run = run;
	o->drop = drop;
	o->arg = arg;
	o->order = atomic_fetch_add(&launch_seq, 1) % 4;
	enqueue(st, o);
	return cudaSuccess;
}

/* --- events --- */

cudaError_t cudaEventCreate(cudaEvent_t *ev)
{
	cudaError_t e = check_current();

	if (e != cudaSuccess)
		return e;
	*ev = calloc(1, sizeof(**ev));
	if (!*ev)
		die("out of host memory");
	(*ev)->dev = cur;
	atomic_fetch_add(&n_events, 1);
	return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t ev)
{
	if (!ev)
		return ret(cudaErrorInvalidResourceHandle);
	free(ev);
	atomic_fetch_sub(&n_events, 1);
	return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t st)
{
	cudaError_t e = check_current();
	sop *o;

	if (e != cudaSuccess)
		return e;
	check_stream(st, "cudaEventRecord");
	if (ev->dev != st->dev)
		die("cudaEventRecord: an event of device %d on a stream of device %d",
		    ev->dev, st->dev);
	ev->recorded = 1;
	atomic_store(&ev->done, 0);
	o = new_op(OP_EVENT);
	o->ev = ev;
	enqueue(st, o);
	return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
	cudaError_t e = check_current();

	if (e != cudaSuccess)
		return e;
	if (!a->recorded || !b->recorded)
		return ret(cudaErrorInvalidResourceHandle);
	if (!atomic_load(&a->done) || !atomic_load(&b->done))
		return ret(cudaErrorNotReady);
	*ms = (float)((double)(b->t.tv_sec - a->t.tv_sec) * 1e3 +
		      (double)(b->t.tv_nsec - a->t.tv_nsec) / 1e6);
	return cudaSuccess;
}

/* At exit: a summary, and a failure when anything is still allocated
 * (gpu/cuda.c's destroy must free every lane). */
__attribute__((destructor)) static void at_exit(void)
{
	fake_cuda_counters c;

	fake_cuda_get_counters(&c);
	fprintf(stderr, "FAKE CUDA: %ld kernel launches (%ld threads), %ld copies, "
		"%ld 2D copies, %ld memsets, %ld stream operations run\n",
		c.launches, c.threads, c.copies, c.copies_2d, c.memsets, c.ops);
	if (c.live) {
		fprintf(stderr, "FAKE CUDA: %ld allocations, streams or events never "
			"freed\n", c.live);
		fflush(NULL);
		_exit(1);
	}
}
