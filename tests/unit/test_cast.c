/* cast: element conversions between floating-point types, and the CPU
 * executor running jobs that cast.
 *
 *  - rs_cast_run against the per-element functions of planner/cast_bits.h for
 *    every 16- and 8-bit source pattern, at odd lengths and alignments;
 *  - the vectorizable f16 functions against the generic ones they
 *    replace, the f64 ones against the host's IEEE conversions;
 *  - hand-computed values: ties to even, subnormals, overflow, fp8
 *    saturation, NaN, -0;
 *  - executor jobs with a cast (strided, contiguous, long rows, zero fill,
 *    concurrent) against rs_cast_run of an uncast reference gather.
 * tests/mount/test_cast_oracle.py checks the same rules against torch.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define HAVE_MXCSR 1
#endif

#include "gpu/cast.h"
#include "planner/cast_bits.h"
#include "gpu/executor.h"
#include "tests/unit/check.h"
#include "tests/unit/source_file.h"

static const rs_dtype floats[] = {
	RS_DTYPE_F32, RS_DTYPE_BF16, RS_DTYPE_F16,
	RS_DTYPE_F64, RS_DTYPE_F8E4M3, RS_DTYPE_F8E5M2,
};
#define NFLOATS (sizeof(floats) / sizeof(floats[0]))

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* Little-endian element i of a buffer of `t`, as an integer. */
static uint64_t elem(rs_dtype t, const uint8_t *buf, uint64_t i)
{
	uint64_t v = 0;

	memcpy(&v, buf + i * rs_dtype_size(t), rs_dtype_size(t));
	return v;
}

static void put_elem(rs_dtype t, uint8_t *buf, uint64_t i, uint64_t v)
{
	memcpy(buf + i * rs_dtype_size(t), &v, rs_dtype_size(t));
}

