/* CUDA executor (gpu/cuda.c): every byte of random jobs - runs, strided
 * rows of many lengths and strides, zero fill, every cast between f32,
 * bf16, f16, f64 and both fp8s - against an element-by-element oracle and
 * against the CPU executor; concurrent submitters; jobs refused (-E2BIG,
 * -EINVAL) or failed by their sources (-EIO, -ESTALE) without harm to the
 * device; the gpus and gpu_mem options.
 *
 * Without a usable device, creating the backend must fail with -ENODEV and
 * one diag line; the test then exits 77 (skipped).  `test_cuda --cpu-only`
 * runs the same random jobs through the CPU executor alone (a check of the
 * generator and the oracle on a machine without a GPU).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "planner/cast_bits.h"
#include "gpu/cuda.h"
#include "gpu/backend.h"
#include "gpu/executor.h"
#include "tests/unit/check.h"
#include "tests/unit/job_waiter.h"
#include "tests/unit/source_file.h"

#define FILE_BYTES (8u << 20)
/* The CUDA lanes' buffers (gpu/cuda.c): result and stage bytes. */
#define RESULT_MAX (4u << 20)
#define STAGE_MAX (8u << 20)
#define MAX_OPS 256
#define PATTERN 0x5A
#define MiB (1024.0 * 1024.0)

static char dir[] = "/tmp/rs_cuda_XXXXXX";
static uint8_t *content;

typedef struct {
	void *impl;
	const rs_executor_ops *ops;
} backend;

static backend cuda, cpu;
static bool have_cuda;

/* --- source file --- */

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static uint64_t below(uint64_t *s, uint64_t n)
{
	return n ? rnd(s) % n : 0;
}

/* [0, 4 MiB) random bits (NaNs, Infs, subnormals of every type);
 * [4, 6 MiB) f32 of moderate size, many on rounding ties of bf16, f16 and
 * the fp8s; [6, 8 MiB) f64 of moderate size, some on f32 ties. */
static void make_content(void)
{
	uint64_t s = 0x9E3779B97F4A7C15ull;
	uint32_t *f = (uint32_t *)(content + (4u << 20));
	uint64_t *d = (uint64_t *)(content + (6u << 20));

	for (size_t i = 0; i < FILE_BYTES; i += 8) {
		uint64_t v = rnd(&s);

		memcpy(content + i, &v, 8);
	}
	for (size_t i = 0; i < (2u << 20) / 4; i++) {
		uint32_t m = (uint32_t)rnd(&s) & 0x7fffffu;
		uint32_t e = 127 - 30 + (uint32_t)below(&s, 50);
		static const uint32_t ties[][2] = {
			{ 0xffffu, 0x8000u },       /* bf16 */
			{ 0x1fffu, 0x1000u },       /* f16 */
			{ 0xfffffu, 0x80000u },     /* e4m3 */
			{ 0x1fffffu, 0x100000u },   /* e5m2 */
		};
		unsigned t = (unsigned)below(&s, 8);

		if (t < 4)
			m = (m & ~ties[t][0]) | ties[t][1];
		f[i] = (uint32_t)(rnd(&s) & 1) << 31 | e << 23 | m;
	}
	for (size_t i = 0; i < (2u << 20) / 8; i++) {
		uint64_t m = rnd(&s) & 0xfffffffffffffull;
		uint64_t e = 1023 - 40 + below(&s, 60);

		if (below(&s, 4) == 0)
			m = (m & ~0x1fffffffull) | 0x10000000ull;
		d[i] = (rnd(&s) & 1) << 63 | e << 52 | m;
	}
}

static rs_sources *make_sources(const char *name)
{
	return rs_test_source(dir, name, content, FILE_BYTES);
}

/* --- jobs --- */

typedef struct {
	rs_copy_op ops[MAX_OPS];
	size_t nops;
	uint64_t size;
	bool zero_fill;
	rs_dtype from, to;
} gen_job;

