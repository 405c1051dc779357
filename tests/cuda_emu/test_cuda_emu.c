/* test_cuda_emu: the CUDA executor (gpu/cuda.c, the real host code, with
 * the real kernel bodies of gpu/cuda_kernels.cu run one thread at a time)
 * on the stand-in runtime of fake_cudart.c, where failures can be injected
 * that a real GPU gives only by accident:
 *
 *   no-device        no device: create says -ENODEV with one diag line,
 *                    through the backend, the dispatcher and the probe;
 *                    AUTO runs every job on the CPU
 *   oom              out of device memory: -ENOMEM with one diag line, at
 *                    every one of the allocations create makes, and
 *                    nothing left allocated; AUTO runs on the CPU
 *   no-kernel-image  kernels not built for the device: -ENODEV, the line
 *                    names the architecture to build for
 *   mid-run          the only device fails while jobs run: each job ends
 *                    once, with its bytes or -ENODEV; later submits are
 *                    refused with -ENODEV; the error names the device
 *   one-of-two       one of two devices fails: at most its two lanes' jobs
 *                    end -ENODEV, then every job runs on the other device
 *   dispatch-cuda    rs_executor_create(RS_EXECUTOR_CUDA) with the real
 *                    backend: jobs of every kind on the device, a job too
 *                    large for it rerun on the CPU, then a device failure:
 *                    every job still ends with the right bytes (the
 *                    fallback to the CPU), the log told once
 *   dispatch-auto    RS_EXECUTOR_AUTO with the real backend: both backends
 *                    take jobs, every result right
 *   probe            rs_executor_probe in a child process: 0 with a
 *                    device, -ENODEV and the child's line without
 *
 * tests/cuda_emu/CMakeLists.txt runs each as a ctest case; the random-job
 * comparison with the CPU executor is tests/unit/test_cuda.c, built
 * against the same stand-in.
 *
 * What the emulator cannot check (real timing, the real memory model,
 * warp-level behaviour, the errors a real driver gives) is listed in
 * fake_cudart.c and gen_emu.py; test_cuda on a GPU covers those.
 */
#include <cuda_runtime_api.h>
#include <errno.h>
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
#include "tests/cuda_emu/fake_cudart.h"
#include "tests/unit/check.h"
#include "tests/unit/job_waiter.h"

#define FILE_BYTES (4u << 20)
#define PATTERN 0x5A
#define MAX_OPS 8

static char dir[] = "/tmp/rs_cuda_emu_XXXXXX";
static uint8_t *content;
static rs_sources *sources;

/* --- source and jobs --- */

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Random bits, then (from 2 MiB) f32 of moderate size. */
static void make_source(void)
{
	uint64_t s = 0x9E3779B97F4A7C15ull;
	char path[64];
	struct stat st;
	rs_file_id id;
	uint32_t idx;
	FILE *f;

	content = malloc(FILE_BYTES);
	for (size_t i = 0; i < FILE_BYTES; i += 8) {
		uint64_t v = rnd(&s);

		memcpy(content + i, &v, 8);
	}
	for (size_t i = 2u << 20; i < FILE_BYTES; i += 4) {
		uint32_t v = (uint32_t)(rnd(&s) & 0x807fffffu) |
			     (uint32_t)(100 + rnd(&s) % 50) << 23;

		memcpy(content + i, &v, 4);
	}
	CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/src", dir);
	f = fopen(path, "wb");
	CHECK(f && fwrite(content, 1, FILE_BYTES, f) == FILE_BYTES);
	if (f)
		fclose(f);
	CHECK(stat(path, &st) == 0);
	rs_file_id_from_stat(&id, &st);
	CHECK(rs_sources_open(&sources, dir) == 0);
	CHECK(rs_sources_add(sources, "src", &id, &idx) == 0 && idx == 0);
}

static void drop_source(void)
{
	char path[64];

	rs_sources_free(sources);
	snprintf(path, sizeof(path), "%s/src", dir);
	unlink(path);
	rmdir(dir);
	free(content);
}

typedef struct {
	rs_copy_op ops[MAX_OPS];
	size_t nops;
	uint64_t size;
	bool zero_fill;
	rs_dtype from, to;
	uint8_t *dst, *want;
	rs_exec_job job;
	rs_test_waiter w;       /* w.calls: times done was called */
} tjob;