static int is_nan(rs_dtype t, uint64_t v)
{
	switch (t) {
	case RS_DTYPE_F32: return (v & 0x7fffffffu) > 0x7f800000u;
	case RS_DTYPE_BF16: return (v & 0x7fffu) > 0x7f80u;
	case RS_DTYPE_F16: return (v & 0x7fffu) > 0x7c00u;
	case RS_DTYPE_F64:
		return (v & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
	case RS_DTYPE_F8E4M3: return (v & 0x7fu) == 0x7fu;
	case RS_DTYPE_F8E5M2: return (v & 0x7fu) > 0x7cu;
	default: return 0;
	}
}

/* What one element must become: the functions the GPU compiles too. */
static uint64_t expect(rs_dtype to, rs_dtype from, uint64_t v)
{
	uint8_t in[8], out[8] = { 0 };
	uint64_t r = 0;

	memcpy(in, &v, 8);
	rs_store_f32_bits(to, out, rs_load_f32_bits(from, in));
	memcpy(&r, out, rs_dtype_size(to));
	return r;
}

/* rs_cast_run over n elements of src (integers) against expect(), run
 * whole and again in uneven slices at odd addresses; returns mismatches. */
static uint64_t check_run(rs_dtype to, rs_dtype from, const uint64_t *vals,
			  uint64_t n)
{
	unsigned fs = rs_dtype_size(from), ts = rs_dtype_size(to);
	uint8_t *src = malloc(n * fs + 1), *dst = malloc(n * ts + 1);
	uint64_t bad = 0;
	static const uint64_t slices[] = { 1, 7, 255, 256, 257, 1000, 3, 513 };

	for (uint64_t i = 0; i < n; i++)
		put_elem(from, src, i, vals[i]);
	memset(dst, 0xA5, n * ts);
	rs_cast_run(to, dst, from, src, n);
	for (uint64_t i = 0; i < n; i++)
		if (elem(to, dst, i) != expect(to, from, vals[i])) {
			if (bad++ < 3)
				fprintf(stderr, "%s -> %s: %#llx gives %#llx, "
					"want %#llx\n", rs_dtype_name(from),
					rs_dtype_name(to),
					(unsigned long long)vals[i],
					(unsigned long long)elem(to, dst, i),
					(unsigned long long)expect(to, from, vals[i]));
		}
	/* Misaligned by one byte, in slices through every tail length. */
	for (uint64_t i = 0; i < n; i++)
		put_elem(from, src + 1, i, vals[i]);
	memset(dst, 0x5A, n * ts + 1);
	for (uint64_t i = 0, k = 0; i < n; k++) {
		uint64_t len = slices[k % 8] < n - i ? slices[k % 8] : n - i;

		rs_cast_run(to, dst + 1 + i * ts, from, src + 1 + i * fs, len);
		i += len;
	}
	bad += dst[0] != 0x5A;
	for (uint64_t i = 0; i < n; i++)
		bad += elem(to, dst + 1, i) != expect(to, from, vals[i]);
	free(src);
	free(dst);
	return bad;
}

static void test_exhaustive_small(void)
{
	static uint64_t vals[65536];
	static const rs_dtype small[] = {
		RS_DTYPE_BF16, RS_DTYPE_F16, RS_DTYPE_F8E4M3, RS_DTYPE_F8E5M2,
	};

	for (size_t a = 0; a < 4; a++) {
		rs_dtype from = small[a];
		uint64_t n = rs_dtype_size(from) == 2 ? 65536 : 256;

		for (uint64_t i = 0; i < n; i++)
			vals[i] = i;
		for (size_t b = 0; b < NFLOATS; b++) {
			if (floats[b] == from)
				continue;
			CHECK(rs_cast_supported(from, floats[b]));
			CHECK(check_run(floats[b], from, vals, n) == 0);
		}
	}
}

/* Checks that hold for every pattern, by other means than the code under
 * test: widening is exact and round-trips; NaN stays NaN with its sign. */
static void test_exhaustive_properties(void)
{
	uint64_t bad_f16 = 0, bad_rt = 0, bad_nan = 0, bad_e5 = 0, bad_bf = 0;

	for (uint32_t h = 0; h < 65536; h++) {
		/* The vectorizable f16 decoder against the generic one. */
		bad_f16 += rs_f16_to_f32_bits((uint16_t)h) !=
			   rs_small_to_f32_bits(h, 16, 10, 15, 31);
		bad_bf += rs_bf16_to_f32_bits((uint16_t)h) != h << 16;
		for (int k = 0; k < 2; k++) {
			rs_dtype t = k ? RS_DTYPE_F16 : RS_DTYPE_BF16;

			if (is_nan(t, h)) {
				for (size_t b = 0; b < NFLOATS; b++) {
					uint64_t r;

					if (floats[b] == t)
						continue;
					r = expect(floats[b], t, h);
					bad_nan += !is_nan(floats[b], r);
					bad_nan += (r >> (8 * rs_dtype_size(floats[b]) - 1)) !=
						   (uint64_t)(h >> 15);
				}
				continue;
			}
			/* Through f32 and f64 and back, unchanged. */
			bad_rt += expect(t, RS_DTYPE_F32, expect(RS_DTYPE_F32, t, h)) != h;
			bad_rt += expect(t, RS_DTYPE_F64, expect(RS_DTYPE_F64, t, h)) != h;
		}
	}
	for (uint32_t v = 0; v < 256; v++) {
		/* e5m2 is f16 cut to its top byte; every e4m3fn value is an f16,
		 * a bf16 and an f32. */
		if (!is_nan(RS_DTYPE_F8E5M2, v))
			bad_e5 += expect(RS_DTYPE_F16, RS_DTYPE_F8E5M2, v) != v << 8;
		for (int k = 0; k < 2; k++) {
			rs_dtype t = k ? RS_DTYPE_F8E5M2 : RS_DTYPE_F8E4M3;

			/* e5m2's Inf saturates to 57344 like any overflow. */
			if (is_nan(t, v) || (k && (v & 0x7fu) == 0x7cu))
				continue;
			for (size_t b = 0; b < 4; b++)  /* the wider types */
				bad_rt += expect(t, floats[b],
						 expect(floats[b], t, v)) != v;
		}
	}
	CHECK(bad_f16 == 0);
	CHECK(bad_bf == 0);
	CHECK(bad_rt == 0);
	CHECK(bad_nan == 0);
	CHECK(bad_e5 == 0);
}

/* The generic f32 -> f16 that rs_f32_bits_to_f16 replaces on the hot path
 * (the rounding the fp8 encoders still use). */
static uint16_t ref_f32_to_f16(uint32_t u)
{
	uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu, r;

	if (a > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
	if (a >= 0x47800000u)
		return (uint16_t)(sign | 0x7c00u);
	r = rs_f32_round_small(a, 10, 15);
	return (uint16_t)(sign | (r > 0x7c00u ? 0x7c00u : r));
}

/* f32 patterns: every top half with low halves at and around each
 * rounding boundary (bf16 at bit 15, f16 at bit 12, fp8 above), and
 * random ones. */
static uint64_t *f32_patterns(uint64_t *count)
{
	static const uint32_t lows[] = {
		0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000,
		0x3000, 0x7fff, 0x8000, 0x8001, 0x9000, 0xefff, 0xffff,
	};
	uint64_t nlow = sizeof(lows) / sizeof(lows[0]);
	uint64_t n = 65536 * nlow + (1u << 20), k = 0;
	uint64_t *v = malloc(n * sizeof(*v));

	for (uint32_t hi = 0; hi < 65536; hi++)
		for (uint64_t j = 0; j < nlow; j++)
			v[k++] = hi << 16 | lows[j];
	while (k < n)
		v[k++] = (uint32_t)next_rand();
	*count = n;
	return v;
}

static void test_f32_sources(void)
{
	uint64_t n, bad = 0, bad_hw = 0;
	uint64_t *v = f32_patterns(&n);

	for (size_t b = 0; b < NFLOATS; b++)
		if (floats[b] != RS_DTYPE_F32)
			CHECK(check_run(floats[b], RS_DTYPE_F32, v, n) == 0);
	for (uint64_t i = 0; i < n; i++) {
		uint32_t u = (uint32_t)v[i];
		float f;
		double x;
		uint64_t d;

		bad += rs_f32_bits_to_f16(u) != ref_f32_to_f16(u);
		/* f32 -> f64 against the host: exact, NaN quieted alike. */
		memcpy(&f, &u, 4);
		x = f;
		memcpy(&d, &x, 8);
		bad_hw += rs_f32_bits_to_f64(u) != d;
	}
	CHECK(bad == 0);
	CHECK(bad_hw == 0);
	free(v);
}

/* f64 patterns: random bits, doubles around f32's range and its
 * subnormals, and f32 rounding ties nudged by one f64 ulp either way. */
static void test_f64_sources(void)
{
	uint64_t n = 1u << 20, bad_hw = 0;
	uint64_t *v = malloc(n * sizeof(*v));

	for (uint64_t i = 0; i < n; i++) {
		uint64_t r = next_rand();

		switch (i % 4) {
		case 0:
			v[i] = r;
			break;
		case 1:         /* exponents from 2^-160 to 2^130 */
			v[i] = (r & 0x800fffffffffffffull) |
			       (uint64_t)(1023 - 160 + (next_rand() % 291)) << 52;
			break;
		case 2:         /* an f32 tie, exactly */
			v[i] = ((r & 0x800fffffffffffffull) |
				(uint64_t)(1023 - 155 + (next_rand() % 285)) << 52) &
			       ~0x1fffffffull;
			v[i] |= 0x10000000u;
			break;
		default:        /* next to one */
			v[i] = v[i - 1] + (r & 1 ? 1 : (uint64_t)-1);
		}
	}
	for (size_t b = 0; b < NFLOATS; b++)
		if (floats[b] != RS_DTYPE_F64)
			CHECK(check_run(floats[b], RS_DTYPE_F64, v, n) == 0);
	for (uint64_t i = 0; i < n; i++) {
		double x;
		float f;
		uint32_t u;

		memcpy(&x, &v[i], 8);
		f = (float)x;
		memcpy(&u, &f, 4);
		bad_hw += rs_f64_to_f32_bits(v[i]) != u;
	}
	CHECK(bad_hw == 0);
	free(v);
}

typedef struct {
	rs_dtype from, to;
	uint64_t in, out;
} known;

static const known known_values[] = {
	/* f32 -> bf16: ties to even, overflow to Inf, NaN never Inf */
	{ RS_DTYPE_F32, RS_DTYPE_BF16, 0x3f800000, 0x3f80 },
	{ RS_DTYPE_F32, RS_DTYPE_BF16, 0x3f808000, 0x3f80 },     /* tie, even */
	{ RS_DTYPE_F32, RS_DTYPE_BF16, 0x3f818000, 0x3f82 },     /* tie, odd */
	{ RS_DTYPE_F32, RS_DTYPE_BF16, 0x3f808001, 0x3f81 },
	{ RS_DTYPE_F32, RS_DTYPE_BF16, 0x7f7f7fff, 0x7f7f },
	{ RS_DTYPE_F32, RS_DTYPE_BF16, 0x7f7fffff, 0x7f80 },     /* f32 max: Inf */
	{ RS_DTYPE_F32, RS_DTYPE_BF16, 0xff800000, 0xff80 },
	{ RS_DTYPE_F32, RS_DTYPE_BF16, 0x7f800001, 0x7fc0 },     /* sNaN */
	{ RS_DTYPE_F32, RS_DTYPE_BF16, 0xffc00000, 0xffc0 },
	{ RS_DTYPE_F32, RS_DTYPE_BF16, 0x80000000, 0x8000 },
	{ RS_DTYPE_F32, RS_DTYPE_BF16, 0x00010000, 0x0001 },     /* subnormal */
	{ RS_DTYPE_F32, RS_DTYPE_BF16, 0x00008000, 0x0000 },
	{ RS_DTYPE_F32, RS_DTYPE_BF16, 0x00018000, 0x0002 },
	/* f32 -> f16 */
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0x3f800000, 0x3c00 },
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0x3f801000, 0x3c00 },      /* tie, even */
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0x3f803000, 0x3c02 },      /* tie, odd */
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0x477fe000, 0x7bff },      /* 65504 */
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0x477fefff, 0x7bff },
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0x477ff000, 0x7c00 },      /* 65520: Inf */
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0x501502f9, 0x7c00 },      /* 1e10 */
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0xff800000, 0xfc00 },
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0x38800000, 0x0400 },      /* 2^-14 */
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0x387fc000, 0x03ff },      /* max subnormal */
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0x387fe000, 0x0400 },      /* tie, even */
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0x33800000, 0x0001 },      /* 2^-24 */
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0x33000000, 0x0000 },      /* 2^-25 tie */
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0x33000001, 0x0001 },
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0x33c00000, 0x0002 },      /* 1.5 ulp */
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0x34200000, 0x0002 },      /* 2.5 ulp */
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0x00000001, 0x0000 },
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0x80000000, 0x8000 },
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0x7f800001, 0x7e00 },
	{ RS_DTYPE_F32, RS_DTYPE_F16, 0xffc00000, 0xfe00 },
	/* f16 -> f32 */
	{ RS_DTYPE_F16, RS_DTYPE_F32, 0x0001, 0x33800000 },
	{ RS_DTYPE_F16, RS_DTYPE_F32, 0x03ff, 0x387fc000 },
	{ RS_DTYPE_F16, RS_DTYPE_F32, 0x0400, 0x38800000 },
	{ RS_DTYPE_F16, RS_DTYPE_F32, 0x7bff, 0x477fe000 },
	{ RS_DTYPE_F16, RS_DTYPE_F32, 0x7c00, 0x7f800000 },
	{ RS_DTYPE_F16, RS_DTYPE_F32, 0x7c01, 0x7fc02000 },
	{ RS_DTYPE_F16, RS_DTYPE_F32, 0xfe00, 0xffc00000 },
	{ RS_DTYPE_F16, RS_DTYPE_F32, 0x8000, 0x80000000 },
	{ RS_DTYPE_F16, RS_DTYPE_F32, 0x8001, 0xb3800000 },
	/* bf16 <-> f16 */
	{ RS_DTYPE_BF16, RS_DTYPE_F16, 0x3f80, 0x3c00 },
	{ RS_DTYPE_BF16, RS_DTYPE_F16, 0x477f, 0x7bf8 },         /* 65280 */
	{ RS_DTYPE_BF16, RS_DTYPE_F16, 0x4780, 0x7c00 },         /* 65536 */
	{ RS_DTYPE_BF16, RS_DTYPE_F16, 0x3380, 0x0001 },         /* 2^-24 */
	{ RS_DTYPE_BF16, RS_DTYPE_F16, 0x3300, 0x0000 },         /* 2^-25 */
	{ RS_DTYPE_F16, RS_DTYPE_BF16, 0x3c01, 0x3f80 },
	{ RS_DTYPE_F16, RS_DTYPE_BF16, 0x3c04, 0x3f80 },         /* tie, even */
	{ RS_DTYPE_F16, RS_DTYPE_BF16, 0x3c06, 0x3f81 },
	{ RS_DTYPE_F16, RS_DTYPE_BF16, 0x3c0c, 0x3f82 },         /* tie, odd */
	{ RS_DTYPE_F16, RS_DTYPE_BF16, 0x0001, 0x3380 },
	{ RS_DTYPE_F16, RS_DTYPE_BF16, 0x7c00, 0x7f80 },
	/* to e4m3fn: saturating, no Inf */
	{ RS_DTYPE_F32, RS_DTYPE_F8E4M3, 0x3f800000, 0x38 },
	{ RS_DTYPE_F32, RS_DTYPE_F8E4M3, 0x3f880000, 0x38 },     /* tie, even */
	{ RS_DTYPE_F32, RS_DTYPE_F8E4M3, 0x3f980000, 0x3a },     /* tie, odd */
	{ RS_DTYPE_F32, RS_DTYPE_F8E4M3, 0x43e00000, 0x7e },     /* 448 */
	{ RS_DTYPE_F32, RS_DTYPE_F8E4M3, 0x43e80000, 0x7e },     /* 464 */
	{ RS_DTYPE_F32, RS_DTYPE_F8E4M3, 0x43f00000, 0x7e },     /* 480 */
	{ RS_DTYPE_F32, RS_DTYPE_F8E4M3, 0x7149f2ca, 0x7e },     /* 1e30 */
	{ RS_DTYPE_F32, RS_DTYPE_F8E4M3, 0x7f800000, 0x7e },
	{ RS_DTYPE_F32, RS_DTYPE_F8E4M3, 0xff800000, 0xfe },
	{ RS_DTYPE_F32, RS_DTYPE_F8E4M3, 0x7fc00000, 0x7f },
	{ RS_DTYPE_F32, RS_DTYPE_F8E4M3, 0xffc00000, 0xff },
	{ RS_DTYPE_F32, RS_DTYPE_F8E4M3, 0x3b000000, 0x01 },     /* 2^-9 */
	{ RS_DTYPE_F32, RS_DTYPE_F8E4M3, 0x3a800000, 0x00 },     /* 2^-10 tie */
	{ RS_DTYPE_F32, RS_DTYPE_F8E4M3, 0x3a800001, 0x01 },
	{ RS_DTYPE_F32, RS_DTYPE_F8E4M3, 0x3b400000, 0x02 },     /* 1.5 ulp */
	{ RS_DTYPE_F32, RS_DTYPE_F8E4M3, 0x3c800000, 0x08 },     /* 2^-6 */
	{ RS_DTYPE_F32, RS_DTYPE_F8E4M3, 0x80000000, 0x80 },
	{ RS_DTYPE_F16, RS_DTYPE_F8E4M3, 0x5f00, 0x7e },         /* 448 */
	{ RS_DTYPE_F16, RS_DTYPE_F8E4M3, 0x7c00, 0x7e },
	{ RS_DTYPE_F16, RS_DTYPE_F8E4M3, 0xfc00, 0xfe },
	{ RS_DTYPE_F16, RS_DTYPE_F8E4M3, 0x7e00, 0x7f },
	{ RS_DTYPE_BF16, RS_DTYPE_F8E4M3, 0x7f80, 0x7e },
	/* to e5m2: saturating at 57344 */
	{ RS_DTYPE_F32, RS_DTYPE_F8E5M2, 0x3f800000, 0x3c },
	{ RS_DTYPE_F32, RS_DTYPE_F8E5M2, 0x3f900000, 0x3c },     /* tie, even */
	{ RS_DTYPE_F32, RS_DTYPE_F8E5M2, 0x47600000, 0x7b },     /* 57344 */
	{ RS_DTYPE_F32, RS_DTYPE_F8E5M2, 0x47700000, 0x7b },     /* 61440 */
	{ RS_DTYPE_F32, RS_DTYPE_F8E5M2, 0x49742400, 0x7b },     /* 1e6 */
	{ RS_DTYPE_F32, RS_DTYPE_F8E5M2, 0x7f800000, 0x7b },
	{ RS_DTYPE_F32, RS_DTYPE_F8E5M2, 0xff800000, 0xfb },
	{ RS_DTYPE_F32, RS_DTYPE_F8E5M2, 0x7fc00000, 0x7f },
	{ RS_DTYPE_F32, RS_DTYPE_F8E5M2, 0x37800000, 0x01 },     /* 2^-16 */
	{ RS_DTYPE_F32, RS_DTYPE_F8E5M2, 0x37000000, 0x00 },     /* 2^-17 tie */
	{ RS_DTYPE_F16, RS_DTYPE_F8E5M2, 0x7c00, 0x7b },
	{ RS_DTYPE_F16, RS_DTYPE_F8E5M2, 0x3c80, 0x3c },         /* tie, even */
	{ RS_DTYPE_F16, RS_DTYPE_F8E5M2, 0x3d80, 0x3e },         /* tie, odd */
	/* from fp8 */
	{ RS_DTYPE_F8E4M3, RS_DTYPE_F32, 0x7e, 0x43e00000 },
	{ RS_DTYPE_F8E4M3, RS_DTYPE_F32, 0x7f, 0x7fc00000 },
	{ RS_DTYPE_F8E4M3, RS_DTYPE_F32, 0xff, 0xffc00000 },
	{ RS_DTYPE_F8E4M3, RS_DTYPE_F32, 0x78, 0x43800000 },     /* 256 */
	{ RS_DTYPE_F8E4M3, RS_DTYPE_F32, 0x01, 0x3b000000 },
	{ RS_DTYPE_F8E4M3, RS_DTYPE_F32, 0x07, 0x3c600000 },     /* 7 * 2^-9 */
	{ RS_DTYPE_F8E4M3, RS_DTYPE_F32, 0x80, 0x80000000 },
	{ RS_DTYPE_F8E5M2, RS_DTYPE_F32, 0x7b, 0x47600000 },
	{ RS_DTYPE_F8E5M2, RS_DTYPE_F32, 0x7c, 0x7f800000 },
	{ RS_DTYPE_F8E5M2, RS_DTYPE_F32, 0xfc, 0xff800000 },
	{ RS_DTYPE_F8E5M2, RS_DTYPE_F32, 0x7d, 0x7fe00000 },
	{ RS_DTYPE_F8E5M2, RS_DTYPE_F32, 0x01, 0x37800000 },
	{ RS_DTYPE_F8E5M2, RS_DTYPE_F8E4M3, 0x7b, 0x7e },        /* 57344 */
	{ RS_DTYPE_F8E5M2, RS_DTYPE_F8E4M3, 0x7c, 0x7e },        /* Inf */
	{ RS_DTYPE_F8E5M2, RS_DTYPE_F8E4M3, 0x7e, 0x7f },        /* NaN */
	{ RS_DTYPE_F8E4M3, RS_DTYPE_F8E5M2, 0x7e, 0x5f },        /* 448 */
	{ RS_DTYPE_F8E4M3, RS_DTYPE_F8E5M2, 0x01, 0x18 },        /* 2^-9 */
	{ RS_DTYPE_F8E4M3, RS_DTYPE_F8E5M2, 0x39, 0x3c },        /* tie, even */
	{ RS_DTYPE_F8E4M3, RS_DTYPE_F8E5M2, 0x3f, 0x40 },        /* tie, odd */
	/* f32 <-> f64 */
	{ RS_DTYPE_F32, RS_DTYPE_F64, 0x3f800000, 0x3ff0000000000000ull },
	{ RS_DTYPE_F32, RS_DTYPE_F64, 0x00000001, 0x36a0000000000000ull },
	{ RS_DTYPE_F32, RS_DTYPE_F64, 0x80400000, 0xb800000000000000ull },
	{ RS_DTYPE_F32, RS_DTYPE_F64, 0xff800000, 0xfff0000000000000ull },
	{ RS_DTYPE_F32, RS_DTYPE_F64, 0x7fc00001, 0x7ff8000020000000ull },
	{ RS_DTYPE_F32, RS_DTYPE_F64, 0x7f800001, 0x7ff8000020000000ull },
	{ RS_DTYPE_F64, RS_DTYPE_F32, 0x3ff0000010000000ull, 0x3f800000 },
	{ RS_DTYPE_F64, RS_DTYPE_F32, 0x3ff0000030000000ull, 0x3f800002 },
	{ RS_DTYPE_F64, RS_DTYPE_F32, 0x3ff0000010000001ull, 0x3f800001 },
	{ RS_DTYPE_F64, RS_DTYPE_F32, 0x47efffffe0000000ull, 0x7f7fffff },
	{ RS_DTYPE_F64, RS_DTYPE_F32, 0x47effffff0000000ull, 0x7f800000 },
	{ RS_DTYPE_F64, RS_DTYPE_F32, 0x7e37e43c8800759cull, 0x7f800000 },
	{ RS_DTYPE_F64, RS_DTYPE_F32, 0x36a0000000000000ull, 0x00000001 },
	{ RS_DTYPE_F64, RS_DTYPE_F32, 0x3690000000000000ull, 0x00000000 },
	{ RS_DTYPE_F64, RS_DTYPE_F32, 0x3690000000000001ull, 0x00000001 },
	{ RS_DTYPE_F64, RS_DTYPE_F32, 0x36a8000000000000ull, 0x00000002 },
	{ RS_DTYPE_F64, RS_DTYPE_F32, 0x380fffffc0000000ull, 0x007fffff },
	{ RS_DTYPE_F64, RS_DTYPE_F32, 0x380fffffe0000000ull, 0x00800000 },  /* tie */
	{ RS_DTYPE_F64, RS_DTYPE_F32, 0x8000000000000001ull, 0x80000000 },
	{ RS_DTYPE_F64, RS_DTYPE_F32, 0x7ff0000000000001ull, 0x7fc00000 },
	{ RS_DTYPE_F64, RS_DTYPE_F32, 0xfff8000020000000ull, 0xffc00001 },
	{ RS_DTYPE_F64, RS_DTYPE_F32, 0xfff0000000000000ull, 0xff800000 },
	/* f64 narrows through f32: rounds twice, as torch does */
	{ RS_DTYPE_F64, RS_DTYPE_BF16, 0x3ff0100000010000ull, 0x3f80 },
	{ RS_DTYPE_F64, RS_DTYPE_F16, 0x3ff0020000010000ull, 0x3c00 },
	{ RS_DTYPE_F64, RS_DTYPE_F8E5M2, 0x3ff2000000010000ull, 0x3c },
	{ RS_DTYPE_F64, RS_DTYPE_BF16, 0x3ff0100020000000ull, 0x3f81 },
};