static const rs_dtype floats[] = {
	RS_DTYPE_F32, RS_DTYPE_BF16, RS_DTYPE_F16,
	RS_DTYPE_F8E4M3, RS_DTYPE_F8E5M2, RS_DTYPE_F64,
};
#define NFLOATS (sizeof(floats) / sizeof(floats[0]))

/* Picks the source rows of `op` (len, count set): packed or strided, whole
 * elements of `g` bytes where the file's typed regions lie. */
static void pick_source(uint64_t *s, rs_copy_op *op, uint64_t g)
{
	uint64_t span;

	op->source = 0;
	op->src_stride = op->len;
	if (op->count > 1 && below(s, 3)) {
		uint64_t extra = below(s, 4) == 0 ? below(s, 64 << 10) : below(s, 512);

		op->src_stride = op->len + extra / g * g;
	}
	span = (op->count - 1) * op->src_stride + op->len;
	if (span > FILE_BYTES) {       /* keep it inside the file */
		op->src_stride = op->len;
		span = op->count * op->len;
	}
	op->src_off = below(s, FILE_BYTES - span + 1);
	if (below(s, 4))
		op->src_off = op->src_off / g * g;
}

/* A random job.  `from`/`to`: a cast, or both invalid for a plain copy. */
static void gen(uint64_t *s, gen_job *j, rs_dtype from, rs_dtype to)
{
	bool cast = from != to;
	uint64_t sf = cast ? rs_dtype_size(from) : 1;
	uint64_t st = cast ? rs_dtype_size(to) : 1;
	/* destination granularity in `from` bytes: odd offsets too for
	 * plain copies */
	static const uint64_t grains[] = { 1, 2, 4, 8, 16, 16, 64 };
	uint64_t g = cast ? sf : grains[below(s, 7)];
	/* destination extent in `from` bytes: the result and stage limits */
	uint64_t cap = (uint64_t)RESULT_MAX / st * sf, want, at = 0;
	size_t target;

	if (cap > STAGE_MAX - MAX_OPS * 16)
		cap = STAGE_MAX - MAX_OPS * 16;
	switch (below(s, 8)) {
	case 0:
		want = cap;                             /* as large as it gets */
		break;
	case 1:
	case 2:
		want = below(s, cap) + 1;
		break;
	default:
		want = below(s, 256 << 10) + 1;
	}
	want = want / g * g;
	if (want < g)
		want = g;
	target = below(s, 3) == 0 ? 1 + below(s, 4) : 1 + below(s, MAX_OPS);
	memset(j, 0, sizeof(*j));
	j->from = from;
	j->to = to;
	j->zero_fill = below(s, 2);
	while (j->nops < target && at < want) {
		uint64_t room = want - at;

		if (below(s, 3) == 0 || room < 4 * g) {
			/* a run, maybe long enough for several pieces */
			rs_copy_op *op = &j->ops[j->nops++];
			uint64_t max = below(s, 4) == 0 ? room : (room < 4096 ? room : 4096);

			op->len = (below(s, max / g) + 1) * g;
			op->count = 1;
			op->dst_off = at;
			op->dst_stride = op->len;
			pick_source(s, op, g);
			at += op->len;
		} else {
			/* a band of `count` rows of pitch `pitch`, split among
			 * up to three interleaved ops */
			uint64_t pitch, count, used = 0;
			size_t k = 1 + below(s, 3);

			if (k > MAX_OPS - j->nops)
				k = MAX_OPS - j->nops;
			switch (below(s, 4)) {
			case 0:
				pitch = (1 + below(s, 8)) * g;
				break;
			case 1:
				pitch = (1 + below(s, (48 << 10) / g)) * g;
				break;
			default:
				pitch = (1 + below(s, 4096 / g)) * g;
			}
			if (pitch > room / 2)
				pitch = room / 2 / g * g;
			count = room / pitch;
			count = 2 + below(s, count - 1 < 2000 ? count - 1 : 2000);
			if (count * pitch > room)
				count = room / pitch;
			for (size_t i = 0; i < k && used < pitch; i++) {
				rs_copy_op *op = &j->ops[j->nops++];
				uint64_t w = (1 + below(s, (pitch - used) / g)) * g;

				if (i + 1 == k && below(s, 2))
					w = pitch - used;       /* fill the row */
				op->len = w;
				op->count = count;
				op->dst_off = at + used;
				op->dst_stride = pitch;
				pick_source(s, op, g);
				used += w;
				if (below(s, 3) == 0 && used < pitch)
					used += (1 + below(s, (pitch - used) / g)) * g / 2 / g * g;
			}
			at += count * pitch;
		}
		if (below(s, 3) == 0) {           /* a hole */
			uint64_t hole = below(s, 64) * g;

			at += hole < want - at ? hole : want - at;
		}
	}
	if (below(s, 2))
		at = want;                      /* a tail no op writes */
	j->size = at / sf * st;
}

