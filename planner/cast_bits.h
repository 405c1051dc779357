/* cast_bits: one element's conversion between floating-point formats, as
 * integer bit arithmetic.
 *
 * This header is compiled twice: into the CPU executor (C11) and into the
 * CUDA kernels (nvcc).  Integer arithmetic, never the hardware's float
 * conversions, makes both give the same bits for every input, whatever
 * the compiler's flush-to-zero or fast-math settings and the rounding
 * mode.  (One exception, exact by construction: rs_f16_to_f32_bits turns
 * a 10-bit integer into a float.)
 *
 * Rules (gpu/cast.h states them for users):
 *  - Narrowing rounds to nearest, ties to even.  Subnormals are kept.
 *  - f32/bf16/f16: overflow gives Inf; Inf stays Inf; NaN stays NaN (sign
 *    kept, quiet bit set, payload truncated).
 *  - fp8 e4m3fn and e5m2 saturate: anything past the largest finite value,
 *    Inf included, gives +-max (448, 57344).  NaN gives sign|0x7f.
 *  - Widening is exact.  f64 narrows through f32, as torch does (so it
 *    rounds twice: numpy's direct f64 -> f16 can differ in the last bit).
 */
#ifndef RS_CAST_BITS_H
#define RS_CAST_BITS_H

#include <stdint.h>
#include <string.h>

#include "planner/dtype.h"

/* Forced inline on the host too: gpu/cast.c's loops vectorize only with
 * the whole conversion in their body. */
#ifdef __CUDACC__
#define RS_HD __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define RS_HD static inline __attribute__((always_inline))
#else
#define RS_HD static inline
#endif

/* c ? x : y, as masks: a chain of these stays one straight line that a
 * loop vectorizer takes whole, where the compiler may merge a chain of ?:
 * into branches it gives up on. */
RS_HD uint32_t rs_sel(uint32_t c, uint32_t x, uint32_t y)
{
	uint32_t m = 0u - (uint32_t)(c != 0);

	return (x & m) | (y & ~m);
}

/* --- to f32 bits (exact) --- */

RS_HD uint32_t rs_bf16_to_f32_bits(uint16_t h)
{
	return (uint32_t)h << 16;
}

/* A small float with `mbits` mantissa bits and exponent bias `bias`;
 * `special` is the exponent field that means Inf/NaN (0: none, e4m3fn,
 * whose only NaN is all ones). */
RS_HD uint32_t rs_small_to_f32_bits(uint32_t v, int nbits, int mbits, int bias,
				    uint32_t special)
{
	uint32_t sign = (v >> (nbits - 1)) & 1u;
	uint32_t mag = v & ((1u << (nbits - 1)) - 1u);
	uint32_t e = mag >> mbits, m = mag & ((1u << mbits) - 1u);
	uint32_t out;

	if (special && e == special) {
		out = m ? 0x7fc00000u | (m << (23 - mbits)) : 0x7f800000u;
	} else if (!special && mag == (1u << (nbits - 1)) - 1u) {
		out = 0x7fc00000u;      /* e4m3fn NaN: S.1111.111 */
	} else if (e == 0) {
		if (m == 0) {
			out = 0;
		} else {                /* subnormal: normalise */
			int32_t exp = 1 - bias;

			while (!(m & (1u << mbits))) {
				m <<= 1;
				exp--;
			}
			out = (uint32_t)(exp + 127) << 23 |
			      (m & ((1u << mbits) - 1u)) << (23 - mbits);
		}
	} else {
		out = (uint32_t)((int32_t)e - bias + 127) << 23 | m << (23 - mbits);
	}
	return sign << 31 | out;
}

/* f16 is on the hot path (f16 <-> f32, bf16): the same result as
 * rs_small_to_f32_bits(h, 16, 10, 15, 31), but with every case computed
 * and one selected, so that a loop of it vectorizes (gpu/cast.c).  A
 * subnormal m * 2^-24 is normalised by converting the integer m to float,
 * which is exact (m < 2^24; the result is normal), so rounding mode and
 * FTZ/DAZ cannot touch it; 24 off its exponent scales it. */
RS_HD uint32_t rs_f16_to_f32_bits(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
	uint32_t normal = (e + 112u) << 23 | m << 13;
	uint32_t special = 0x7f800000u | m << 13 | rs_sel(m != 0, 0x400000u, 0);
	float mf = (float)(int32_t)m;
	uint32_t sub;

	memcpy(&sub, &mf, 4);
	sub = rs_sel(m != 0, sub - (24u << 23), 0);
	return sign | rs_sel(e == 31u, special, rs_sel(e != 0, normal, sub));
}