static void test_known_values(void)
{
	for (size_t i = 0; i < sizeof(known_values) / sizeof(known_values[0]); i++) {
		const known *k = &known_values[i];
		uint8_t in[8], out[8];
		uint64_t got = 0;

		memcpy(in, &k->in, 8);
		rs_cast_run(k->to, out, k->from, in, 1);
		memcpy(&got, out, rs_dtype_size(k->to));
		if (got != k->out)
			fprintf(stderr, "known value %zu: %s %#llx -> %s %#llx, "
				"want %#llx\n", i, rs_dtype_name(k->from),
				(unsigned long long)k->in, rs_dtype_name(k->to),
				(unsigned long long)got,
				(unsigned long long)k->out);
		CHECK(got == k->out);
	}
	CHECK(!rs_cast_supported(RS_DTYPE_F32, RS_DTYPE_F32));
	CHECK(!rs_cast_supported(RS_DTYPE_F32, RS_DTYPE_I32));
	CHECK(!rs_cast_supported(RS_DTYPE_I16, RS_DTYPE_F16));
	CHECK(!rs_cast_supported(RS_DTYPE_INVALID, RS_DTYPE_BF16));
	CHECK(rs_cast_supported(RS_DTYPE_F64, RS_DTYPE_F8E5M2));
}