/* What the ops say, element by element; `dst` holds PATTERN before. */
static void reference(const gen_job *j, uint8_t *dst)
{
	bool cast = j->from != j->to;
	uint64_t sf = cast ? rs_dtype_size(j->from) : 1;
	uint64_t st = cast ? rs_dtype_size(j->to) : 1;

	if (j->zero_fill)
		memset(dst, 0, j->size);
	for (size_t k = 0; k < j->nops; k++) {
		const rs_copy_op *op = &j->ops[k];

		for (uint64_t r = 0; r < op->count; r++) {
			const uint8_t *src = content + op->src_off + r * op->src_stride;
			uint64_t at = op->dst_off + r * op->dst_stride;

			if (!cast) {
				memcpy(dst + at, src, op->len);
				continue;
			}
			for (uint64_t e = 0; e < op->len / sf; e++)
				rs_store_f32_bits(j->to, dst + at / sf * st + e * st,
						  rs_load_f32_bits(j->from, src + e * sf));
		}
	}
}

typedef rs_test_waiter waiter;

static int wait_job(waiter *w)
{
	return rs_test_waiter_wait(w, 120, "test_cuda");
}

static void fill_job(rs_exec_job *job, const gen_job *j, uint8_t *dst,
		     rs_sources *s, waiter *w)
{
	memset(job, 0, sizeof(*job));
	job->ops = j->ops;
	job->nops = j->nops;
	job->dst = dst;
	job->size = j->size;
	job->zero_fill = j->zero_fill;
	job->sources = s;
	job->from = j->from;
	job->to = j->to;
	rs_test_waiter_init(w, job);
}

/* Runs a job to its end on one backend: its status or submit's error. */
static int run_on(const backend *b, const gen_job *j, uint8_t *dst,
		  rs_sources *s)
{
	rs_exec_job job;
	waiter w;
	int err;

	fill_job(&job, j, dst, s, &w);
	err = b->ops->submit(b->impl, &job);
	if (err)
		return err;
	if (b->ops->help)
		b->ops->help(b->impl, &job);
	err = wait_job(&w);
	CHECK(w.calls == 1);
	rs_test_waiter_free(&w);
	return err;
}

static const char *dname(rs_dtype t)
{
	return t == RS_DTYPE_INVALID ? "-" : rs_dtype_name(t);
}

static void describe(const char *who, const gen_job *j, const uint8_t *got,
		     const uint8_t *want)
{
	uint64_t at = 0;

	while (at < j->size && got[at] == want[at])
		at++;
	fprintf(stderr, "%s: %s->%s size %llu, %zu ops, zero_fill %d: first "
		"wrong byte %llu (got %02x, want %02x)\n", who, dname(j->from),
		dname(j->to), (unsigned long long)j->size, j->nops,
		(int)j->zero_fill, (unsigned long long)at, got[at], want[at]);
	for (size_t k = 0; k < j->nops && k < 8; k++)
		fprintf(stderr, "  op %zu: src %llu dst %llu len %llu count %llu "
			"strides %llu/%llu\n", k,
			(unsigned long long)j->ops[k].src_off,
			(unsigned long long)j->ops[k].dst_off,
			(unsigned long long)j->ops[k].len,
			(unsigned long long)j->ops[k].count,
			(unsigned long long)j->ops[k].src_stride,
			(unsigned long long)j->ops[k].dst_stride);
}

