/* fuse_abi: the parts of the FUSE kernel protocol that fs/passthrough.c
 * reads and patches on /dev/fuse, as of kernel ABI 7.40 (Linux 6.9,
 * include/uapi/linux/fuse.h), where FUSE passthrough was added.
 *
 * libfuse 3.14 speaks ABI 7.38 (its own fuse_kernel.h, and this
 * machine's /usr/include/linux/fuse.h, stop there): it has no
 * FUSE_PASSTHROUGH flag, no max_stack_depth in the INIT reply, no
 * backing_id in the OPEN reply and no backing ioctls.  Every name here
 * carries RS_ so that it cannot collide with a newer system header; the
 * values and layouts are the kernel's, and the static asserts below hold
 * the layouts to the sizes the kernel reads.
 *
 * Kernel behaviour the daemon relies on (fs/fuse/inode.c
 * process_init_reply, fs/fuse/iomode.c, fs/fuse/passthrough.c and
 * backing.c, read for Linux 6.9 to 6.18):
 *   - passthrough is enabled for the connection only when the INIT reply
 *     sets FUSE_PASSTHROUGH, a max_stack_depth of 1 or 2 and not
 *     FUSE_WRITEBACK_CACHE;
 *   - FUSE_DEV_IOC_BACKING_OPEN needs CAP_SYS_ADMIN (EPERM) and an
 *     enabled connection; it returns a backing id > 0, which the kernel
 *     looks up when it processes the OPEN reply, so the id must stay
 *     registered until that open is released;
 *   - an OPEN reply with FOPEN_PASSTHROUGH may carry only the flags of
 *     RS_FOPEN_PASSTHROUGH_MASK (EINVAL, so EIO to the opener, otherwise;
 *     KEEP_CACHE is refused);
 *   - one inode is either in cached io mode (opens without passthrough
 *     and without DIRECT_IO) or in passthrough mode with one backing
 *     file: an open of the other mode, or with another backing file,
 *     fails with EIO until every open of the first mode is released. */
#ifndef RS_FUSE_ABI_H
#define RS_FUSE_ABI_H

#include <stdint.h>
#include <sys/ioctl.h>

#define RS_FUSE_ABI_MINOR 40

/* Opcodes. */
#define RS_FUSE_OPEN 14
#define RS_FUSE_INIT 26

/* INIT flags (fuse_init_in.flags, fuse_init_out.flags). */
#define RS_FUSE_WRITEBACK_CACHE (1u << 16)
#define RS_FUSE_INIT_EXT (1u << 30)          /* flags2 is valid */
/* FUSE_PASSTHROUGH is bit 37: bit 5 of flags2. */
#define RS_FUSE_PASSTHROUGH_FLAGS2 (1u << (37 - 32))

/* OPEN reply flags (fuse_open_out.open_flags). */
#define RS_FOPEN_DIRECT_IO (1u << 0)
#define RS_FOPEN_KEEP_CACHE (1u << 1)
#define RS_FOPEN_NOFLUSH (1u << 5)
#define RS_FOPEN_PARALLEL_DIRECT_WRITES (1u << 6)
#define RS_FOPEN_PASSTHROUGH (1u << 7)
/* The only flags the kernel accepts with FOPEN_PASSTHROUGH. */
#define RS_FOPEN_PASSTHROUGH_MASK                                             \
	(RS_FOPEN_PASSTHROUGH | RS_FOPEN_DIRECT_IO |                          \
	 RS_FOPEN_PARALLEL_DIRECT_WRITES | RS_FOPEN_NOFLUSH)

/* Stack depth the INIT reply announces: backing files on a plain
 * filesystem (1), not on a stacked one like overlayfs (which needs 2). */
#define RS_FUSE_MAX_STACK_DEPTH 1

struct rs_fuse_in_header {
	uint32_t len;
	uint32_t opcode;
	uint64_t unique;
	uint64_t nodeid;
	uint32_t uid, gid, pid;
	uint16_t total_extlen;
	uint16_t padding;
};

struct rs_fuse_out_header {
	uint32_t len;
	int32_t error;
	uint64_t unique;
};

struct rs_fuse_init_in {
	uint32_t major, minor, max_readahead, flags;
	uint32_t flags2;
	uint32_t unused[11];
};

struct rs_fuse_init_out {
	uint32_t major, minor, max_readahead, flags;
	uint16_t max_background, congestion_threshold;
	uint32_t max_write, time_gran;
	uint16_t max_pages, map_alignment;
	uint32_t flags2;
	uint32_t max_stack_depth;       /* 7.40; "unused" in 7.38 */
	uint32_t unused[6];
};

struct rs_fuse_open_out {
	uint64_t fh;
	uint32_t open_flags;
	int32_t backing_id;             /* 7.40; "padding" in 7.38 */
};

struct rs_fuse_backing_map {
	int32_t fd;
	uint32_t flags;                 /* 0 */
	uint64_t padding;               /* 0 */
};

#define RS_FUSE_DEV_IOC_MAGIC 229
#define RS_FUSE_DEV_IOC_BACKING_OPEN                                          \
	_IOW(RS_FUSE_DEV_IOC_MAGIC, 1, struct rs_fuse_backing_map)
#define RS_FUSE_DEV_IOC_BACKING_CLOSE _IOW(RS_FUSE_DEV_IOC_MAGIC, 2, uint32_t)

_Static_assert(sizeof(struct rs_fuse_in_header) == 40, "fuse_in_header");
_Static_assert(sizeof(struct rs_fuse_out_header) == 16, "fuse_out_header");
_Static_assert(sizeof(struct rs_fuse_init_in) == 64, "fuse_init_in");
_Static_assert(sizeof(struct rs_fuse_init_out) == 64, "fuse_init_out");
_Static_assert(sizeof(struct rs_fuse_open_out) == 16, "fuse_open_out");
_Static_assert(sizeof(struct rs_fuse_backing_map) == 16, "fuse_backing_map");

#endif