enum {
	J_RUNS,         /* three runs: cudaMemcpyAsync on the device */
	J_STRIDED,      /* strided rows: cudaMemcpy2DAsync */
	J_GATHER,       /* eight strided ops: the gather kernel */
	J_CAST,         /* f32 -> bf16: the cast kernel */
	J_CAST_ANY,     /* bf16 -> f16 (bits of any kind): the generic cast */
	J_TOO_BIG,      /* 9 MiB of source: larger than a lane's stage */
	J_KINDS
};

/* What the ops say, element by element. */
static void reference(tjob *t)
{
	bool cast = t->from != t->to;
	uint64_t sf = cast ? rs_dtype_size(t->from) : 1;
	uint64_t st = cast ? rs_dtype_size(t->to) : 1;

	memset(t->want, PATTERN, t->size);
	if (t->zero_fill)
		memset(t->want, 0, t->size);
	for (size_t k = 0; k < t->nops; k++) {
		const rs_copy_op *op = &t->ops[k];

		for (uint64_t r = 0; r < op->count; r++) {
			const uint8_t *src = content + op->src_off + r * op->src_stride;
			uint64_t at = op->dst_off + r * op->dst_stride;

			if (!cast) {
				memcpy(t->want + at, src, op->len);
				continue;
			}
			for (uint64_t e = 0; e < op->len / sf; e++)
				rs_store_f32_bits(t->to, t->want + at / sf * st + e * st,
						  rs_load_f32_bits(t->from, src + e * sf));
		}
	}
}

static tjob *tjob_new(int kind, uint64_t seed)
{
	tjob *t = calloc(1, sizeof(*t));
	uint64_t s = seed * 2654435761u + 1, v = rnd(&s) % 64;

	t->zero_fill = seed & 1;
	switch (kind) {
	case J_RUNS:
		t->nops = 3;
		for (int i = 0; i < 3; i++)
			t->ops[i] = (rs_copy_op){ 0, rnd(&s) % (2u << 20), 10000u * i + v,
						  5000 + v, 1, 5000 + v, 5000 + v };
		t->size = 31000;
		break;
	case J_STRIDED:
		t->nops = 1;
		t->ops[0] = (rs_copy_op){ 0, v * 16, 8, 1000 + v, 700, 1500, 1100 };
		t->size = 8 + 699 * 1100 + 1000 + v + 300;
		break;
	case J_GATHER:
		t->nops = 8;
		for (int i = 0; i < 8; i++)
			t->ops[i] = (rs_copy_op){ 0, rnd(&s) % (1u << 20), 24u * i + v % 8,
						  24, 300, 100 + v, 200 };
		t->size = 300 * 200;
		break;
	case J_CAST:
		t->from = RS_DTYPE_F32;
		t->to = RS_DTYPE_BF16;
		t->nops = 2;
		t->ops[0] = (rs_copy_op){ 0, (2u << 20) + v * 4, 0, 40000, 3, 60000, 40000 };
		t->ops[1] = (rs_copy_op){ 0, (3u << 20) + v * 4, 120000 + 400, 2048, 1, 2048, 2048 };
		t->size = (120000 + 400 + 2048) / 2;
		break;
	case J_CAST_ANY:
		t->from = RS_DTYPE_BF16;
		t->to = RS_DTYPE_F16;
		t->nops = 1;
		t->ops[0] = (rs_copy_op){ 0, v * 2, 0, 1000, 50, 1030, 1000 };
		t->size = 50 * 1000;
		break;
	case J_TOO_BIG:
		/* three times the same 3 MiB of f32 as fp8: 9 MiB of stage */
		t->from = RS_DTYPE_F32;
		t->to = RS_DTYPE_F8E4M3;
		t->nops = 3;
		for (int i = 0; i < 3; i++)
			t->ops[i] = (rs_copy_op){ 0, 1u << 20, (3ull << 20) * i, 3u << 20, 1,
						  3u << 20, 3u << 20 };
		t->size = (9u << 20) / 4;
		break;
	}
	t->dst = malloc(t->size);
	t->want = malloc(t->size);
	memset(t->dst, PATTERN, t->size);
	reference(t);
	t->job.ops = t->ops;
	t->job.nops = t->nops;
	t->job.dst = t->dst;
	t->job.size = t->size;
	t->job.zero_fill = t->zero_fill;
	t->job.sources = sources;
	t->job.from = t->from;
	t->job.to = t->to;
	rs_test_waiter_init(&t->w, &t->job);
	return t;
}