/* Flush-to-zero and denormals-are-zero (set process-wide by any library
 * built with -ffast-math) must not change a bit: the conversions are
 * integer arithmetic. */
static void test_ftz_daz(void)
{
#ifdef HAVE_MXCSR
	static const known cases[] = {
		{ RS_DTYPE_F64, RS_DTYPE_F32, 0x36a0000000000000ull, 0x00000001 },
		{ RS_DTYPE_F64, RS_DTYPE_F32, 0x380fffffc0000000ull, 0x007fffff },
		{ RS_DTYPE_F32, RS_DTYPE_F64, 0x00000001, 0x36a0000000000000ull },
		{ RS_DTYPE_F16, RS_DTYPE_F32, 0x0001, 0x33800000 },
		{ RS_DTYPE_F32, RS_DTYPE_F16, 0x33800000, 0x0001 },
		{ RS_DTYPE_F32, RS_DTYPE_BF16, 0x00010000, 0x0001 },
	};
	unsigned saved = _mm_getcsr();

	_mm_setcsr(saved | 0x8040);     /* FTZ | DAZ */
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint8_t in[8], out[64 * 8];
		uint8_t src[64 * 8];
		int bad = 0;

		memcpy(in, &cases[i].in, 8);
		/* A run long enough for the vector loops. */
		for (int k = 0; k < 64; k++)
			memcpy(src + k * rs_dtype_size(cases[i].from), in,
			       rs_dtype_size(cases[i].from));
		rs_cast_run(cases[i].to, out, cases[i].from, src, 64);
		for (int k = 0; k < 64; k++)
			bad += elem(cases[i].to, out, k) != cases[i].out;
		CHECK(bad == 0);
	}
	_mm_setcsr(saved);
