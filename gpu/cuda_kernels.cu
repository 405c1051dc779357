/* The CUDA executor's kernels: row gathers and casts from the packed stage
 * into the result buffer (gpu/cuda.h has the layout and the contract).
 *
 * One thread block per piece.  A piece's rows are walked as one flat index
 * space when they are short (so a block of 256 threads is not left idle on
 * 64-byte rows) and row by row when a row alone fills the block (no
 * division per element).  Plain copies move 16, 8, 4, 2 or 1 bytes per
 * thread, the widest that every address and pitch of the piece allows.
 *
 * Casts use planner/cast_bits.h, the same integer arithmetic the CPU executor
 * compiles, so both give identical bits.  The pairs a view converts most
 * (f32 states to bf16/f16, bf16 weights to f32) get their own
 * instantiation with typed loads and no switch in the inner loop; the rest
 * go through rs_load_f32_bits/rs_store_f32_bits.  Typed loads are aligned:
 * the stage places each op at a multiple of 16, and the host refuses a cast
 * whose len, dst_off or dst_stride is not a whole number of elements.
 */
#include "gpu/cuda.h"
#include "planner/cast_bits.h"

namespace {

constexpr unsigned THREADS = 256;

template <typename T>
__device__ __forceinline__ void copy_rows(const uint8_t *src, uint64_t spitch,
					  uint8_t *dst, uint64_t dpitch,
					  uint32_t rows, uint32_t bytes)
{
	const uint32_t per = bytes / (uint32_t)sizeof(T);

	if (per >= blockDim.x) {
		for (uint32_t r = 0; r < rows; r++) {
			const T *s = (const T *)(src + r * spitch);
			T *d = (T *)(dst + r * dpitch);

			for (uint32_t c = threadIdx.x; c < per; c += blockDim.x)
				d[c] = s[c];
		}
		return;
	}
	const uint32_t total = rows * per;

	for (uint32_t i = threadIdx.x; i < total; i += blockDim.x) {
		const uint32_t r = i / per, c = i - r * per;

		((T *)(dst + r * dpitch))[c] = ((const T *)(src + r * spitch))[c];
	}
}

__global__ void __launch_bounds__(THREADS) gather_kernel(rs_cuda_gather_args a)
{
	const rs_cuda_piece p = a.pieces[blockIdx.x];
	const rs_copy_op op = a.ops[p.op];
	const uint8_t *src = a.stage + a.stage_off[p.op] +
			     (uint64_t)p.row * op.len + p.byte;
	uint8_t *dst = a.result + op.dst_off + (uint64_t)p.row * op.dst_stride +
		       p.byte;
	uint64_t align = (uint64_t)(uintptr_t)src | (uint64_t)(uintptr_t)dst |
			 p.bytes;

	if (p.rows > 1)
		align |= op.len | op.dst_stride;
	if (!(align & 15))
		copy_rows<uint4>(src, op.len, dst, op.dst_stride, p.rows, p.bytes);
	else if (!(align & 7))
		copy_rows<uint2>(src, op.len, dst, op.dst_stride, p.rows, p.bytes);
	else if (!(align & 3))
		copy_rows<uint32_t>(src, op.len, dst, op.dst_stride, p.rows, p.bytes);
	else if (!(align & 1))
		copy_rows<uint16_t>(src, op.len, dst, op.dst_stride, p.rows, p.bytes);
	else
		copy_rows<uint8_t>(src, op.len, dst, op.dst_stride, p.rows, p.bytes);
}

/* Element converters.  SF/ST: element sizes, 0 when known only at run
 * time (the generic one). */
struct AnyCast {
	static constexpr unsigned SF = 0, ST = 0;
	static __device__ __forceinline__ void cvt(const uint8_t *s, uint8_t *d,
						   rs_dtype from, rs_dtype to)
	{
		rs_store_f32_bits(to, d, rs_load_f32_bits(from, s));
	}
};

struct F32ToBF16 {
	static constexpr unsigned SF = 4, ST = 2;
	static __device__ __forceinline__ void cvt(const uint8_t *s, uint8_t *d,
						   rs_dtype, rs_dtype)
	{
		*(uint16_t *)d = rs_f32_bits_to_bf16(*(const uint32_t *)s);
	}
};

struct F32ToF16 {
	static constexpr unsigned SF = 4, ST = 2;
	static __device__ __forceinline__ void cvt(const uint8_t *s, uint8_t *d,
						   rs_dtype, rs_dtype)
	{
		*(uint16_t *)d = rs_f32_bits_to_f16(*(const uint32_t *)s);
	}
};

struct BF16ToF32 {
	static constexpr unsigned SF = 2, ST = 4;
	static __device__ __forceinline__ void cvt(const uint8_t *s, uint8_t *d,
						   rs_dtype, rs_dtype)
	{
		*(uint32_t *)d = rs_bf16_to_f32_bits(*(const uint16_t *)s);
	}
};

template <class C>
__global__ void __launch_bounds__(THREADS) cast_kernel(rs_cuda_gather_args a)
{
	const uint32_t sf = C::SF ? C::SF : a.from_size;
	const uint32_t st = C::ST ? C::ST : a.to_size;
	const rs_cuda_piece p = a.pieces[blockIdx.x];
	const rs_copy_op op = a.ops[p.op];
	const uint8_t *src = a.stage + a.stage_off[p.op] +
			     (uint64_t)p.row * op.len + p.byte;
	/* The op's offsets count `from` bytes; the result holds `to`. */
	uint8_t *dst = a.result +
		       (op.dst_off + (uint64_t)p.row * op.dst_stride + p.byte) /
		       sf * st;
	const uint64_t dpitch = op.dst_stride / sf * st;
	const uint32_t n = p.bytes / sf;

	if (n >= blockDim.x) {
		for (uint32_t r = 0; r < p.rows; r++) {
			const uint8_t *s = src + r * op.len;
			uint8_t *d = dst + r * dpitch;

			for (uint32_t e = threadIdx.x; e < n; e += blockDim.x)
				C::cvt(s + e * sf, d + e * st, a.from, a.to);
		}
		return;
	}
	const uint32_t total = p.rows * n;

	for (uint32_t i = threadIdx.x; i < total; i += blockDim.x) {
		const uint32_t r = i / n, e = i - r * n;

		C::cvt(src + r * op.len + e * sf, dst + r * dpitch + e * st,
		       a.from, a.to);
	}
}

} /* namespace */

