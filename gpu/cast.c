/* cast: runs of elements between floating-point types, on the CPU.
 *
 * Every conversion goes through f32 bits with the functions of
 * planner/cast_bits.h, the ones the CUDA kernels compile, so both give the same
 * bits.  A pair with f32 on one side is one loop; any other pair decodes a
 * block to f32 bits on the stack and encodes it (bf16 <-> f16 costs two
 * passes over 1 KiB of L1).
 *
 * Speed: one loop per type and direction, no switch per element.  Each
 * loop does whole blocks of BLOCK elements with a constant trip count,
 * which gcc -O2 (whose "very cheap" cost model refuses a loop that would
 * need a scalar epilogue) vectorizes for bf16 and f16 either way; the
 * bit functions are written branch-free for that.  fp8 and f64 loops stay
 * scalar: no view is dominated by them.
 */
#include "gpu/cast.h"

#include <string.h>

#include "planner/cast_bits.h"

#define BLOCK 256u

typedef void (*cast_loop)(uint8_t *restrict d, const uint8_t *restrict s,
			  uint64_t n);

/* Element k: a ST from s through FN to a DT at d. */
#define CAST_ELEM(DT, FN, ST, k)                                           \
	do {                                                               \
		ST x_;                                                     \
		DT y_;                                                     \
		memcpy(&x_, s + (k) * sizeof(ST), sizeof(ST));             \
		y_ = FN(x_);                                               \
		memcpy(d + (k) * sizeof(DT), &y_, sizeof(DT));             \
	} while (0)

#define DEFINE_LOOP(NAME, DT, FN, ST)                                      \
	static void NAME(uint8_t *restrict d, const uint8_t *restrict s,   \
			 uint64_t n)                                       \
	{                                                                  \
		uint64_t i = 0;                                            \
                                                                           \
		for (; n - i >= BLOCK; i += BLOCK)                         \
			for (unsigned j = 0; j < BLOCK; j++)               \
				CAST_ELEM(DT, FN, ST, i + j);              \
		for (; i < n; i++)                                         \
			CAST_ELEM(DT, FN, ST, i);                          \
	}

/* To f32 bits. */
DEFINE_LOOP(from_bf16, uint32_t, rs_bf16_to_f32_bits, uint16_t)
DEFINE_LOOP(from_f16, uint32_t, rs_f16_to_f32_bits, uint16_t)
DEFINE_LOOP(from_f64, uint32_t, rs_f64_to_f32_bits, uint64_t)
DEFINE_LOOP(from_e4m3, uint32_t, rs_e4m3_to_f32_bits, uint8_t)
DEFINE_LOOP(from_e5m2, uint32_t, rs_e5m2_to_f32_bits, uint8_t)

/* From f32 bits. */
DEFINE_LOOP(to_bf16, uint16_t, rs_f32_bits_to_bf16, uint32_t)
DEFINE_LOOP(to_f16, uint16_t, rs_f32_bits_to_f16, uint32_t)
DEFINE_LOOP(to_f64, uint64_t, rs_f32_bits_to_f64, uint32_t)
DEFINE_LOOP(to_e4m3, uint8_t, rs_f32_bits_to_e4m3, uint32_t)
DEFINE_LOOP(to_e5m2, uint8_t, rs_f32_bits_to_e5m2, uint32_t)

/* The loop into f32 bits; NULL for f32 itself (and non-floats). */
static cast_loop decoder(rs_dtype t)
{
	switch (t) {
	case RS_DTYPE_BF16: return from_bf16;
	case RS_DTYPE_F16: return from_f16;
	case RS_DTYPE_F64: return from_f64;
	case RS_DTYPE_F8E4M3: return from_e4m3;
	case RS_DTYPE_F8E5M2: return from_e5m2;
	default: return NULL;
	}
}

static cast_loop encoder(rs_dtype t)
{
	switch (t) {
	case RS_DTYPE_BF16: return to_bf16;
	case RS_DTYPE_F16: return to_f16;
	case RS_DTYPE_F64: return to_f64;
	case RS_DTYPE_F8E4M3: return to_e4m3;
	case RS_DTYPE_F8E5M2: return to_e5m2;
	default: return NULL;
	}
}

bool rs_cast_supported(rs_dtype from, rs_dtype to)
{
	return from != to && rs_dtype_is_float(from) && rs_dtype_is_float(to);
}

void rs_cast_run(rs_dtype to, void *dst, rs_dtype from, const void *src,
		 uint64_t n)
{
	cast_loop dec = decoder(from), enc = encoder(to);
	uint8_t *d = dst;
	const uint8_t *s = src;
	uint32_t buf[BLOCK];

	if (from == to) {
		/* Nothing to convert (not a cast, but harmless). */
		if (rs_dtype_is_float(from))
			memcpy(dst, src, n * rs_dtype_size(from));
		return;
	}
	if (!rs_cast_supported(from, to))
		return;
	if (!dec) {
		enc(d, s, n);           /* from f32 */
		return;
	}
	if (!enc) {
		dec(d, s, n);           /* to f32 */
		return;
	}
	for (uint64_t i = 0; i < n; i += BLOCK) {
		uint64_t k = n - i < BLOCK ? n - i : BLOCK;

		dec((uint8_t *)buf, s + i * rs_dtype_size(from), k);
		enc(d + i * rs_dtype_size(to), (const uint8_t *)buf, k);
	}
}
