/* mapped_copy: strided gathers from a source file through a short-lived
 * read-only mapping instead of one pread per row.
 *
 * A row-parallel reshard takes short rows (1-4 KiB) at a fixed stride out
 * of every source chunk.  With pread that is one system call per row; a
 * mapping of the span the rows lie in turns it into plain memcpy from the
 * page cache (BENCHMARKS.md, "strided gathers", has the measurement that
 * chose this).  The mapping lives only for one call, so the daemon's
 * resident set does not grow with the bytes it has read.
 *
 * Faults: a page past the end of the file (the source shrank under us) or
 * an I/O error while faulting it in raises SIGBUS.  The first call installs
 * a SIGBUS handler that, on a thread inside rs_mapped_gather, abandons the
 * copy and makes the call return -EIO; on any other thread the signal
 * keeps its default action (the process dies, as it would have anyway).
 * An existing SIGBUS handler is not replaced.
 *
 * Thread safety: may be called from any number of threads at once.
 */
#ifndef RS_MAPPED_COPY_H
#define RS_MAPPED_COPY_H

#include <stdint.h>

/* Copies `rows` rows of `len` bytes: row r from file offset
 * src_off + r*src_stride of `fd` to dst + r*dst_stride.
 * Returns 0, -EIO (the file is shorter than the span, or a read error),
 * -ENOTSUP when SIGBUS could not be claimed (use pread instead), or -errno
 * from mmap. */
int rs_mapped_gather(int fd, uint8_t *dst, uint64_t dst_stride,
		     uint64_t src_off, uint64_t src_stride, uint64_t len,
		     uint64_t rows);

#endif