extern "C" cudaError_t rs_cuda_launch_gather(cudaStream_t stream,
					     const rs_cuda_gather_args *a)
{
	const dim3 grid(a->npieces), block(THREADS);

	if (a->npieces == 0)
		return cudaSuccess;
	if (a->from == a->to)
		gather_kernel<<<grid, block, 0, stream>>>(*a);
	else if (a->from == RS_DTYPE_F32 && a->to == RS_DTYPE_BF16)
		cast_kernel<F32ToBF16><<<grid, block, 0, stream>>>(*a);
	else if (a->from == RS_DTYPE_F32 && a->to == RS_DTYPE_F16)
		cast_kernel<F32ToF16><<<grid, block, 0, stream>>>(*a);
	else if (a->from == RS_DTYPE_BF16 && a->to == RS_DTYPE_F32)
		cast_kernel<BF16ToF32><<<grid, block, 0, stream>>>(*a);
	else
		cast_kernel<AnyCast><<<grid, block, 0, stream>>>(*a);
	return cudaGetLastError();
}

extern "C" cudaError_t rs_cuda_check_kernels(void)
{
	cudaFuncAttributes attr;
	const void *kernels[] = {
		(const void *)gather_kernel,
		(const void *)cast_kernel<F32ToBF16>,
		(const void *)cast_kernel<F32ToF16>,
		(const void *)cast_kernel<BF16ToF32>,
		(const void *)cast_kernel<AnyCast>,
	};

	for (size_t i = 0; i < sizeof(kernels) / sizeof(kernels[0]); i++) {
		cudaError_t e = cudaFuncGetAttributes(&attr, kernels[i]);

		if (e != cudaSuccess) {
			(void)cudaGetLastError();   /* not sticky: clear it */
			return e;
		}
	}
	return cudaSuccess;
}
