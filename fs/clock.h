/* clock: the monotonic time the daemon measures ages, timeouts and build
 * times with, in nanoseconds (CLOCK_MONOTONIC, which the group's condition
 * variables wait on too).  No errors: the clock always exists on Linux. */
#ifndef RS_CLOCK_H
#define RS_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t rs_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