/* One job on the CUDA backend (when there is one) and the CPU one, both
 * checked against the oracle.  Returns the number of mismatches. */
static int compare(const gen_job *j, rs_sources *s, uint8_t *want,
		   uint8_t *got)
{
	int bad = 0, err;

	memset(want, PATTERN, j->size);
	reference(j, want);
	if (have_cuda) {
		memset(got, PATTERN, j->size);
		err = run_on(&cuda, j, got, s);
		CHECK(err == 0);
		if (err == 0 && memcmp(got, want, j->size) != 0) {
			describe("cuda", j, got, want);
			bad++;
		}
	}
	memset(got, PATTERN, j->size);
	err = run_on(&cpu, j, got, s);
	CHECK(err == 0);
	if (err == 0 && memcmp(got, want, j->size) != 0) {
		describe("cpu", j, got, want);
		bad++;
	}
	return bad;
}

static void random_jobs(rs_sources *s, uint64_t seed, int plain, int per_pair)
{
	/* room for a backend that writes a cast's source bytes unconverted:
	 * a wrong result, not a crash */
	uint8_t *want = malloc(STAGE_MAX), *got = malloc(STAGE_MAX);
	gen_job *j = malloc(sizeof(*j));
	uint64_t st = seed;
	int bad = 0, jobs = 0;

	for (int i = 0; i < plain; i++, jobs++) {
		gen(&st, j, RS_DTYPE_INVALID, RS_DTYPE_INVALID);
		bad += compare(j, s, want, got);
	}
	for (size_t a = 0; a < NFLOATS; a++)
		for (size_t b = 0; b < NFLOATS; b++)
			for (int i = 0; i < per_pair && a != b; i++, jobs++) {
				gen(&st, j, floats[a], floats[b]);
				bad += compare(j, s, want, got);
			}
	printf("random jobs (seed %llu): %d, %d wrong\n",
	       (unsigned long long)seed, jobs, bad);
	CHECK(bad == 0);
	free(j);
	free(want);
	free(got);
}

/* --- concurrency --- */

typedef struct {
	rs_sources *s;
	uint64_t seed;
	int bad;
} thread_arg;

/* Jobs from several threads at once, each also keeping several in flight. */
static void *submitter(void *p)
{
	thread_arg *t = p;
	enum { DEPTH = 4, ROUNDS = 12 };
	gen_job *j = malloc(DEPTH * sizeof(*j));
	uint8_t *got[DEPTH], *want = malloc(RESULT_MAX);
	rs_exec_job job[DEPTH];
	waiter w[DEPTH];
	bool submitted[DEPTH];

	for (int i = 0; i < DEPTH; i++)
		got[i] = malloc(RESULT_MAX);
	for (int round = 0; round < ROUNDS; round++) {
		for (int i = 0; i < DEPTH; i++) {
			size_t a = below(&t->seed, NFLOATS), b = below(&t->seed, NFLOATS);

			if (a == b || below(&t->seed, 2))
				gen(&t->seed, &j[i], RS_DTYPE_INVALID, RS_DTYPE_INVALID);
			else
				gen(&t->seed, &j[i], floats[a], floats[b]);
			memset(got[i], PATTERN, j[i].size);
			fill_job(&job[i], &j[i], got[i], t->s, &w[i]);
			submitted[i] = cuda.ops->submit(cuda.impl, &job[i]) == 0;
		}
		for (int i = 0; i < DEPTH; i++) {
			int bad = !submitted[i] || wait_job(&w[i]) != 0;

			rs_test_waiter_free(&w[i]);
			if (bad) {
				t->bad++;
				continue;
			}
			memset(want, PATTERN, j[i].size);
			reference(&j[i], want);
			if (memcmp(got[i], want, j[i].size) != 0) {
				describe("cuda (threads)", &j[i], got[i], want);
				t->bad++;
			}
		}
	}
	for (int i = 0; i < DEPTH; i++)
		free(got[i]);
	free(want);
	free(j);
	return NULL;
}