#else
	printf("FTZ/DAZ check skipped: not x86\n");
#endif
}

/* --- the CPU executor with casts --- */

#define FILE_BYTES (4u << 20)

static char dir[] = "/tmp/rs_cast_XXXXXX";
static uint8_t *content;

static rs_sources *make_sources(void)
{
	return rs_test_source(dir, "src", content, FILE_BYTES);
}

/* The uncast gather the ops describe (in `from`'s bytes, zeros where no
 * op writes), then converted whole: what the cast job must produce. */
static void reference(const rs_exec_job *job, uint64_t from_size,
		      uint8_t *want)
{
	uint8_t *raw = calloc(1, from_size);

	for (size_t k = 0; k < job->nops; k++) {
		const rs_copy_op *op = &job->ops[k];

		for (uint64_t r = 0; r < op->count; r++)
			memcpy(raw + op->dst_off + r * op->dst_stride,
			       content + op->src_off + r * op->src_stride, op->len);
	}
	rs_cast_run(job->to, want, job->from, raw,
		    from_size / rs_dtype_size(job->from));
	free(raw);
}

typedef struct {
	rs_executor *ex;
	rs_sources *s;
	rs_dtype from, to;
	unsigned seed;
	int bad;
	uint64_t read;
} job_arg;

/* Random jobs of every op shape, `from` to `to`.  The destination, in
 * `from` bytes, by MiB: [0, 1) strided rows with gaps between them,
 * [1, 2) strided rows packed, [2, 3.5) one run (byte pieces), [4, 6.1)
 * two rows longer than a piece, [7, 7.5) contiguous rows into contiguous
 * rows; the rest is zero fill. */
