/* Strided gathers through a read-only mapping; see mapped_copy.h. */
#include "gpu/mapped_copy.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Set while this thread copies out of a mapping.  volatile: the handler
 * reads it between the stores around the copy, which the compiler would
 * otherwise merge away (memcpy cannot see it). */
static _Thread_local sigjmp_buf *volatile bus_escape;
static pthread_once_t handler_once = PTHREAD_ONCE_INIT;
static int handler_installed;

static void on_sigbus(int sig, siginfo_t *info, void *ctx)
{
	(void)info;
	(void)ctx;
	if (bus_escape)
		siglongjmp(*bus_escape, 1);
	/* Not ours: die as SIGBUS would have killed us. */
	signal(sig, SIG_DFL);
	raise(sig);
}

static void install_handler(void)
{
	struct sigaction old, sa;

	if (sigaction(SIGBUS, NULL, &old) != 0)
		return;
	if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL)
		return;       /* someone else handles SIGBUS: leave it */
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, NULL) == 0)
		handler_installed = 1;
}

/* The copy itself, apart so that no local of the caller lives across the
 * sigsetjmp (the values of modified locals are unspecified after a jump). */
static int copy_rows(const uint8_t *map, uint8_t *dst, uint64_t dst_stride,
		     uint64_t src_stride, uint64_t len, uint64_t rows)
{
	sigjmp_buf escape;

	if (sigsetjmp(escape, 1)) {
		bus_escape = NULL;
		return -EIO;
	}
	bus_escape = &escape;
	for (uint64_t r = 0; r < rows; r++)
		memcpy(dst + r * dst_stride, map + r * src_stride, len);
	bus_escape = NULL;
	return 0;
}

int rs_mapped_gather(int fd, uint8_t *dst, uint64_t dst_stride,
		     uint64_t src_off, uint64_t src_stride, uint64_t len,
		     uint64_t rows)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t start, span, lead;
	struct stat st;
	void *map;
	int err;

	if (rows == 0 || len == 0)
		return 0;
	pthread_once(&handler_once, install_handler);
	if (!handler_installed)
		return -ENOTSUP;
	/* span = (rows-1)*src_stride + len, overflow-checked */
	if (src_stride && rows - 1 > (UINT64_MAX - len) / src_stride)
		return -EOVERFLOW;
	span = (rows - 1) * src_stride + len;
	start = src_off & ~(page - 1);
	lead = src_off - start;
	if (span > UINT64_MAX - lead || src_off > UINT64_MAX - span ||
	    (uint64_t)(off_t)start != start)
		return -EOVERFLOW;
	map = mmap(NULL, span + lead, PROT_READ, MAP_SHARED, fd, (off_t)start);
	if (map == MAP_FAILED)
		return -errno;
	err = copy_rows((const uint8_t *)map + lead, dst, dst_stride,
			src_stride, len, rows);
	munmap(map, span + lead);
	/* Bytes past the end of the file but inside its last page read as
	 * zeros, not SIGBUS: the file must still hold the whole span. */
	if (!err && (fstat(fd, &st) != 0 ||
		     (uint64_t)st.st_size < src_off + span))
		err = -EIO;
	return err;
}
