/* Stand-in for the toolkit's <cuda_runtime_api.h>, for fs/group_nccl.c in
 * the test build only (tests/nccl_emu/CMakeLists.txt): the types and the
 * calls the NCCL lane makes, renamed to emu_* so that they do not clash
 * with the real runtime the CUDA executor links.  They are implemented by
 * emu_cudart.c. */
#ifndef RS_EMU_CUDA_RUNTIME_API_H
#define RS_EMU_CUDA_RUNTIME_API_H

#include <stddef.h>

#include "emu_stream.h"

typedef enum {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorNotReady = 600,
} cudaError_t;

enum cudaMemcpyKind {
	cudaMemcpyHostToDevice = 1,
	cudaMemcpyDeviceToHost = 2,
};

#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02

typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;

#define cudaSetDevice emu_cudaSetDevice
#define cudaStreamCreateWithFlags emu_cudaStreamCreateWithFlags
#define cudaStreamDestroy emu_cudaStreamDestroy
#define cudaEventCreateWithFlags emu_cudaEventCreateWithFlags
#define cudaEventDestroy emu_cudaEventDestroy
#define cudaEventRecord emu_cudaEventRecord
#define cudaEventQuery emu_cudaEventQuery
#define cudaMalloc emu_cudaMalloc
#define cudaFree emu_cudaFree
#define cudaMemcpyAsync emu_cudaMemcpyAsync
#define cudaMemcpy emu_cudaMemcpy

cudaError_t cudaSetDevice(int dev);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
			    enum cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n,
		       enum cudaMemcpyKind kind);

#endif
