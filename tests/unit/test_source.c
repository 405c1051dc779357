/* source: reads of exactly the asked bytes, and the identity that tells
 * an unchanged file from a changed one (truncation, a write in place, a
 * write whose mtime was set back, a metadata change), by path and through
 * the open descriptor. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "planner/source.h"
#include "tests/unit/check.h"
#include "tests/unit/source_file.h"

#define FILE_BYTES (256u << 10)

static char dir[] = "/tmp/rs_source_XXXXXX";
static char path[64];
static uint8_t content[FILE_BYTES];

static rs_sources *make_sources(void)
{
	return rs_test_source(dir, "src", content, FILE_BYTES);
}

static struct timespec ctime_of(void)
{
	struct stat st;

	stat(path, &st);
	return st.st_ctim;
}

static int moved(struct timespec a, struct timespec b)
{
	return a.tv_sec != b.tv_sec || a.tv_nsec != b.tv_nsec;
}

static void test_pread(void)
{
	rs_sources *s = make_sources();
	static uint8_t buf[FILE_BYTES];

	CHECK(rs_sources_pread(s, 0, buf, FILE_BYTES, 0) == 0);
	CHECK(memcmp(buf, content, FILE_BYTES) == 0);
	CHECK(rs_sources_pread(s, 0, buf, 100, FILE_BYTES - 50) == -EIO);
	CHECK(rs_sources_pread(s, 0, buf, 1, FILE_BYTES) == -EIO);
	CHECK(truncate(path, FILE_BYTES / 2) == 0);
	CHECK(rs_sources_pread(s, 0, buf, FILE_BYTES, 0) == -EIO);
	rs_sources_free(s);
}

static void test_identity(void)
{
	rs_sources *s = make_sources();
	struct timespec t0, times[2];
	struct stat sb;
	int fd;

	CHECK(rs_sources_verify(s, 0) == 0);
	CHECK(rs_sources_check(s, 0) == 0);

	/* a write in place, put back, and the mtime set back as cp -p and
	 * touch -r do: size and mtime are the recorded ones, the ctime is
	 * not, so the file reads as changed, by path and by descriptor */
	stat(path, &sb);
	times[0] = sb.st_atim;
	times[1] = sb.st_mtim;
	t0 = ctime_of();
	fd = open(path, O_WRONLY);
	CHECK(pwrite(fd, "x", 1, 10) == 1);
	CHECK(rs_sources_verify(s, 0) == -ESTALE);
	CHECK(pwrite(fd, content + 10, 1, 10) == 1);
	close(fd);
	CHECK(utimensat(AT_FDCWD, path, times, 0) == 0);
	stat(path, &sb);
	CHECK(sb.st_mtim.tv_sec == times[1].tv_sec &&
	      sb.st_mtim.tv_nsec == times[1].tv_nsec);
	CHECK(moved(t0, ctime_of()));
	CHECK(rs_sources_verify(s, 0) == -ESTALE);
	CHECK(rs_sources_check(s, 0) == -ESTALE);
	rs_sources_free(s);

	/* metadata only: a chmod moves the ctime, and reads as a change too */
	s = make_sources();
	t0 = ctime_of();
	CHECK(rs_sources_verify(s, 0) == 0);
	CHECK(chmod(path, 0600) == 0);
	if (moved(t0, ctime_of())) {
		CHECK(rs_sources_verify(s, 0) == -ESTALE);
		CHECK(rs_sources_check(s, 0) == -ESTALE);
	}
	rs_sources_free(s);

	/* truncated: stale */
	s = make_sources();
	CHECK(truncate(path, FILE_BYTES - 1) == 0);
	CHECK(rs_sources_verify(s, 0) == -ESTALE);
	CHECK(rs_sources_check(s, 0) == -ESTALE);
	rs_sources_free(s);
}

int main(void)
{
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(path, sizeof(path), "%s/src", dir);
	for (size_t i = 0; i < FILE_BYTES; i++)
		content[i] = (uint8_t)(i * 7 + (i >> 9));
	test_pread();
	test_identity();
	unlink(path);
	rmdir(dir);
	return CHECK_DONE();
}
