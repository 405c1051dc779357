/* Unnamed files on a private huge-page tmpfs; see huge_tmpfs.h. */
#include "fs/huge_tmpfs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

/* VIRTIO_BALLOON_F_REPORTING, the virtio spec's free page reporting. */
#define BALLOON_F_REPORTING 5

int rs_huge_tmpfs_new(int *mnt)
{
	int fs, m, err = 0;

	fs = fsopen("tmpfs", FSOPEN_CLOEXEC);
	if (fs < 0)
		return -errno;
	/* size=0 and nr_inodes=0: no limits of the tmpfs's own (its
	 * default is half the memory); the cache budget is the limit. */
	if (fsconfig(fs, FSCONFIG_SET_STRING, "huge", "within_size", 0) ||
	    fsconfig(fs, FSCONFIG_SET_STRING, "size", "0", 0) ||
	    fsconfig(fs, FSCONFIG_SET_STRING, "nr_inodes", "0", 0) ||
	    fsconfig(fs, FSCONFIG_SET_STRING, "mode", "0700", 0) ||
	    fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0)) {
		err = -errno;
		goto out;
	}
	m = fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC |
		    MOUNT_ATTR_NOSUID);
	if (m < 0) {
		err = -errno;
		goto out;
	}
	*mnt = m;
out:
	close(fs);
	return err;
}

int rs_huge_tmpfs_file(int mnt, int *fd)
{
	int f = openat(mnt, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0400);

	if (f < 0)
		return -errno;
	*fd = f;
	return 0;
}

int rs_huge_tmpfs_read_only(int fd, int *ro)
{
	char path[40];
	int f;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	f = open(path, O_RDONLY | O_CLOEXEC);
	if (f < 0)
		return -errno;
	close(fd);
	*ro = f;
	return 0;
}

/* Device d's feature bit BALLOON_F_REPORTING: 1, 0, or -EINVAL. */
static int device_reports(int dir, const char *d)
{
	char path[300], bits[512];
	ssize_t n;
	int fd;

	if (snprintf(path, sizeof(path), "%s/features", d) >= (int)sizeof(path))
		return -EINVAL;
	fd = openat(dir, path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;    /* not a device directory */
	n = read(fd, bits, sizeof(bits) - 1);
	close(fd);
	if (n < 0)
		return -errno;
	bits[n] = 0;
	n = (ssize_t)strcspn(bits, "\n");
	if (strspn(bits, "01") != (size_t)n)
		return -EINVAL;
	return n > BALLOON_F_REPORTING && bits[BALLOON_F_REPORTING] == '1';
}

int rs_free_page_reporting(const char *driver_dir)
{
	DIR *dir = opendir(driver_dir);
	struct dirent *e;
	int found = 0, r;

	if (!dir)
		return 0;
	while (!found && (e = readdir(dir))) {
		/* A bound device is a link named after it: virtio0, ... */
		if (strncmp(e->d_name, "virtio", 6) != 0)
			continue;
		r = device_reports(dirfd(dir), e->d_name);
		if (r < 0) {
			closedir(dir);
			return r;
		}
		found = r;
	}
	closedir(dir);
	return found;
}
