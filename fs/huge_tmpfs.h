/* huge_tmpfs: unnamed files on a private tmpfs that uses huge pages.
 *
 * Why: a snapshot (fs/snapshot.h) is built by writing every byte of a
 * view file into shared memory, and a memfd gets its pages 4 KiB at a
 * time, each zeroed first, unless the machine-wide shmem THP setting
 * (/sys/kernel/mm/transparent_hugepage/shmem_enabled, "never" by
 * default) says otherwise.  A tmpfs mounted with huge=within_size takes
 * 2 MiB pages for every part of a file inside its size whatever that
 * setting says (unless it is "deny"): writing 1 GiB measured 12.4 GB/s
 * into such a file against 2.7 GB/s into a memfd, one thread, on the
 * 2-core VM (BENCHMARKS.md, "Snapshot pages").
 *
 * The tmpfs is made with fsopen/fsmount and never attached to a path:
 * nothing outside the daemon can name it, and it is gone when the last
 * descriptor of it or its files closes.  Making it needs CAP_SYS_ADMIN,
 * which passthrough (the only user of snapshots) needs anyway.  Without
 * size or inode limits: the cache budget bounds what snapshots hold.
 *
 * The exception is a virtual machine whose host takes back the memory the
 * guest frees (virtio-balloon free page reporting): 2 MiB pages come from
 * the large free blocks the guest reported, and their first use waits for
 * the host to supply them again, measured 5 times slower than filling 4 KiB pages on
 * the 2-core VM.  rs_free_page_reporting tells; -o snapshot_pages=auto
 * keeps memfds there.
 *
 * Its files cannot be sealed as a memfd can (tmpfs files are created
 * with F_SEAL_SEAL); a finished one is instead reopened read-only and
 * its writable descriptor closed, so no descriptor the daemon holds can
 * change it.
 *
 * Errors: 0 or a negative errno.  Ownership: the caller owns every
 * descriptor returned. */
#ifndef RS_HUGE_TMPFS_H
#define RS_HUGE_TMPFS_H

/* A new private tmpfs with huge=within_size: *mnt, a mount descriptor. */
int rs_huge_tmpfs_new(int *mnt);
/* A new unnamed, empty, writable file on it: *fd. */
int rs_huge_tmpfs_file(int mnt, int *fd);
/* *ro: the same file opened read-only; fd is closed on success. */
int rs_huge_tmpfs_read_only(int fd, int *ro);

/* Whether a virtio-balloon device under `driver_dir` (normally
 * RS_BALLOON_DRIVER_DIR) has free page reporting on: 1 yes, 0 no (no
 * such device, or no directory).  A device's `features` file is a string
 * of '0' and '1', one per feature bit from bit 0; anything else in it is
 * -EINVAL. */
#define RS_BALLOON_DRIVER_DIR "/sys/bus/virtio/drivers/virtio_balloon"
int rs_free_page_reporting(const char *driver_dir);

#endif