static void concurrent(rs_sources *s)
{
	enum { THREADS = 8 };
	pthread_t th[THREADS];
	thread_arg args[THREADS];

	for (int i = 0; i < THREADS; i++) {
		args[i] = (thread_arg){ s, 1000 + (uint64_t)i * 7919, 0 };
		CHECK(pthread_create(&th[i], NULL, submitter, &args[i]) == 0);
	}
	for (int i = 0; i < THREADS; i++) {
		pthread_join(th[i], NULL);
		CHECK(args[i].bad == 0);
	}
}

/* --- throughput (printed, not checked) --- */

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* 64 blocks of 4 MiB, 8 in flight, on each backend: a plain strided
 * gather (2 KiB rows of 4 KiB) and f32 state shown as bf16. */
static void throughput(rs_sources *s)
{
	enum { JOBS = 64, DEPTH = 8 };
	gen_job *j = calloc(2, sizeof(*j));
	uint8_t *out = malloc((size_t)DEPTH * RESULT_MAX + STAGE_MAX);
	const backend *bs[2] = { &cuda, &cpu };

	/* [0] 2048 rows of 2 KiB at a 4 KiB source stride: 4 MiB */
	j[0].nops = 1;
	j[0].ops[0] = (rs_copy_op){ 0, 0, 0, 2048, 2048, 4096, 2048 };
	j[0].size = 4u << 20;
	/* [1] 8 MiB of f32 (the typed region and what follows) as 4 MiB bf16 */
	j[1].nops = 1;
	j[1].ops[0] = (rs_copy_op){ 0, 0, 0, 8u << 20, 1, 8u << 20, 8u << 20 };
	j[1].size = 4u << 20;
	j[1].from = RS_DTYPE_F32;
	j[1].to = RS_DTYPE_BF16;
	for (int k = 0; k < 2; k++)
		for (int b = 0; b < 2; b++) {
			rs_exec_job job[DEPTH];
			waiter w[DEPTH];
			double t0 = now_s(), dt;
			int failed = 0;

			for (int n = 0; n < JOBS; n += DEPTH) {
				for (int i = 0; i < DEPTH; i++) {
					fill_job(&job[i], &j[k], out + (size_t)i * RESULT_MAX,
						 s, &w[i]);
					if (bs[b]->ops->submit(bs[b]->impl, &job[i]) != 0) {
						failed++;
						w[i].calls = 1;
					}
				}
				for (int i = 0; i < DEPTH; i++) {
					failed += wait_job(&w[i]) != 0;
					rs_test_waiter_free(&w[i]);
				}
			}
			dt = now_s() - t0;
			CHECK(failed == 0);
			printf("throughput: %s, %s: %.2f GB/s of result (%d x 4 MiB "
			       "in %.3f s)\n", k ? "f32->bf16" : "strided rows",
			       b ? "cpu" : "cuda", JOBS * 4.0 * MiB / dt / 1e9, JOBS, dt);
		}
	free(out);
	free(j);
}

/* --- refusals and failures --- */

static int submit_only(const gen_job *j, uint8_t *dst, rs_sources *s,
		       bool *called)
{
	rs_exec_job job;
	waiter w;
	int err;

	fill_job(&job, j, dst, s, &w);
	err = cuda.ops->submit(cuda.impl, &job);
	if (err == 0)
		wait_job(&w);
	*called = w.calls != 0;
	rs_test_waiter_free(&w);
	return err;
}

