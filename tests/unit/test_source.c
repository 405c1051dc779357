/* source: reads of exactly the asked bytes, and the stamps that tell a
 * read taken from an unchanged file from one that raced a change
 * (truncation, a write in place, a change undone with its mtime set back,
 * a metadata change). */
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

static void test_stamps(void)
{
	rs_sources *s = make_sources();
	rs_file_stamp st, st2;
	struct timespec t0, times[2];
	struct stat sb;
	int fd;

	CHECK(rs_sources_stamp(s, 0, &st) == 0);
	CHECK(rs_sources_recheck(s, 0, &st) == 0);

	/* metadata only: the identity holds, the ctime moves: read again */
	t0 = ctime_of();
	CHECK(chmod(path, 0600) == 0);
	CHECK(rs_sources_recheck(s, 0, &st) ==
	      (moved(t0, ctime_of()) ? -EAGAIN : 0));
	CHECK(rs_sources_stamp(s, 0, &st) == 0);
	CHECK(rs_sources_recheck(s, 0, &st) == 0);

	/* a write in place, then the mtime set back: the identity is the
	 * recorded one again, but a read across the change is caught */
	stat(path, &sb);
	times[0] = sb.st_atim;
	times[1] = sb.st_mtim;
	fd = open(path, O_WRONLY);
	CHECK(pwrite(fd, "x", 1, 10) == 1);
	CHECK(rs_sources_recheck(s, 0, &st) == -ESTALE);
	CHECK(rs_sources_stamp(s, 0, &st2) == -ESTALE);
	CHECK(pwrite(fd, content + 10, 1, 10) == 1);
	close(fd);
	CHECK(utimensat(AT_FDCWD, path, times, 0) == 0);
	CHECK(rs_sources_recheck(s, 0, &st) == -EAGAIN);
	CHECK(rs_sources_stamp(s, 0, &st) == 0);
	CHECK(rs_sources_check(s, 0) == 0);

	/* truncated: stale until put back */
	CHECK(truncate(path, FILE_BYTES - 1) == 0);
	CHECK(rs_sources_stamp(s, 0, &st2) == -ESTALE);
	CHECK(rs_sources_recheck(s, 0, &st) == -ESTALE);
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
	test_stamps();
	unlink(path);
	rmdir(dir);
	return CHECK_DONE();
}
