#include "planner/user_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "planner/source.h"

char *rs_user_file_read(const char *path, size_t max, const char *what,
			size_t *len, rs_diag *d)
{
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
	struct stat st;
	char *buf = NULL;

	if (fd < 0) {
		rs_diag_add(d, "%s: cannot open %s: %s", path, what,
			    strerror(errno));
		return NULL;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		rs_diag_add(d, "%s: the %s must be a regular file", path, what);
		goto out;
	}
	if ((uint64_t)st.st_size > max) {
		rs_diag_add(d, "%s: %s larger than %zu bytes", path, what, max);
		goto out;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		rs_diag_add(d, "%s: out of memory", path);
		goto out;
	}
	if (rs_pread_full(fd, buf, (uint64_t)st.st_size, 0) != 0) {
		rs_diag_add(d, "%s: cannot read %s", path, what);
		free(buf);
		buf = NULL;
		goto out;
	}
	buf[st.st_size] = 0;
	if (len)
		*len = (size_t)st.st_size;
out:
	close(fd);
	return buf;
}
