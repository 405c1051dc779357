/* The executor's dispatcher (gpu/executor.c) with a stand-in device: a
 * backend that copies with a private CPU pool, slowly, and fails or
 * refuses jobs on request.  Checks what AUTO and CUDA modes route where,
 * that a failed or refused job is rerun on the CPU with correct bytes,
 * that a device failure turns the device off, and the stats. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gpu/backend.h"
#include "gpu/executor.h"
#include "tests/unit/check.h"
#include "tests/unit/source_file.h"

#define FILE_BYTES (1u << 20)

static char dir[] = "/tmp/rs_dispatch_XXXXXX";
static uint8_t content[FILE_BYTES];

static int log_lines;

static void count_log(const char *line)
{
	CHECK(strstr(line, "on the CPU") != NULL);
	log_lines++;
}

/* The stand-in device. */
typedef struct {
	void *pool;
	const rs_executor_ops *pool_ops;
	_Atomic int jobs;
	int fail_at;            /* job number that ends with -ENODEV (-1) */
	uint64_t refuse_above;  /* jobs larger than this: -E2BIG at submit */
	long delay_us;
} fake_dev;

static int fake_submit(void *impl, rs_exec_job *job)
{
	fake_dev *f = impl;
	int n;

	if (job->size > f->refuse_above)
		return -E2BIG;
	n = atomic_fetch_add(&f->jobs, 1);
	if (f->delay_us)
		usleep((useconds_t)f->delay_us);
	if (n == f->fail_at) {
		memset(job->dst, 0xEE, job->size);  /* garbage, must be redone */
		job->done(job, -ENODEV);
		return 0;
	}
	return f->pool_ops->submit(f->pool, job);
}

static void fake_destroy(void *impl)
{
	fake_dev *f = impl;

	f->pool_ops->destroy(f->pool);
	free(f);
}

static const rs_executor_ops fake_ops = {
	.name = "fake", .submit = fake_submit, .destroy = fake_destroy,
};

static fake_dev *fake_new(int fail_at, uint64_t refuse_above, long delay_us)
{
	fake_dev *f = calloc(1, sizeof(*f));

	CHECK(f && rs_cpu_executor_create(&f->pool, &f->pool_ops, 1) == 0);
	f->fail_at = fail_at;
	f->refuse_above = refuse_above;
	f->delay_us = delay_us;
	return f;
}

static rs_sources *make_sources(void)
{
	return rs_test_source(dir, "src", content, FILE_BYTES);
}

/* Runs one job of the given kind (strided or runs, 64 KiB) and checks its
 * bytes. */
static void run_one(rs_executor *ex, rs_sources *s, bool strided, int i)
{
	static uint8_t got[64 << 10], want[64 << 10];
	rs_copy_op op = strided
		? (rs_copy_op){ 0, (uint64_t)i * 7, 0, 64, 1024, 128, 64 }
		: (rs_copy_op){ 0, (uint64_t)i * 7, 0, 64 << 10, 1, 64 << 10, 64 << 10 };
	rs_exec_job job = { .ops = &op, .nops = 1, .dst = got,
			    .size = sizeof(got), .sources = s };

	for (uint64_t r = 0; r < op.count; r++)
		memcpy(want + r * op.dst_stride,
		       content + op.src_off + r * op.src_stride, op.len);
	memset(got, 0x55, sizeof(got));
	CHECK(rs_executor_run(ex, &job) == 0);
	CHECK(memcmp(got, want, sizeof(got)) == 0);
}

