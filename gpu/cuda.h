/* cuda: the CUDA executor's inside (gpu/cuda.c, host side, C11) and its
 * kernels (gpu/cuda_kernels.cu, nvcc), plus two calls the dispatcher and
 * the benchmark make on a backend that rs_cuda_executor_create returned.
 *
 * A job on the device goes through one staging lane:
 *
 *     source files --pread--> pinned stage --H2D--> device stage
 *         --gather/cast kernel or 2D copies--> device result
 *         --D2H--> pinned result --memcpy--> job->dst
 *
 * The stage is packed: row r of op i lies at stage + stage_off[i] + r*len,
 * with every stage_off a multiple of RS_CUDA_ALIGN.  The kernels read the
 * planner's rs_copy_op array as it is, plus that offset array and a list
 * of pieces (below), and write each row where the op says: at
 * dst_off + r*dst_stride for a plain copy, at
 * (dst_off + r*dst_stride)/size(from)*size(to) as len/size(from) elements
 * of `to` for a cast (gpu/executor.h states the rule).
 *
 * Ownership: every pointer handed to the kernels is device memory the
 * caller owns (cuda.c's lanes); the kernels keep nothing.  Errors are
 * cudaError_t values, never logged here: cuda.c turns them into -ENODEV
 * and the text rs_cuda_last_error returns.
 *
 * This header is read by both compilers: plain C types only.
 */
#ifndef RS_CUDA_H
#define RS_CUDA_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "planner/dtype.h"
#include "planner/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Alignment of every op's rows in the stage, so the widest (16-byte)
 * copies and typed element loads apply whenever the op's own offsets
 * allow them. */
#define RS_CUDA_ALIGN 16u

/* One thread block's share of a job: rows [row, row+rows) of op `op`,
 * bytes [byte, byte+bytes) of each of those rows.  A piece covers at most
 * a few tens of KiB (cuda.c's PIECE_BYTES), so every index inside it fits
 * 32 bits; `byte` and `bytes` are multiples of RS_CUDA_ALIGN unless they
 * end the row, and of the source element size in a cast. */
typedef struct {
	uint32_t op;
	uint32_t row, rows;
	uint32_t byte, bytes;
} rs_cuda_piece;

/* Everything one launch needs; all pointers are device memory. */
typedef struct {
	const rs_copy_op *ops;          /* the job's ops, as planned */
	const uint64_t *stage_off;      /* per op: where its rows start */
	const rs_cuda_piece *pieces;
	uint32_t npieces;
	const uint8_t *stage;
	uint8_t *result;
	rs_dtype from, to;              /* a cast, or both RS_DTYPE_INVALID */
	uint32_t from_size, to_size;    /* rs_dtype_size of each (cast only) */
} rs_cuda_gather_args;

/* Enqueues the gather (or, when a->from != a->to, the cast) kernel on
 * `stream`: one block per piece.  Returns the launch's error (cudaSuccess
 * when it was queued); faults while it runs show up at the next
 * synchronisation. */
cudaError_t rs_cuda_launch_gather(cudaStream_t stream,
				  const rs_cuda_gather_args *a);

/* cudaSuccess when the current device can run this build's kernels (the
 * binary holds code for its architecture); cudaErrorNoKernelImageForDevice
 * or another error when not. */
cudaError_t rs_cuda_check_kernels(void);

/* --- for the dispatcher and the benchmark; `impl` is what
 * rs_cuda_executor_create returned --- */

/* The first device failure that made a device unusable, as one line
 * ("cuda device 0: cudaMemcpyAsync: an illegal memory access was
 * encountered"), or NULL when no device has failed.  The string lives as
 * long as the executor and never changes once returned. */
const char *rs_cuda_last_error(void *impl);

/* Bytes copied host to device (source rows and tables) and device to host
 * (results) by every job so far, and the device time spent in those
 * copies, in nanoseconds: CUDA events around each job's copies, summed
 * over lanes.  Two lanes copying the same way at once share the link and
 * both count the time, so bytes/ns is a lower bound on the link's rate.
 * Any pointer may be NULL. */
void rs_cuda_transfer_stats(void *impl, uint64_t *h2d_bytes, uint64_t *h2d_ns,
			    uint64_t *d2h_bytes, uint64_t *d2h_ns);

#ifdef __cplusplus
}
#endif

#endif