static void refusals(rs_sources *s)
{
	gen_job *j = calloc(1, sizeof(*j));
	uint8_t *buf = malloc(RESULT_MAX + 64);
	bool called;

	/* a result larger than a lane's */
	j->nops = 1;
	j->ops[0] = (rs_copy_op){ 0, 0, 0, 64, 1, 64, 64 };
	j->size = RESULT_MAX + 1;
	CHECK(submit_only(j, buf, s, &called) == -E2BIG && !called);
	/* more source than the stage: a 4 MiB-ish fp8 block of f32 */
	j->from = RS_DTYPE_F32;
	j->to = RS_DTYPE_F8E4M3;
	j->ops[0] = (rs_copy_op){ 0, 0, 0, STAGE_MAX + 4, 1, STAGE_MAX + 4, STAGE_MAX + 4 };
	j->size = (STAGE_MAX + 4) / 4;
	CHECK(submit_only(j, buf, s, &called) == -E2BIG && !called);
	/* more ops than the tables hold */
	{
		rs_copy_op *many = calloc(20000, sizeof(*many));
		rs_exec_job job;
		waiter w;

		for (size_t i = 0; i < 20000; i++)
			many[i] = (rs_copy_op){ 0, i, i, 1, 1, 1, 1 };
		fill_job(&job, j, buf, s, &w);
		job.ops = many;
		job.nops = 20000;
		job.size = 20000;
		job.from = job.to = RS_DTYPE_INVALID;
		CHECK(cuda.ops->submit(cuda.impl, &job) == -E2BIG && w.calls == 0);
		rs_test_waiter_free(&w);
		free(many);
	}
	/* a cast row that is not whole elements */
	j->from = RS_DTYPE_F32;
	j->to = RS_DTYPE_BF16;
	j->ops[0] = (rs_copy_op){ 0, 0, 0, 6, 1, 6, 6 };
	j->size = 4;
	CHECK(submit_only(j, buf, s, &called) == -EINVAL && !called);
	/* an op writing past the destination */
	j->from = j->to = RS_DTYPE_INVALID;
	j->ops[0] = (rs_copy_op){ 0, 0, 100, 64, 3, 64, 64 };
	j->size = 100 + 3 * 64 - 1;
	CHECK(submit_only(j, buf, s, &called) == -EINVAL && !called);
	j->ops[0] = (rs_copy_op){ 0, 0, 0, 64, 3, 64, UINT64_MAX / 2 };
	j->size = 4096;
	CHECK(submit_only(j, buf, s, &called) == -EINVAL && !called);
	/* a cast between non-float types */
	j->from = RS_DTYPE_I32;
	j->to = RS_DTYPE_F32;
	j->ops[0] = (rs_copy_op){ 0, 0, 0, 64, 1, 64, 64 };
	j->size = 64;
	CHECK(submit_only(j, buf, s, &called) == -EINVAL && !called);
	/* nothing to copy: done at once, zero filled */
	j->from = j->to = RS_DTYPE_INVALID;
	j->nops = 0;
	j->size = 64;
	j->zero_fill = true;
	memset(buf, PATTERN, 64);
	CHECK(submit_only(j, buf, s, &called) == 0 && called);
	CHECK(buf[0] == 0 && buf[63] == 0);

	/* sources shorter than the rows: -EIO, never zeros; the device
	 * stays usable */
	j->nops = 1;
	j->zero_fill = false;
	j->ops[0] = (rs_copy_op){ 0, FILE_BYTES - 10, 0, 20, 1, 20, 20 };
	j->size = 20;
	CHECK(run_on(&cuda, j, buf, s) == -EIO);
	j->ops[0] = (rs_copy_op){ 0, FILE_BYTES - 3000, 0, 100, 5, 1000, 100 };
	j->size = 500;
	CHECK(run_on(&cuda, j, buf, s) == -EIO);       /* mapped rows */
	j->ops[0] = (rs_copy_op){ 0, FILE_BYTES - 30000, 0, 8192, 3, 16384, 8192 };
	j->size = 3 * 8192;
	CHECK(run_on(&cuda, j, buf, s) == -EIO);       /* pread rows */
	j->ops[0] = (rs_copy_op){ 0, 12345, 0, 1000, 1, 1000, 1000 };
	j->size = 1000;
	CHECK(run_on(&cuda, j, buf, s) == 0);
	CHECK(memcmp(buf, content + 12345, 1000) == 0);
	CHECK(rs_cuda_last_error(cuda.impl) == NULL);

	/* a source replaced after it was recorded: -ESTALE */
	{
		rs_sources *s2 = make_sources("src2");
		char path[64];

		snprintf(path, sizeof(path), "%s/src2", dir);
		CHECK(unlink(path) == 0);
		rs_sources_free(make_sources("src2"));  /* same bytes, new inode */
		CHECK(run_on(&cuda, j, buf, s2) == -ESTALE);
		rs_sources_free(s2);
		unlink(path);
	}
	/* source bytes counted once, as read */
	{
		uint64_t before = rs_sources_bytes_read(s);

		j->ops[0] = (rs_copy_op){ 0, 0, 0, 300, 7, 1000, 300 };
		j->size = 2100;
		CHECK(run_on(&cuda, j, buf, s) == 0);
		CHECK(rs_sources_bytes_read(s) - before == 2100);
	}
	free(buf);
	free(j);
}

