/* CPU executor: strided and contiguous copies from real files, zero fill,
 * many concurrent jobs, and errors (short source, changed source). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <fcntl.h>

#include "gpu/executor.h"
#include "gpu/mapped_copy.h"
#include "tests/unit/check.h"
#include "tests/unit/source_file.h"

#define FILE_BYTES (1u << 20)

static char dir[] = "/tmp/rs_exec_XXXXXX";
static uint8_t content[FILE_BYTES];

static rs_sources *make_sources(void)
{
	return rs_test_source(dir, "src", content, FILE_BYTES);
}

/* Reference: what the ops say, byte by byte. */
static void reference(const rs_copy_op *ops, size_t n, uint8_t *dst,
		      uint64_t size)
{
	memset(dst, 0, size);
	for (size_t k = 0; k < n; k++)
		for (uint64_t r = 0; r < ops[k].count; r++)
			memcpy(dst + ops[k].dst_off + r * ops[k].dst_stride,
			       content + ops[k].src_off + r * ops[k].src_stride,
			       ops[k].len);
}

typedef struct {
	rs_executor *ex;
	rs_sources *s;
	int seed;
	int bad;
} worker_arg;

/* Random jobs mixing strided and contiguous ops over a 3 MiB buffer. */
static void *worker(void *p)
{
	worker_arg *w = p;
	uint64_t size = 3u << 20;
	uint8_t *got = malloc(size), *want = malloc(size);
	unsigned seed = (unsigned)w->seed;

	for (int iter = 0; iter < 20; iter++) {
		rs_copy_op ops[3];
		rs_exec_job job = { 0 };

		/* strided rows into [0, 2 MiB), a run into [2, 3 MiB) */
		ops[0] = (rs_copy_op){ 0, (uint64_t)(rand_r(&seed) % 1000), 0, 1000, 1024, 1000, 2048 };
		ops[1] = (rs_copy_op){ 0, (uint64_t)(rand_r(&seed) % 1000), 1000, 24, 1024, 1000, 2048 };
		ops[2] = (rs_copy_op){ 0, (uint64_t)(rand_r(&seed) % 4096), 2u << 20, 500000, 1, 500000, 500000 };
		job.ops = ops;
		job.nops = 3;
		job.dst = got;
		job.size = size;
		job.zero_fill = true;
		job.sources = w->s;
		memset(got, 0xAB, size);
		if (rs_executor_run(w->ex, &job) != 0) {
			w->bad++;
			continue;
		}
		reference(ops, 3, want, size);
		w->bad += memcmp(got, want, size) != 0;
	}
	free(got);
	free(want);
	return NULL;
}

int main(void)
{
	rs_executor *ex;
	rs_sources *s;
	pthread_t th[6];
	worker_arg args[6];
	char path[64];

	for (size_t i = 0; i < FILE_BYTES; i++)
		content[i] = (uint8_t)(i * 2654435761u >> 13);
	CHECK(mkdtemp(dir) != NULL);
	s = make_sources();
	{
		rs_executor_opts eo = { .kind = RS_EXECUTOR_CPU, .threads = 2 };

		CHECK(rs_executor_create(&ex, &eo, NULL) == 0);
	}
	CHECK(strcmp(rs_executor_name(ex), "cpu") == 0);

	for (int i = 0; i < 6; i++) {
		args[i] = (worker_arg){ ex, s, i + 1, 0 };
		pthread_create(&th[i], NULL, worker, &args[i]);
	}
	for (int i = 0; i < 6; i++) {
		pthread_join(th[i], NULL);
		CHECK(args[i].bad == 0);
	}
	CHECK(rs_sources_bytes_read(s) == 6 * 20 * (1024u * 1024 + 500000));

	{ /* reading past the end of the source is an error, never zeros */
		rs_copy_op op = { 0, FILE_BYTES - 10, 0, 20, 1, 20, 20 };
		uint8_t buf[20];
		rs_exec_job job = { .ops = &op, .nops = 1, .dst = buf,
				    .size = 20, .sources = s };

		CHECK(rs_executor_run(ex, &job) == -EIO);
	}
	{ /* a source replaced after it was recorded: -ESTALE */
		rs_sources *s2 = make_sources();
		rs_copy_op op = { 0, 0, 0, 20, 1, 20, 20 };
		uint8_t buf[20];
		rs_exec_job job = { .ops = &op, .nops = 1, .dst = buf,
				    .size = 20, .sources = s2 };

		snprintf(path, sizeof(path), "%s/src", dir);
		unlink(path);
		rs_sources_free(make_sources()); /* same content, new inode */
		CHECK(rs_executor_run(ex, &job) == -ESTALE);
		CHECK(rs_sources_check(s2, 0) == -ESTALE);
		rs_sources_free(s2);
	}
	{ /* mapped gathers: exact rows; a span past the end of the file is
	   * -EIO whether it ends in the last page (zeros, caught by size) or
	   * beyond it (SIGBUS, caught by the handler) - never zeros */
		uint8_t buf[600];
		int fd;

		snprintf(path, sizeof(path), "%s/short", dir);
		fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
		CHECK(fd >= 0 && write(fd, content, 5000) == 5000);
		memset(buf, 0xEE, sizeof(buf));
		if (rs_mapped_gather(fd, buf, 100, 37, 1000, 100, 5) == -ENOTSUP) {
			/* A sanitizer owns SIGBUS: the executor preads instead. */
			printf("mapped gathers skipped: SIGBUS has another handler\n");
			goto mapped_done;
		}
		for (int r = 0; r < 5; r++)
			CHECK(memcmp(buf + r * 100, content + 37 + r * 1000,
				     100) == 0);
		CHECK(rs_mapped_gather(fd, buf, 100, 37, 1000, 100, 6) == -EIO);
		CHECK(rs_mapped_gather(fd, buf, 100, 4000, 4000, 100, 3) == -EIO);
		CHECK(rs_mapped_gather(fd, buf, 100, 0, UINT64_MAX / 2, 100, 3) ==
		      -EOVERFLOW);
mapped_done:
		close(fd);
		unlink(path);
	}
	rs_executor_destroy(ex);
	rs_sources_free(s);
	snprintf(path, sizeof(path), "%s/src", dir);
	unlink(path);
	rmdir(dir);
	return CHECK_DONE();
}