/* The job's status once done has been called; a job that never ends
 * fails the test at once. */
static int tjob_wait(tjob *t)
{
	return rs_test_waiter_wait(&t->w, 60, "test_cuda_emu");
}

static bool tjob_right(const tjob *t)
{
	return memcmp(t->dst, t->want, t->size) == 0;
}

static void tjob_free(tjob *t)
{
	rs_test_waiter_free(&t->w);
	free(t->dst);
	free(t->want);
	free(t);
}

/* --- helpers --- */

typedef struct {
	void *impl;
	const rs_executor_ops *ops;
} backend;

static size_t nlines;
static char line0[512];

/* Creates the CUDA backend; its diag lines are counted in nlines, the
 * first kept in line0. */
static int create_cuda(backend *b, const rs_executor_opts *o)
{
	rs_diag *d = rs_diag_new();
	int err = rs_cuda_executor_create(&b->impl, &b->ops, o, d);

	nlines = rs_diag_count(d);
	snprintf(line0, sizeof(line0), "%s", nlines ? rs_diag_line(d, 0) : "");
	if (nlines)
		printf("  diag: %s\n", line0);
	rs_diag_free(d);
	return err;
}

static int create_exec(rs_executor **ex, const rs_executor_opts *o)
{
	rs_diag *d = rs_diag_new();
	int err = rs_executor_create(ex, o, d);

	nlines = rs_diag_count(d);
	snprintf(line0, sizeof(line0), "%s", nlines ? rs_diag_line(d, 0) : "");
	for (size_t i = 0; i < nlines; i++)
		printf("  diag: %s\n", rs_diag_line(d, i));
	rs_diag_free(d);
	return err;
}

static long live(void)
{
	fake_cuda_counters c;

	fake_cuda_get_counters(&c);
	return c.live;
}

/* Runs one job of each kind but the too-big one through the executor:
 * the number whose bytes are wrong or that failed. */
static int run_kinds(rs_executor *ex, uint64_t seed)
{
	int bad = 0;

	for (int k = 0; k < J_TOO_BIG; k++) {
		tjob *t = tjob_new(k, seed + (uint64_t)k);
		int err = rs_executor_run(ex, &t->job);

		if (err || !tjob_right(t)) {
			fprintf(stderr, "job kind %d (seed %llu): status %d, %s bytes\n",
				k, (unsigned long long)seed, err,
				tjob_right(t) ? "right" : "wrong");
			bad++;
		}
		tjob_free(t);
	}
	return bad;
}

/* --- cases --- */

static void case_no_device(void)
{
	rs_executor_opts o = { .kind = RS_EXECUTOR_CUDA };
	char want[256];
	rs_executor_stats stats;
	rs_executor *ex = NULL;
	backend b;
	rs_diag *d;

	fake_cuda_reset(0);
	CHECK(create_cuda(&b, &o) == -ENODEV && nlines == 1);
	CHECK(strstr(line0, "cuda: no usable device: no NVIDIA driver or GPU found") == line0);
	fake_cuda_driver(0);    /* none at all: the runtime's error, our words */
	CHECK(create_cuda(&b, &o) == -ENODEV && nlines == 1);
	CHECK(strstr(line0, "cuda: no usable device: no NVIDIA driver or GPU found") == line0);
	fake_cuda_driver(CUDART_VERSION - 1000);        /* an older one */
	snprintf(want, sizeof(want), "cuda: no usable device: CUDA driver version is insufficient for CUDA runtime version (the driver supports CUDA %d.0, this reshardfs needs %d.%d)",
		 CUDART_VERSION / 1000 - 1, CUDART_VERSION / 1000,
		 CUDART_VERSION % 1000 / 10);
	CHECK(create_cuda(&b, &o) == -ENODEV && nlines == 1);
	CHECK(strcmp(line0, want) == 0);
	fake_cuda_reset(0);

	CHECK(create_exec(&ex, &o) == -ENODEV && nlines == 1);
	CHECK(strncmp(line0, "executor=cuda: ", 15) == 0);
	ex = NULL;

	d = rs_diag_new();
	CHECK(rs_executor_probe(&o, d) == -ENODEV && rs_diag_count(d) == 1);
	CHECK(rs_diag_count(d) && strstr(rs_diag_line(d, 0), "no usable device"));
	rs_diag_free(d);

	/* AUTO: a note, and the CPU runs everything */
	o.kind = RS_EXECUTOR_AUTO;
	o.threads = 2;
	CHECK(create_exec(&ex, &o) == 0);
	if (!ex)
		return;
	CHECK(strstr(rs_executor_cuda_status(ex), "no usable device") != NULL);
	CHECK(run_kinds(ex, 1) == 0);
	rs_executor_get_stats(ex, &stats);
	CHECK(stats.cuda_built && !stats.cuda_usable);
	CHECK(stats.cuda.jobs == 0 && stats.cpu.jobs == J_TOO_BIG);
	rs_executor_destroy(ex);
	CHECK(live() == 0);
}