/* --- options --- */

static int create_with(const rs_executor_opts *o, backend *b, size_t *lines,
		       const char **first)
{
	static char line[512];
	rs_diag *d = rs_diag_new();
	int err = rs_cuda_executor_create(&b->impl, &b->ops, o, d);

	*lines = rs_diag_count(d);
	line[0] = 0;
	if (*lines && rs_diag_line(d, 0))
		snprintf(line, sizeof(line), "%s", rs_diag_line(d, 0));
	*first = line;
	rs_diag_free(d);
	return err;
}

/* Option errors come before any device is looked at. */
static void bad_options(void)
{
	rs_executor_opts o = { .kind = RS_EXECUTOR_CUDA };
	backend b;
	size_t lines;
	const char *line;

	o.ngpus = 2;
	o.gpus[0] = 0;
	o.gpus[1] = 0;
	CHECK(create_with(&o, &b, &lines, &line) == -EINVAL && lines == 1);
	o.ngpus = 1;
	o.gpus[0] = -1;
	CHECK(create_with(&o, &b, &lines, &line) == -EINVAL && lines == 1);
	o.ngpus = RS_MAX_GPUS + 1;
	CHECK(create_with(&o, &b, &lines, &line) == -EINVAL && lines == 1);
}

/* n random jobs on backend b (every other one an f32->bf16 cast when
 * `casts`), each checked against the reference: the number wrong. */
static int checked_jobs(const backend *b, rs_sources *s, uint64_t *seed,
			int n, bool casts)
{
	gen_job *j = malloc(sizeof(*j));
	uint8_t *want = malloc(RESULT_MAX), *got = malloc(RESULT_MAX);
	int bad = 0;

	CHECK(j && want && got);
	for (int i = 0; i < n && j && want && got; i++) {
		bool cast = casts && i % 2;

		gen(seed, j, cast ? RS_DTYPE_F32 : RS_DTYPE_INVALID,
		    cast ? RS_DTYPE_BF16 : RS_DTYPE_INVALID);
		memset(want, PATTERN, j->size);
		reference(j, want);
		memset(got, PATTERN, j->size);
		bad += run_on(b, j, got, s) != 0 ||
		       memcmp(got, want, j->size) != 0;
	}
	free(j);
	free(want);
	free(got);
	return bad;
}

