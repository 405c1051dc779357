/* source: the table of files under SOURCE that a view reads from.
 *
 * Each file is recorded at mount time with its identity (device, inode,
 * size, mtime, ctime: see rs_file_id).  It is opened lazily, beneath the
 * SOURCE directory only (openat2 RESOLVE_BENEATH: no `..`, no symlink
 * leaving SOURCE), and kept open.  Before any byte built from a file is
 * served, rs_sources_check compares the file at its path (a replacement
 * by rename) and rs_sources_verify the open file (a truncation or a write
 * in place) with the recorded identity: a changed file gives -ESTALE,
 * never stale bytes.
 *
 * Thread safety: rs_sources_add is for mount time, before any reader runs;
 * every other function may be called from any thread.
 * Ownership: the table owns its paths and descriptors.
 */
#ifndef RS_SOURCE_H
#define RS_SOURCE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

typedef struct rs_sources rs_sources;

/* What makes a source the one recorded.  The ctime is what catches a
 * file rewritten in place with its mtime set back (cp -p, touch -r, tar
 * do that): an mtime can be set by the file's owner, a ctime cannot, and
 * every change to a file's bytes moves it (a truncation moves the size
 * first, a write the mtime and ctime before any byte is copied).  A
 * metadata-only change (chmod, chown, a new hard link, an xattr) moves it
 * too and reads as a change: the view refuses reads from that file until
 * remounted, rather than serve bytes it can no longer vouch for.
 * (Timestamps are exact where the filesystem gives a fresh fine-grained
 * one to every change after a stat, as ext4, xfs, btrfs and tmpfs do
 * since Linux 6.13; with coarse ones a change made and undone within one
 * clock tick goes unseen.) */
typedef struct {
	uint64_t dev, ino, size;
	int64_t mtime_sec, mtime_nsec;
	int64_t ctime_sec, ctime_nsec;
} rs_file_id;

/* Opens the SOURCE directory.  -errno when it cannot be opened. */
int rs_sources_open(rs_sources **out, const char *root);
void rs_sources_free(rs_sources *s);

/* Descriptor of the SOURCE directory (owned by the table). */
int rs_sources_root_fd(const rs_sources *s);

/* Records the file at `relpath` (components separated by '/', validated by
 * the caller) with the identity `id`.  *index receives its number. */
int rs_sources_add(rs_sources *s, const char *relpath, const rs_file_id *id,
		   uint32_t *index);

uint32_t rs_sources_count(const rs_sources *s);
const char *rs_sources_path(const rs_sources *s, uint32_t index);
const rs_file_id *rs_sources_id(const rs_sources *s, uint32_t index);

/* 0 when the file at its path still has the recorded identity; -ESTALE when
 * it changed or vanished (a log-worthy event). */
int rs_sources_check(rs_sources *s, uint32_t index);

/* An open descriptor for the file (owned by the table; do not close).
 * Opens it on first use and verifies the opened file is the recorded one:
 * -ESTALE when not. */
int rs_sources_fd(rs_sources *s, uint32_t index, int *fd);

/* The same check through the file's descriptor (rs_sources_fd), a fstat
 * of a file already open: what every gather from a source runs before and
 * after reading it, so bytes read between two passing checks are bytes of
 * the file as recorded.  0, or -ESTALE when its identity changed. */
int rs_sources_verify(rs_sources *s, uint32_t index);

/* Whether the file is immutable (FS_IMMUTABLE_FL, chattr +i) as well as
 * still the recorded one: 1, 0, or -errno (-ESTALE when its identity
 * changed).  The flag is read before the identity is checked, so a 1
 * means the file was immutable and unchanged since it was recorded (a
 * chattr moves the ctime): nobody without CAP_LINUX_IMMUTABLE can write,
 * truncate, rename over or remove it while the flag stays. */
int rs_sources_immutable(rs_sources *s, uint32_t index);

/* Where the bytes of source files come from when not from their own
 * descriptors: the read-once group of fs/group.h keeps the extents its
 * members share in files of its own.  With a provider set, readers
 * acquire the byte ranges they will read (the provider makes them
 * readable, fetching them if it must, and keeps them until released), and
 * rs_sources_fd hands out the provider's descriptor for the file, whose
 * bytes are at the same offsets as the source's.  The identity checks
 * (rs_sources_check, rs_sources_verify, rs_sources_immutable) keep using
 * the source file itself.
 *   acquire  0, or -EIO / -ESTALE (no bytes of the range may be used);
 *   release  undoes one successful acquire of the same range;
 *   data_fd  a descriptor owned by the provider, or -errno. */
typedef struct {
	int (*acquire)(void *arg, uint32_t index, uint64_t off, uint64_t len);
	void (*release)(void *arg, uint32_t index, uint64_t off, uint64_t len);
	int (*data_fd)(void *arg, uint32_t index);
} rs_source_provider;

/* Sets the provider (NULL: none), before any reader runs. */
void rs_sources_set_provider(rs_sources *s, const rs_source_provider *p,
			     void *arg);
bool rs_sources_has_provider(const rs_sources *s);

/* The provider's acquire and release; without one, 0 and nothing. */
int rs_sources_acquire(rs_sources *s, uint32_t index, uint64_t off,
		       uint64_t len);
void rs_sources_release(rs_sources *s, uint32_t index, uint64_t off,
			uint64_t len);

/* The source file's own descriptor, opened and checked as rs_sources_fd
 * does, whatever the provider: what the provider itself reads. */
int rs_sources_own_fd(rs_sources *s, uint32_t index, int *fd);

/* Reads exactly `len` bytes at `off` of fd: -EIO when the file ends first
 * or a read fails, never a short read (EINTR is retried). */
int rs_pread_full(int fd, void *dst, uint64_t len, uint64_t off);

/* rs_pread_full of a source file (through rs_sources_fd, the range
 * acquired from the provider for the read). */
int rs_sources_pread(rs_sources *s, uint32_t index, void *dst, uint64_t len,
		     uint64_t off);

/* Source bytes read so far, by every reader (executors and the read path). */
void rs_sources_count_read(rs_sources *s, uint64_t bytes);
uint64_t rs_sources_bytes_read(const rs_sources *s);

/* Fills an identity from a stat result. */
void rs_file_id_from_stat(rs_file_id *id, const struct stat *st);

/* Opens `relpath` under `dirfd` without leaving it (RESOLVE_BENEATH;
 * falls back to O_NOFOLLOW on kernels without openat2).  Returns a
 * descriptor or -errno. */
int rs_open_beneath(int dirfd, const char *relpath, int flags);

/* A name from a checkpoint that may become one path component: non-empty,
 * at most 255 bytes, no '/', no NUL, not "." or "..". */
bool rs_name_is_safe(const char *name);

#endif
