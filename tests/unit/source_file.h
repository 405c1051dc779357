/* source_file: the unit tests' one-file source table.
 *
 * rs_test_source(dir, name, bytes, len) writes `bytes` to dir/name and
 * returns a new rs_sources table of dir holding that file as index 0,
 * recorded with its current identity (so writing it again, or replacing
 * it, makes the table's copy stale).  Failures are CHECK failures; the
 * caller frees the table. */
#ifndef RS_TEST_SOURCE_FILE_H
#define RS_TEST_SOURCE_FILE_H

#include <stdio.h>
#include <sys/stat.h>

#include "planner/source.h"
#include "tests/unit/check.h"

static inline rs_sources *rs_test_source(const char *dir, const char *name,
					 const void *bytes, size_t len)
{
	rs_sources *s = NULL;
	char path[256];
	struct stat st;
	rs_file_id id;
	uint32_t idx;
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	CHECK(f && fwrite(bytes, 1, len, f) == len);
	if (f)
		fclose(f);
	CHECK(stat(path, &st) == 0);
	rs_file_id_from_stat(&id, &st);
	CHECK(rs_sources_open(&s, dir) == 0);
	CHECK(rs_sources_add(s, name, &id, &idx) == 0 && idx == 0);
	return s;
}

#endif
