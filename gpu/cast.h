/* cast: converting runs of elements between floating-point types.
 *
 * The rules, the same on the CPU and the GPU (planner/cast_bits.h holds the
 * one implementation both compile):
 *  - f32, bf16, f16, f64, fp8 e4m3fn and e5m2, any to any.
 *  - Narrowing rounds to nearest, ties to even; subnormals are kept.
 *  - To f32/bf16/f16: overflow gives Inf, Inf stays Inf, NaN stays NaN
 *    (sign kept, quiet).
 *  - To fp8: saturating; past the largest finite value (Inf too) gives
 *    +-448 (e4m3fn) or +-57344 (e5m2); NaN gives NaN.
 *  - Widening is exact; f64 narrows through f32, as torch does.
 */
#ifndef RS_CAST_H
#define RS_CAST_H

#include <stdbool.h>
#include <stdint.h>

#include "planner/dtype.h"

/* True when `from` converts to `to`: both floating-point and different. */
bool rs_cast_supported(rs_dtype from, rs_dtype to);

/* Converts n elements: src holds `from`, dst receives `to`.  The buffers
 * must not overlap; they need no alignment.  With from == to the bytes are
 * copied; any other pair rs_cast_supported refuses writes nothing (callers
 * check first: the executors refuse such jobs with -EINVAL). */
void rs_cast_run(rs_dtype to, void *dst, rs_dtype from, const void *src,
		 uint64_t n);

#endif
