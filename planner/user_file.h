/* user_file: small files a user names in an option (-o rules=FILE,
 * -o params=FILE), read whole.
 *
 * Only a regular file is read: opening a FIFO or a device could block the
 * mount forever (it is opened non-blocking, checked with fstat, and
 * refused).  Errors are one line in `d` naming the file, the option
 * (`what`, e.g. "rules file") and the problem; the function then returns
 * NULL.  The caller frees the NUL-terminated text.
 */
#ifndef RS_USER_FILE_H
#define RS_USER_FILE_H

#include <stddef.h>

#include "planner/diag.h"

char *rs_user_file_read(const char *path, size_t max, const char *what,
			size_t *len, rs_diag *d);

#endif
