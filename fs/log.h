/* log: one-line messages from the daemon.
 *
 * Before the mount is up (and with -f) lines go to stderr; once the daemon
 * runs in the background they go to syslog.  Debug lines appear only with
 * -d.
 */
#ifndef RS_LOG_H
#define RS_LOG_H

#include <stdbool.h>

typedef enum { RS_LOG_ERROR, RS_LOG_INFO, RS_LOG_DEBUG } rs_log_level;

void rs_log_setup(bool debug);
void rs_log_to_syslog(void);
void rs_log(rs_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
