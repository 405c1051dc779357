/* check: a minimal assertion harness for the unit tests.
 *
 * CHECK(cond) records a failure with its location and carries on, so one
 * run reports every broken case; CHECK_DONE() prints a summary and gives the
 * exit status ctest reads.
 */
#ifndef RS_TEST_CHECK_H
#define RS_TEST_CHECK_H

#include <stdio.h>

static int check_passed, check_failed;

#define CHECK(cond)                                                        \
	do {                                                               \
		if (cond) {                                                \
			check_passed++;                                    \
		} else {                                                   \
			check_failed++;                                    \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n",      \
				__FILE__, __LINE__, #cond);                \
		}                                                          \
	} while (0)

#define CHECK_DONE()                                                       \
	(printf("%d checks passed, %d failed\n", check_passed,            \
		check_failed),                                            \
	 check_failed ? 1 : 0)

#endif