static void case_oom(void)
{
	rs_executor_opts o = { .kind = RS_EXECUTOR_CUDA };
	rs_executor_stats stats;
	rs_executor *ex = NULL;
	backend b;
	int failures = 0;

	/* 2 devices x 2 lanes x 3 buffers: the n-th allocation fails for
	 * every n, and whatever was made before it is freed */
	for (long n = 0; n < 12; n++) {
		fake_cuda_reset(2);
		fake_cuda_oom_after(n);
		if (create_cuda(&b, &o) != -ENOMEM || nlines != 1 ||
		    !strstr(line0, "cudaMalloc") || !strstr(line0, "out of memory") ||
		    live() != 0) {
			fprintf(stderr, "allocation %ld failing: wrong outcome\n", n);
			failures++;
		}
	}
	CHECK(failures == 0);
	fake_cuda_reset(2);
	fake_cuda_oom_after(12);
	CHECK(create_cuda(&b, &o) == 0 && nlines == 0);
	if (nlines == 0)
		b.ops->destroy(b.impl);
	CHECK(live() == 0);

	/* through the dispatcher */
	fake_cuda_reset(2);
	fake_cuda_oom_after(5);
	CHECK(create_exec(&ex, &o) == -ENOMEM && nlines == 1);
	CHECK(strncmp(line0, "executor=cuda: cuda device", 26) == 0);
	CHECK(live() == 0);
	o.kind = RS_EXECUTOR_AUTO;
	o.threads = 2;
	fake_cuda_reset(2);
	fake_cuda_oom_after(0);
	ex = NULL;
	CHECK(create_exec(&ex, &o) == 0);
	if (!ex)
		return;
	CHECK(strstr(rs_executor_cuda_status(ex), "out of memory") != NULL);
	CHECK(run_kinds(ex, 2) == 0);
	rs_executor_get_stats(ex, &stats);
	CHECK(!stats.cuda_usable && stats.cuda.jobs == 0);
	rs_executor_destroy(ex);
	CHECK(live() == 0);
}

static void case_no_kernel_image(void)
{
	rs_executor_opts o = { .kind = RS_EXECUTOR_CUDA };
	backend b;

	fake_cuda_reset(2);
	fake_cuda_no_kernel_image(true);
	CHECK(create_cuda(&b, &o) == -ENODEV && nlines == 1);
	CHECK(strstr(line0, "no kernel of this build") != NULL);
	CHECK(strstr(line0, "CMAKE_CUDA_ARCHITECTURES=90") != NULL);
	CHECK(live() == 0);
}