int main(void)
{
	rs_executor_opts auto_opts = { .kind = RS_EXECUTOR_AUTO, .threads = 2 };
	rs_executor_opts cuda_opts = { .kind = RS_EXECUTOR_CUDA, .threads = 2,
				       .log = count_log };
	rs_executor_stats st;
	rs_executor *ex;
	rs_sources *s;
	fake_dev *f;

	for (size_t i = 0; i < FILE_BYTES; i++)
		content[i] = (uint8_t)(i * 2654435761u >> 11);
	CHECK(mkdtemp(dir) != NULL);
	s = make_sources();

	/* AUTO, a slow device: contiguous runs never reach it; strided jobs
	 * are measured on both, then stay on the CPU but for one in 32. */
	f = fake_new(-1, UINT64_MAX, 20000);
	CHECK(rs_executor_create_with_device(&ex, &auto_opts, &fake_ops, f) == 0);
	for (int i = 0; i < 20; i++)
		run_one(ex, s, false, i);
	CHECK(atomic_load(&f->jobs) == 0);
	for (int i = 0; i < 100; i++)
		run_one(ex, s, true, i);
	rs_executor_get_stats(ex, &st);
	CHECK(strcmp(st.mode, "auto") == 0 && st.cuda_usable);
	CHECK(strcmp(st.choice[RS_WORK_STRIDED], "cpu") == 0);
	CHECK(strcmp(st.choice[RS_WORK_RUNS], "cpu") == 0);
	CHECK(atomic_load(&f->jobs) >= 4 && atomic_load(&f->jobs) <= 4 + 100 / 32 + 1);
	CHECK(st.cuda.jobs == (uint64_t)atomic_load(&f->jobs));
	CHECK(st.cpu.jobs + st.cuda.jobs == 120);
	CHECK(st.cpu.bytes + st.cuda.bytes == 120u * (64 << 10));
	rs_executor_destroy(ex);

	/* CUDA mode: every job on the device; the third fails, is redone on
	 * the CPU with the right bytes, and the device is off afterwards. */
	f = fake_new(2, UINT64_MAX, 0);
	CHECK(rs_executor_create_with_device(&ex, &cuda_opts, &fake_ops, f) == 0);
	for (int i = 0; i < 10; i++)
		run_one(ex, s, i % 2, i);
	rs_executor_get_stats(ex, &st);
	CHECK(atomic_load(&f->jobs) == 3);
	CHECK(!st.cuda_usable && st.cuda_fallbacks == 1);
	CHECK(strncmp(st.cuda_status, "failed", 6) == 0);
	CHECK(st.cuda.jobs == 2 && st.cpu.jobs == 8);
	CHECK(log_lines == 1);
	rs_executor_destroy(ex);

	/* A job larger than the device takes: refused at submit, run on the
	 * CPU; the device stays on. */
	f = fake_new(-1, 1024, 0);
	CHECK(rs_executor_create_with_device(&ex, &cuda_opts, &fake_ops, f) == 0);
	run_one(ex, s, true, 1);
	rs_executor_get_stats(ex, &st);
	CHECK(st.cuda_usable && st.cuda_fallbacks == 1 && st.cpu.jobs == 1);
	CHECK(log_lines == 1);   /* a refusal is not a failure */
	rs_executor_destroy(ex);

	/* No device at all: AUTO uses the CPU and says why; CUDA refuses. */
	{
		rs_diag *d = rs_diag_new();

		CHECK(rs_executor_create(&ex, &auto_opts, d) == 0);
		run_one(ex, s, true, 3);
		rs_executor_get_stats(ex, &st);
		if (!st.cuda_usable) {
			CHECK(strcmp(st.cuda_status, "ready") != 0);
			CHECK(st.cuda.jobs == 0);
		}
		rs_executor_destroy(ex);
		if (!st.cuda_usable) {
			CHECK(rs_executor_create(&ex, &cuda_opts, d) == -ENODEV);
			CHECK(rs_diag_count(d) == 1 &&
			      strstr(rs_diag_line(d, 0), "executor=cuda"));
			CHECK(rs_executor_probe(&cuda_opts, d) == -ENODEV);
			CHECK(rs_diag_count(d) == 2 &&
			      strstr(rs_diag_line(d, 1), "executor=cuda"));
		}
		CHECK(rs_executor_probe(&auto_opts, d) == 0);
		rs_diag_free(d);
	}

	rs_sources_free(s);
	{
		char path[80];

		snprintf(path, sizeof(path), "%s/src", dir);
		unlink(path);
		rmdir(dir);
	}
	return CHECK_DONE();
}
