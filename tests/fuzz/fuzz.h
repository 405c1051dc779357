/* fuzz: the entry point every fuzz target defines.
 *
 * Each tests/fuzz/fuzz_<parser>.c defines LLVMFuzzerTestOneInput and is
 * linked either with libFuzzer (-DRS_FUZZ=ON, clang) or with standalone.c,
 * a main() that replays files, so the corpus and every crasher ever found
 * run under plain ctest too.  A target reports a broken invariant with
 * RS_FUZZ_CHECK, which aborts: libFuzzer then saves the input, and a
 * replay fails.
 */
#ifndef RS_FUZZ_H
#define RS_FUZZ_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/diag.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define RS_FUZZ_CHECK(cond)                                                 \
	do {                                                                \
		if (!(cond)) {                                              \
			fprintf(stderr, "%s:%d: invariant broken: %s\n",   \
				__FILE__, __LINE__, #cond);                 \
			abort();                                            \
		}                                                           \
	} while (0)

/* A refusal (-EINVAL) must say why in lines that each start with
 * `prefix` (the file's name); success must say nothing. */
static inline void rs_fuzz_check_diag(const rs_diag *d, int err,
				      const char *prefix)
{
	size_t n = rs_diag_count(d);

	if (err == 0) {
		RS_FUZZ_CHECK(n == 0);
		return;
	}
	if (err != -EINVAL)
		return;
	RS_FUZZ_CHECK(n >= 1);
	for (size_t i = 0; i < n; i++) {
		const char *line = rs_diag_line(d, i);

		RS_FUZZ_CHECK(!line || strncmp(line, prefix, strlen(prefix)) == 0);
	}
}

#endif