static void case_mid_run(void)
{
	enum { N = 12 };
	rs_executor_opts o = { .kind = RS_EXECUTOR_CUDA };
	tjob *t[N];
	int err[N], ok = 0, nodev = 0, refused = 0, bad = 0;
	const char *why;
	backend b;

	fake_cuda_reset(1);
	CHECK(create_cuda(&b, &o) == 0 && nlines == 0);
	if (nlines)
		return;
	/* healthy first */
	for (int i = 0; i < 6; i++) {
		tjob *j = tjob_new(i % J_TOO_BIG, 100 + (uint64_t)i);

		CHECK(b.ops->submit(b.impl, &j->job) == 0);
		CHECK(tjob_wait(j) == 0 && j->w.calls == 1 && tjob_right(j));
		tjob_free(j);
	}
	CHECK(rs_cuda_last_error(b.impl) == NULL);

	/* the device fails at the 30th stream operation from here (a job
	 * is 8 or 9): with two lanes, after at least one job has ended */
	fake_cuda_fail_after(30);
	/* all queued at once: the jobs waiting when the device goes end with
	 * -ENODEV from the lane that retires it */
	for (int i = 0; i < N; i++)
		t[i] = tjob_new(J_GATHER + i % 3, 200 + (uint64_t)i);
	for (int i = 0; i < N; i++)
		err[i] = b.ops->submit(b.impl, &t[i]->job);
	for (int i = 0; i < N; i++) {
		int st = err[i] ? err[i] : tjob_wait(t[i]);

		if (err[i] == -ENODEV && t[i]->w.calls == 0)
			refused++;
		else if (err[i] != 0)
			bad++;
		else if (st == 0 && tjob_right(t[i]))
			ok++;
		else if (st == -ENODEV)
			nodev++;
		else
			bad++;
	}
	/* calls are counted once every job has ended: none may come twice */
	usleep(20000);
	for (int i = 0; i < N; i++) {
		CHECK(t[i]->w.calls == (err[i] ? 0 : 1));
		tjob_free(t[i]);
	}
	printf("  mid-run: %d right, %d -ENODEV, %d refused at submit, %d wrong\n",
	       ok, nodev, refused, bad);
	CHECK(bad == 0 && nodev >= 1 && ok >= 1 && ok + nodev + refused == N);

	/* from now on refused at once, done never called */
	{
		tjob *j = tjob_new(J_CAST, 300);

		CHECK(b.ops->submit(b.impl, &j->job) == -ENODEV);
		usleep(10000);
		CHECK(j->w.calls == 0);
		tjob_free(j);
	}
	why = rs_cuda_last_error(b.impl);
	CHECK(why != NULL);
	if (why) {
		printf("  last error: %s\n", why);
		CHECK(strstr(why, "cuda device 0 (Fake GPU 0)") != NULL);
		CHECK(strstr(why, "illegal memory access") != NULL);
		CHECK(rs_cuda_last_error(b.impl) == why);
	}
	b.ops->destroy(b.impl);
	CHECK(live() == 0);
}

static void case_one_of_two(void)
{
	enum { DEPTH = 8 };
	rs_executor_opts o = { .kind = RS_EXECUTOR_CUDA };
	fake_cuda_counters before, after;
	int nodev = 0, ok = 0, bad = 0, rounds = 0;
	uint64_t seed = 1000;
	backend b;

	fake_cuda_reset(2);
	CHECK(create_cuda(&b, &o) == 0 && nlines == 0);
	if (nlines)
		return;
	fake_cuda_kill_device(0);
	/* until one of device 0's lanes has taken a job, failed it and
	 * retired the device */
	while (!rs_cuda_last_error(b.impl) && rounds++ < 50) {
		tjob *t[DEPTH];

		for (int i = 0; i < DEPTH; i++) {
			t[i] = tjob_new(J_RUNS + i % J_TOO_BIG, seed++);
			CHECK(b.ops->submit(b.impl, &t[i]->job) == 0);
		}
		for (int i = 0; i < DEPTH; i++) {
			int st = tjob_wait(t[i]);

			if (st == -ENODEV)
				nodev++;
			else if (st == 0 && tjob_right(t[i]))
				ok++;
			else
				bad++;
			tjob_free(t[i]);
		}
	}
	printf("  one-of-two: device 0 retired after %d rounds: %d right, "
	       "%d -ENODEV\n", rounds, ok, nodev);
	CHECK(rs_cuda_last_error(b.impl) != NULL);
	CHECK(rs_cuda_last_error(b.impl) &&
	      strstr(rs_cuda_last_error(b.impl), "cuda device 0 ") != NULL);
	CHECK(bad == 0 && nodev >= 1 && nodev <= 2);

	/* device 1 carries on alone */
	fake_cuda_get_counters(&before);
	bad = 0;
	for (int r = 0; r < 4; r++) {
		tjob *t[DEPTH];

		for (int i = 0; i < DEPTH; i++) {
			t[i] = tjob_new(J_RUNS + i % J_TOO_BIG, seed++);
			CHECK(b.ops->submit(b.impl, &t[i]->job) == 0);
		}
		for (int i = 0; i < DEPTH; i++) {
			bad += tjob_wait(t[i]) != 0 || !tjob_right(t[i]);
			tjob_free(t[i]);
		}
	}
	fake_cuda_get_counters(&after);
	CHECK(bad == 0);
	CHECK(after.launches > before.launches);
	b.ops->destroy(b.impl);
	CHECK(live() == 0);

	/* gpus=1: a failed device 0 is never touched */
	fake_cuda_reset(2);
	o.ngpus = 1;
	o.gpus[0] = 1;
	CHECK(create_cuda(&b, &o) == 0 && nlines == 0);
	if (nlines)
		return;
	fake_cuda_kill_device(0);
	bad = 0;
	for (int i = 0; i < 10; i++) {
		tjob *t = tjob_new(i % J_TOO_BIG, seed++);

		CHECK(b.ops->submit(b.impl, &t->job) == 0);
		bad += tjob_wait(t) != 0 || !tjob_right(t);
		tjob_free(t);
	}
	CHECK(bad == 0 && rs_cuda_last_error(b.impl) == NULL);
	b.ops->destroy(b.impl);
	CHECK(live() == 0);
}

