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

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define RS_FUZZ_CHECK(cond)                                                 \
	do {                                                                \
		if (!(cond)) {                                              \
			fprintf(stderr, "%s:%d: invariant broken: %s\n",   \
				__FILE__, __LINE__, #cond);                 \
			abort();                                            \
		}                                                           \
	} while (0)

#endif
