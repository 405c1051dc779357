#include "fs/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <syslog.h>

static bool log_debug;
static bool log_syslog;

void rs_log_setup(bool debug)
{
	log_debug = debug;
}

void rs_log_to_syslog(void)
{
	openlog("reshardfs", LOG_PID, LOG_DAEMON);
	log_syslog = true;
}

void rs_log(rs_log_level level, const char *fmt, ...)
{
	static const int prio[] = { LOG_ERR, LOG_INFO, LOG_DEBUG };
	va_list ap;

	if (level == RS_LOG_DEBUG && !log_debug)
		return;
	va_start(ap, fmt);
	if (log_syslog) {
		vsyslog(prio[level], fmt, ap);
	} else {
		flockfile(stderr);   /* one line, whatever other threads log */
		fputs("reshardfs: ", stderr);
		vfprintf(stderr, fmt, ap);
		fputc('\n', stderr);
		funlockfile(stderr);
	}
	va_end(ap);
}