static int log_lines;
static char log_line[512];

static void on_log(const char *line)
{
	log_lines++;
	snprintf(log_line, sizeof(log_line), "%s", line);
}

static void case_dispatch_cuda(void)
{
	enum { N = 16 };
	rs_executor_opts o = { .kind = RS_EXECUTOR_CUDA, .threads = 2,
			       .log = on_log };
	rs_executor_stats stats;
	rs_executor *ex = NULL;
	uint64_t cuda_jobs;
	tjob *t[N];
	int bad = 0;

	fake_cuda_reset(2);
	CHECK(create_exec(&ex, &o) == 0 && nlines == 0);
	if (!ex)
		return;
	CHECK(strcmp(rs_executor_name(ex), "cuda") == 0);
	CHECK(strcmp(rs_executor_backends(), "cpu cuda") == 0);
	CHECK(strcmp(rs_executor_cuda_status(ex), "ready") == 0);

	/* every kind on the device */
	CHECK(run_kinds(ex, 10) == 0);
	rs_executor_get_stats(ex, &stats);
	CHECK(stats.cuda_usable && stats.cuda.jobs == J_TOO_BIG);
	CHECK(stats.cpu.jobs == 0 && stats.cuda_fallbacks == 0);
	CHECK(stats.h2d_bytes > 0 && stats.d2h_bytes > 0);
	for (int k = 0; k < RS_WORK_KINDS; k++)
		CHECK(strcmp(stats.choice[k], "cuda") == 0);

	/* too large for a lane: refused, rerun on the CPU, device kept */
	{
		tjob *j = tjob_new(J_TOO_BIG, 11);

		CHECK(rs_executor_run(ex, &j->job) == 0 && tjob_right(j));
		tjob_free(j);
	}
	rs_executor_get_stats(ex, &stats);
	CHECK(stats.cuda_usable && stats.cuda_fallbacks == 1);
	CHECK(stats.cpu.jobs == 1 && log_lines == 0);
	cuda_jobs = stats.cuda.jobs;

	/* both devices fail under a queue of jobs: all end right, on the CPU */
	fake_cuda_kill_device(0);
	fake_cuda_kill_device(1);
	for (int i = 0; i < N; i++)
		t[i] = tjob_new(J_STRIDED + i % 4, 20 + (uint64_t)i);
	for (int i = 0; i < N; i++)
		CHECK(rs_executor_submit(ex, &t[i]->job) == 0);
	for (int i = 0; i < N; i++) {
		bad += tjob_wait(t[i]) != 0 || !tjob_right(t[i]);
		tjob_free(t[i]);
	}
	CHECK(bad == 0);
	rs_executor_get_stats(ex, &stats);
	printf("  after the failure: %s (%llu fallbacks)\n", stats.cuda_status,
	       (unsigned long long)stats.cuda_fallbacks);
	CHECK(!stats.cuda_usable && stats.cuda_fallbacks >= 2);
	CHECK(strncmp(stats.cuda_status, "failed: cuda device ", 20) == 0);
	CHECK(strstr(stats.cuda_status, "illegal memory access") != NULL);
	CHECK(stats.cuda.jobs == cuda_jobs);    /* failed jobs count on the CPU */
	CHECK(stats.cpu.jobs == 1 + N);
	CHECK(log_lines == 1 && strstr(log_line, "on the CPU") != NULL);
	for (int k = 0; k < RS_WORK_KINDS; k++)
		CHECK(strcmp(stats.choice[k], "cpu") == 0);

	/* and afterwards, straight to the CPU */
	CHECK(run_kinds(ex, 30) == 0);
	rs_executor_get_stats(ex, &stats);
	CHECK(stats.cuda.jobs == cuda_jobs && log_lines == 1);
	rs_executor_destroy(ex);
	CHECK(live() == 0);
}