RS_HD uint32_t rs_e4m3_to_f32_bits(uint8_t h)
{
	return rs_small_to_f32_bits(h, 8, 3, 7, 0);
}

RS_HD uint32_t rs_e5m2_to_f32_bits(uint8_t h)
{
	return rs_small_to_f32_bits(h, 8, 2, 15, 31);
}

/* --- from f32 bits (round to nearest even) --- */

RS_HD uint16_t rs_f32_bits_to_bf16(uint32_t u)
{
	if ((u & 0x7fffffffu) > 0x7f800000u)              /* NaN */
		return (uint16_t)((u >> 16) | 0x0040u);
	/* Adding 0x7fff plus the lowest kept bit rounds to nearest even;
	 * a carry into the exponent is right, up to Inf. */
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* The magnitude of finite, non-NaN |f32| `a` rounded to a small float with
 * `mbits` mantissa bits and bias `bias`: exponent and mantissa fields, the
 * exponent possibly past the format's range (the caller clamps). */
RS_HD uint32_t rs_f32_round_small(uint32_t a, int mbits, int bias)
{
	uint32_t E = a >> 23;
	uint32_t S = (a & 0x7fffffu) | 0x800000u;   /* 24-bit significand */
	int32_t te = (int32_t)E - 127 + bias;       /* target exponent field */
	int32_t shift = 23 - mbits;
	uint32_t keep, rem, half;

	if (E == 0)
		return 0;       /* below 2^-126: zero in every small format */
	if (te < 1)
		shift += 1 - te;  /* subnormal in the target */
	if (shift >= 25)
		return 0;       /* below half the smallest subnormal */
	keep = S >> shift;
	rem = S & ((1u << shift) - 1u);
	half = 1u << (shift - 1);
	if (rem > half || (rem == half && (keep & 1u)))
		keep++;
	if (te < 1)
		return keep;    /* a carry into bit mbits is the smallest normal */
	/* keep holds the implicit one at bit mbits: adding it to exponent
	 * te-1 gives the fields, and a rounding carry bumps the exponent. */
	return ((uint32_t)(te - 1) << mbits) + keep;
}

/* Hot path, as rs_f16_to_f32_bits: every case computed, one selected.
 * Normal results round like bf16 (add 0xfff plus the kept LSB, shift 13;
 * a carry into the exponent is right, up to Inf from 65520 on).
 * Subnormal results are S / 2^(14 + t), S the 24-bit significand and
 * t = 112 - exponent in [0, 10]: S keeps its top 16 bits plus a sticky
 * bit, moves left by 10 - t in fixed steps (a vector has no per-lane
 * shift), and rounds off 16 bits.  rs_f32_round_small(a, 10, 15) gives
 * the same bits (tests/unit/test_cast checks). */
RS_HD uint16_t rs_f32_bits_to_f16(uint32_t u)
{
	uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
	uint32_t S = (a & 0x7fffffu) | 0x800000u;
	uint32_t l = (a >> 23) - 102u;          /* 10 - t */
	uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
	uint32_t n = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
	uint32_t y = S >> 8 | ((S & 0xffu) ? 1u : 0u), sub, r;

	y = rs_sel(l & 8u, y << 8, y);
	y = rs_sel(l & 4u, y << 4, y);
	y = rs_sel(l & 2u, y << 2, y);
	y = rs_sel(l & 1u, y << 1, y);
	sub = (y + 0x7fffu + ((y >> 16) & 1u)) >> 16;
	r = rs_sel(a > 0x33000000u, sub, 0u);   /* above 2^-25: subnormal */
	r = rs_sel(a >= 0x38800000u, n, r);     /* 2^-14 and up: normal */
	r = rs_sel(a >= 0x477ff000u, 0x7c00u, r);  /* 65520 and up: Inf */
	r = rs_sel(a > 0x7f800000u, nan, r);
	return (uint16_t)(sign | r);
}

/* Saturating fp8: `max` is the largest finite magnitude's bits. */
RS_HD uint8_t rs_f32_bits_to_fp8(uint32_t u, int mbits, int bias, uint32_t max)
{
	uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu, r;

	if (a > 0x7f800000u)
		return (uint8_t)(sign | 0x7fu);
	if (a >= 0x47800000u)   /* >= 2^16, Inf included: past both fp8s */
		return (uint8_t)(sign | max);
	r = rs_f32_round_small(a, mbits, bias);
	return (uint8_t)(sign | (r > max ? max : r));
}

RS_HD uint8_t rs_f32_bits_to_e4m3(uint32_t u)
{
	return rs_f32_bits_to_fp8(u, 3, 7, 0x7eu);
}

RS_HD uint8_t rs_f32_bits_to_e5m2(uint32_t u)
{
	return rs_f32_bits_to_fp8(u, 2, 15, 0x7bu);
}

/* --- f64, in integers too ---
 *
 * Not the host's (float)x: x86's conversion flushes subnormals to zero
 * when FTZ/DAZ are set (a library built with -ffast-math sets them for
 * the whole process) and follows fesetround, and the device's need not
 * keep a NaN's sign and payload alike.  These give what x86 gives in its
 * default mode: round to nearest even, subnormals kept, NaN quieted with
 * its payload's top bits. */

RS_HD uint32_t rs_f64_to_f32_bits(uint64_t d)
{
	uint32_t sign = (uint32_t)(d >> 32) & 0x80000000u;
	uint64_t a = d & 0x7fffffffffffffffull;
	uint64_t S = (a & 0xfffffffffffffull) | 0x10000000000000ull;
	int32_t te = (int32_t)(a >> 52) - 1023 + 127;   /* f32 exponent field */
	int shift = 29;
	uint64_t keep, rem, half;

	if (a > 0x7ff0000000000000ull)
		return sign | 0x7fc00000u | ((uint32_t)(a >> 29) & 0x7fffffu);
	if (te >= 255)                  /* Inf, or past f32 before rounding */
		return sign | 0x7f800000u;
	if (te < 1)
		shift += 1 - te;        /* subnormal in f32 (or f64 itself) */
	if (shift >= 54)
		return sign;            /* below half the smallest subnormal */
	keep = S >> shift;
	rem = S & ((1ull << shift) - 1u);
	half = 1ull << (shift - 1);
	if (rem > half || (rem == half && (keep & 1u)))
		keep++;
	if (te < 1)
		return sign | (uint32_t)keep;
	/* A rounding carry bumps the exponent; past f32's largest: Inf. */
	return sign | (((uint32_t)(te - 1) << 23) + (uint32_t)keep);
}

RS_HD uint64_t rs_f32_bits_to_f64(uint32_t u)
{
	uint64_t sign = (uint64_t)(u >> 31) << 63;
	uint32_t a = u & 0x7fffffffu, e = a >> 23, m = a & 0x7fffffu;
	uint64_t exp = e + 896u;        /* 1023 - 127 */

	if (a > 0x7f800000u)
		return sign | 0x7ff8000000000000ull | (uint64_t)m << 29;
	if (a == 0x7f800000u)
		return sign | 0x7ff0000000000000ull;
	if (a == 0)
		return sign;
	if (e == 0) {                   /* subnormal: normalise */
		exp = 897;
		while (!(m & 0x800000u)) {
			m <<= 1;
			exp--;
		}
		m &= 0x7fffffu;
	}
	return sign | exp << 52 | (uint64_t)m << 29;
}

/* --- one element of any float type to any other --- */

RS_HD uint32_t rs_load_f32_bits(rs_dtype from, const uint8_t *p)
{
	uint16_t h;
	uint32_t u;
	uint64_t d;

	switch (from) {
	case RS_DTYPE_F32:
		memcpy(&u, p, 4);
		return u;
	case RS_DTYPE_BF16:
		memcpy(&h, p, 2);
		return rs_bf16_to_f32_bits(h);
	case RS_DTYPE_F16:
		memcpy(&h, p, 2);
		return rs_f16_to_f32_bits(h);
	case RS_DTYPE_F64:
		memcpy(&d, p, 8);
		return rs_f64_to_f32_bits(d);
	case RS_DTYPE_F8E4M3:
		return rs_e4m3_to_f32_bits(p[0]);
	case RS_DTYPE_F8E5M2:
		return rs_e5m2_to_f32_bits(p[0]);
	default:
		return 0;
	}
}

RS_HD void rs_store_f32_bits(rs_dtype to, uint8_t *p, uint32_t u)
{
	uint16_t h;
	uint64_t d;

	switch (to) {
	case RS_DTYPE_F32:
		memcpy(p, &u, 4);
		return;
	case RS_DTYPE_BF16:
		h = rs_f32_bits_to_bf16(u);
		memcpy(p, &h, 2);
		return;
	case RS_DTYPE_F16:
		h = rs_f32_bits_to_f16(u);
		memcpy(p, &h, 2);
		return;
	case RS_DTYPE_F64:
		d = rs_f32_bits_to_f64(u);
		memcpy(p, &d, 8);
		return;
	case RS_DTYPE_F8E4M3:
		p[0] = rs_f32_bits_to_e4m3(u);
		return;
	case RS_DTYPE_F8E5M2:
		p[0] = rs_f32_bits_to_e5m2(u);
		return;
	default:
		return;
	}
}

#endif
