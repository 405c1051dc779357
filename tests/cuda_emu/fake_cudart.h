/* fake_cudart: the controls of the stand-in CUDA runtime
 * (tests/cuda_emu/fake_cudart.c) that the emulator tests use to inject
 * failures.  The runtime itself is the CUDA runtime API of
 * <cuda_runtime_api.h>, for the subset gpu/cuda.c calls.
 *
 * What the stand-in cannot check - real timing, the real memory model,
 * warp-level behaviour, the errors a real driver gives - is listed at the
 * top of fake_cudart.c.
 */
#ifndef RS_FAKE_CUDART_H
#define RS_FAKE_CUDART_H

#include <stdbool.h>

/* Starts over with `ndev` devices (0: cudaGetDeviceCount fails with
 * cudaErrorNoDevice), none failed, nothing injected.  Aborts when device
 * memory, pinned memory, a stream or an event is still alive: call it with
 * no executor in existence.  The process starts as fake_cuda_reset(2). */
void fake_cuda_reset(int ndev);

/* The `nops`-th stream operation executed from now on (1: the next; any
 * stream, any device) fails with cudaErrorIllegalAddress, and its device
 * with it: from then on every call on that device fails, as after a
 * fault on a real one. */
void fake_cuda_fail_after(long nops);

/* Device `dev` fails at its next stream operation executed (as a fault in
 * running work would), with cudaErrorIllegalAddress; from then on every
 * call on it fails. */
void fake_cuda_kill_device(int dev);

/* After `n` more successful cudaMalloc calls, cudaMalloc fails with
 * cudaErrorMemoryAllocation (0: the next one fails; -1: never). */
void fake_cuda_oom_after(long n);

/* Whether cudaFuncGetAttributes says the kernels have no code for the
 * device (cudaErrorNoKernelImageForDevice), as on a GPU of an
 * architecture the build did not compile for. */
void fake_cuda_no_kernel_image(bool on);

/* The CUDA version the driver supports, as cudaDriverGetVersion gives it
 * (0: no driver).  Below this runtime's, cudaGetDeviceCount fails with
 * cudaErrorInsufficientDriver, as the real runtime does both without a
 * driver and with an older one.  fake_cuda_reset sets this runtime's. */
void fake_cuda_driver(int version);

typedef struct {
	long launches;      /* kernels launched */
	long threads;       /* kernel threads run */
	long copies;        /* cudaMemcpyAsync calls */
	long copies_2d;     /* cudaMemcpy2DAsync calls */
	long memsets;
	long ops;           /* stream operations executed */
	long live;          /* allocations, streams and events not freed */
} fake_cuda_counters;

void fake_cuda_get_counters(fake_cuda_counters *out);

#endif