static void case_dispatch_auto(void)
{
	rs_executor_opts o = { .kind = RS_EXECUTOR_AUTO, .threads = 2 };
	rs_executor_stats stats;
	rs_executor *ex = NULL;
	int bad = 0;

	fake_cuda_reset(2);
	CHECK(create_exec(&ex, &o) == 0 && nlines == 0);
	if (!ex)
		return;
	CHECK(strcmp(rs_executor_cuda_status(ex), "ready") == 0);
	for (uint64_t i = 0; i < 6; i++)
		bad += run_kinds(ex, 40 + i * 10);
	CHECK(bad == 0);
	rs_executor_get_stats(ex, &stats);
	printf("  auto: %llu jobs on the CPU, %llu on the device; runs on %s, "
	       "strided on %s, casts on %s\n",
	       (unsigned long long)stats.cpu.jobs,
	       (unsigned long long)stats.cuda.jobs, stats.choice[RS_WORK_RUNS],
	       stats.choice[RS_WORK_STRIDED], stats.choice[RS_WORK_CAST]);
	CHECK(stats.cuda_usable && stats.cuda_fallbacks == 0);
	CHECK(stats.cuda.jobs >= 8 && stats.cpu.jobs >= 8);
	CHECK(strcmp(stats.choice[RS_WORK_RUNS], "cpu") == 0);
	rs_executor_destroy(ex);
	CHECK(live() == 0);
}

static void case_probe(void)
{
	rs_executor_opts o = { .kind = RS_EXECUTOR_CUDA };
	rs_diag *d = rs_diag_new();

	fake_cuda_reset(2);
	CHECK(rs_executor_probe(&o, d) == 0 && rs_diag_count(d) == 0);
	fake_cuda_reset(0);
	CHECK(rs_executor_probe(&o, d) == -ENODEV && rs_diag_count(d) == 1);
	CHECK(rs_diag_count(d) == 1 &&
	      strstr(rs_diag_line(d, 0), "executor=cuda: cuda: no usable device"));
	rs_diag_free(d);
	d = rs_diag_new();
	fake_cuda_reset(2);
	fake_cuda_no_kernel_image(true);
	CHECK(rs_executor_probe(&o, d) == -ENODEV && rs_diag_count(d) == 1);
	CHECK(rs_diag_count(d) == 1 &&
	      strstr(rs_diag_line(d, 0), "CMAKE_CUDA_ARCHITECTURES"));
	o.kind = RS_EXECUTOR_AUTO;
	CHECK(rs_executor_probe(&o, d) == 0);
	rs_diag_free(d);
	CHECK(live() == 0);
}

static const struct {
	const char *name;
	void (*run)(void);
} cases[] = {
	{ "no-device", case_no_device },
	{ "oom", case_oom },
	{ "no-kernel-image", case_no_kernel_image },
	{ "mid-run", case_mid_run },
	{ "one-of-two", case_one_of_two },
	{ "dispatch-cuda", case_dispatch_cuda },
	{ "dispatch-auto", case_dispatch_auto },
	{ "probe", case_probe },
};
#define NCASES (sizeof(cases) / sizeof(cases[0]))

int main(int argc, char **argv)
{
	bool found = false;

	setvbuf(stdout, NULL, _IOLBF, 0);
	make_source();
	for (size_t i = 0; i < NCASES; i++) {
		if (argc > 1 && strcmp(argv[1], cases[i].name) != 0)
			continue;
		found = true;
		printf("%s\n", cases[i].name);
		cases[i].run();
	}
	drop_source();
	if (!found) {
		fprintf(stderr, "usage: test_cuda_emu [CASE]; cases:");
		for (size_t i = 0; i < NCASES; i++)
			fprintf(stderr, " %s", cases[i].name);
		fprintf(stderr, "\n");
		return 2;
	}
	return CHECK_DONE();
}