static void *cast_jobs(void *p)
{
	job_arg *a = p;
	unsigned fs = rs_dtype_size(a->from), ts = rs_dtype_size(a->to);
	uint64_t from_size = 8u << 20, size = from_size / fs * ts;
	uint8_t *got = malloc(size), *want = malloc(size);

	for (int iter = 0; iter < 4; iter++) {
		rs_copy_op ops[5];
		rs_exec_job job = { 0 };
		uint64_t e = fs;        /* offsets in whole elements */
		uint64_t pick = rand_r(&a->seed) % 4096 * e;

		/* strided source and destination rows, with gaps */
		ops[0] = (rs_copy_op){ 0, pick, 0, 200 * e, 500, 384 * e, 256 * e };
		/* strided source, contiguous destination rows */
		ops[1] = (rs_copy_op){ 0, pick + 7 * e, 1u << 20, 24 * e, 3000,
				       100 * e, 24 * e };
		/* one run over several byte pieces */
		ops[2] = (rs_copy_op){ 0, rand_r(&a->seed) % 65536 * e, 2u << 20,
				       3u << 19, 1, 3u << 19, 3u << 19 };
		/* two rows longer than a piece */
		ops[3] = (rs_copy_op){ 0, pick, 4u << 20, (1u << 20) + 40 * e, 2,
				       (1u << 20) + 1000 * e, (1u << 20) + 64 * e };
		/* contiguous rows to contiguous rows */
		ops[4] = (rs_copy_op){ 0, rand_r(&a->seed) % 1000 * e,
				       (7u << 20) + 4096, 64 * e, 1000, 64 * e, 64 * e };
		job.ops = ops;
		job.nops = 5;
		job.dst = got;
		job.size = size;
		job.zero_fill = true;
		job.sources = a->s;
		job.from = a->from;
		job.to = a->to;
		memset(got, 0xAB, size);
		if (rs_executor_run(a->ex, &job) != 0) {
			a->bad++;
			continue;
		}
		for (size_t k = 0; k < 5; k++)
			a->read += ops[k].len * ops[k].count;
		reference(&job, from_size, want);
		a->bad += memcmp(got, want, size) != 0;
	}
	free(got);
	free(want);
	return NULL;
}