static void options(rs_sources *s)
{
	rs_executor_opts o = { .kind = RS_EXECUTOR_CUDA };
	int count = 0;
	backend b;
	size_t lines;
	const char *line;
	uint64_t seed = 77;

	CHECK(cudaGetDeviceCount(&count) == cudaSuccess && count > 0);
	/* gpu_mem below one lane */
	o.gpu_mem = 1u << 20;
	CHECK(create_with(&o, &b, &lines, &line) == -ENOMEM && lines == 1);
	CHECK(strstr(line, "gpu_mem") != NULL);
	printf("gpu_mem=1M: %s\n", line);
	/* a device that is not there */
	o.gpu_mem = 0;
	o.ngpus = 1;
	o.gpus[0] = count;
	CHECK(create_with(&o, &b, &lines, &line) == -ENODEV && lines == 1);
	printf("gpus=%d: %s\n", count, line);
	/* the last device alone, with room for one lane only */
	o.gpus[0] = count - 1;
	o.gpu_mem = 16u << 20;
	CHECK(create_with(&o, &b, &lines, &line) == 0 && lines == 0);
	if (lines == 0) {
		CHECK(checked_jobs(&b, s, &seed, 20, true) == 0);
		b.ops->destroy(b.impl);
	}
	/* every device, listed in reverse */
	if (count > 1) {
		o.gpu_mem = 0;
		o.ngpus = (unsigned)(count < RS_MAX_GPUS ? count : RS_MAX_GPUS);
		for (unsigned i = 0; i < o.ngpus; i++)
			o.gpus[i] = (int)(o.ngpus - 1 - i);
		CHECK(create_with(&o, &b, &lines, &line) == 0);
		if (lines == 0) {
			CHECK(checked_jobs(&b, s, &seed, 40, false) == 0);
			b.ops->destroy(b.impl);
		}
	}
}

int main(int argc, char **argv)
{
	bool cpu_only = argc > 1 && strcmp(argv[1], "--cpu-only") == 0;
	rs_executor_opts o = { .kind = RS_EXECUTOR_CUDA };
	rs_sources *s;
	size_t lines;
	const char *line;
	char path[64];
	int err;

	setvbuf(stdout, NULL, _IOLBF, 0);
	bad_options();
	if (!cpu_only) {
		err = create_with(&o, &cuda, &lines, &line);
		if (err == -ENODEV) {
			CHECK(lines == 1 && line[0] != 0);
			printf("no CUDA device: %s\n", line);
			if (check_failed)
				return CHECK_DONE();
			printf("skipped: the CUDA executor needs a device\n");
			return 77;
		}
		CHECK(err == 0 && lines == 0);
		if (err)
			return CHECK_DONE();
		have_cuda = true;
	}
	content = malloc(FILE_BYTES);
	make_content();
	CHECK(mkdtemp(dir) != NULL);
	s = make_sources("src");
	CHECK(rs_cpu_executor_create(&cpu.impl, &cpu.ops, 4) == 0);

	random_jobs(s, 1, 300, 8);
	if (have_cuda) {
		uint64_t h2d, h2d_ns, d2h, d2h_ns;

		concurrent(s);
		throughput(s);
		refusals(s);
		options(s);
		rs_cuda_transfer_stats(cuda.impl, &h2d, &h2d_ns, &d2h, &d2h_ns);
		CHECK(h2d > 0 && h2d_ns > 0 && d2h > 0 && d2h_ns > 0);
		printf("transfers: H2D %llu bytes at %.2f GB/s, D2H %llu bytes "
		       "at %.2f GB/s (small jobs: latency bound)\n",
		       (unsigned long long)h2d, h2d_ns ? (double)h2d / h2d_ns : 0,
		       (unsigned long long)d2h, d2h_ns ? (double)d2h / d2h_ns : 0);
		CHECK(rs_cuda_last_error(cuda.impl) == NULL);
		cuda.ops->destroy(cuda.impl);
	}
	cpu.ops->destroy(cpu.impl);
	rs_sources_free(s);
	snprintf(path, sizeof(path), "%s/src", dir);
	unlink(path);
	rmdir(dir);
	free(content);
	return CHECK_DONE();
}
