/* diag: a list of one-line problem reports.
 *
 * Parsers and planners report what is wrong with a checkpoint here, one line
 * per problem ("<file or tensor>: <what>"), and return -EINVAL.  Control
 * bytes and invalid UTF-8 in a line (names quoted from hostile files) are
 * stored as \xNN.  The daemon
 * prints every line when a mount is refused.  Lines are copied; the list owns
 * them.  Adding never fails loudly: on allocation failure the line is counted
 * but dropped, so a refusal is never lost.
 */
#ifndef RS_DIAG_H
#define RS_DIAG_H

#include <stddef.h>

typedef struct rs_diag rs_diag;

rs_diag *rs_diag_new(void);
void rs_diag_free(rs_diag *d);

/* printf-style; a trailing newline is not needed. */
void rs_diag_add(rs_diag *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Problems reported so far (including dropped ones). */
size_t rs_diag_count(const rs_diag *d);
/* Line i (i < number of stored lines), or NULL. */
const char *rs_diag_line(const rs_diag *d, size_t i);

#endif