static void test_executor(void)
{
	static const rs_dtype pairs[][2] = {
		{ RS_DTYPE_F32, RS_DTYPE_BF16 }, { RS_DTYPE_BF16, RS_DTYPE_F32 },
		{ RS_DTYPE_F32, RS_DTYPE_F16 }, { RS_DTYPE_F16, RS_DTYPE_BF16 },
		{ RS_DTYPE_BF16, RS_DTYPE_F8E4M3 }, { RS_DTYPE_F64, RS_DTYPE_BF16 },
	};
	rs_executor_opts o = { .kind = RS_EXECUTOR_CPU, .threads = 3 };
	rs_executor *ex;
	rs_sources *s;
	pthread_t th[4];
	job_arg args[4];
	uint64_t read = 0;
	char path[64];

	content = malloc(FILE_BYTES);
	for (size_t i = 0; i < FILE_BYTES; i += 8) {
		uint64_t r = next_rand();

		memcpy(content + i, &r, 8);
	}
	/* Plenty of ordinary values too: every 4th f32 near 1. */
	for (size_t i = 0; i < FILE_BYTES; i += 16) {
		float f = 1.0f + (float)(i % 1000) / 7.0f;

		memcpy(content + i, &f, 4);
	}
	CHECK(mkdtemp(dir) != NULL);
	s = make_sources();
	CHECK(rs_executor_create(&ex, &o, NULL) == 0);

	/* Four threads at once, each with its own pair, twice over. */
	for (size_t round = 0; round < 2; round++) {
		for (int i = 0; i < 4; i++) {
			const rs_dtype *pr = pairs[(round * 4 + i) % 6];

			args[i] = (job_arg){ ex, s, pr[0], pr[1],
					     (unsigned)(i + 1 + 10 * round), 0, 0 };
			pthread_create(&th[i], NULL, cast_jobs, &args[i]);
		}
		for (int i = 0; i < 4; i++) {
			pthread_join(th[i], NULL);
			CHECK(args[i].bad == 0);
			read += args[i].read;
		}
	}
	CHECK(rs_sources_bytes_read(s) == read);

	{ /* a covered destination is not zeroed first; size is in `to` */
		rs_copy_op op = { 0, 0, 0, 4096, 1, 4096, 4096 };
		uint8_t buf[2048], want[2048];
		rs_exec_job job = { .ops = &op, .nops = 1, .dst = buf,
				    .size = sizeof(buf), .zero_fill = true,
				    .sources = s, .from = RS_DTYPE_F32,
				    .to = RS_DTYPE_BF16 };

		CHECK(rs_executor_run(ex, &job) == 0);
		rs_cast_run(RS_DTYPE_BF16, want, RS_DTYPE_F32, content, 1024);
		CHECK(memcmp(buf, want, sizeof(buf)) == 0);
	}
	{ /* refused: pairs cast.h does not convert, ops not in elements */
		rs_copy_op op = { 0, 0, 0, 16, 1, 16, 16 };
		rs_copy_op odd = { 0, 0, 2, 16, 1, 16, 16 };
		uint8_t buf[64];
		rs_exec_job job = { .ops = &op, .nops = 1, .dst = buf,
				    .size = 16, .sources = s,
				    .from = RS_DTYPE_F32, .to = RS_DTYPE_I32 };

		CHECK(rs_executor_run(ex, &job) == -EINVAL);
		job.from = RS_DTYPE_INVALID;
		job.to = RS_DTYPE_BF16;
		CHECK(rs_executor_run(ex, &job) == -EINVAL);
		job.from = RS_DTYPE_F64;
		job.to = RS_DTYPE_F32;
		op.len = 12;
		CHECK(rs_executor_run(ex, &job) == -EINVAL);
		job.ops = &odd;
		job.from = RS_DTYPE_F32;
		job.to = RS_DTYPE_BF16;
		CHECK(rs_executor_run(ex, &job) == -EINVAL);
	}
	{ /* past the end of the source: EIO, as without a cast */
		rs_copy_op op = { 0, FILE_BYTES - 8, 0, 16, 1, 16, 16 };
		rs_copy_op rows = { 0, FILE_BYTES - 64, 0, 16, 8, 16, 16 };
		uint8_t buf[64];
		rs_exec_job job = { .ops = &op, .nops = 1, .dst = buf,
				    .size = 8, .sources = s,
				    .from = RS_DTYPE_F32, .to = RS_DTYPE_BF16 };

		CHECK(rs_executor_run(ex, &job) == -EIO);
		job.ops = &rows;
		job.size = 64;
		CHECK(rs_executor_run(ex, &job) == -EIO);
	}
	rs_executor_destroy(ex);
	rs_sources_free(s);
	snprintf(path, sizeof(path), "%s/src", dir);
	unlink(path);
	rmdir(dir);
	free(content);
}

int main(void)
{
	test_known_values();
	test_exhaustive_small();
	test_exhaustive_properties();
	test_f32_sources();
	test_f64_sources();
	test_ftz_daz();
	test_executor();
	return CHECK_DONE();
}
