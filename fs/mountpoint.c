#include "fs/mountpoint.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Counting stops here: the warning is the same for more. */
#define MANY_ENTRIES 10000

/* Whether path is already where something is mounted (by
 * /proc/self/mountinfo): reshardfs would hide it, or stack on it. */
static bool is_mounted_at(const char *path, char *what, size_t size)
{
	char real[PATH_MAX], line[8192];
	bool found = false;
	FILE *f;

	if (!realpath(path, real) || !(f = fopen("/proc/self/mountinfo", "re")))
		return false;
	while (fgets(line, sizeof(line), f)) {
		char mnt[PATH_MAX], *p = line, *dash;
		size_t n = 0;
		int field = 0;

		/* Field 5 is the mount point, octal-escaped (\040 ...). */
		for (; *p && field < 4; p++)
			field += *p == ' ';
		for (; *p && *p != ' ' && n + 1 < sizeof(mnt); p++) {
			if (p[0] == '\\' && p[1] >= '0' && p[1] <= '3' && p[2] && p[3]) {
				mnt[n++] = (char)((p[1] - '0') * 64 + (p[2] - '0') * 8 +
						  (p[3] - '0'));
				p += 3;
			} else {
				mnt[n++] = *p;
			}
		}
		mnt[n] = 0;
		if (strcmp(mnt, real) != 0)
			continue;
		found = true;
		dash = strstr(p, " - ");
		snprintf(what, size, "%s", dash ? dash + 3 : "");
		what[strcspn(what, " \n")] = 0;
	}
	fclose(f);
	return found;
}

/* Entries of the directory path holds, "." and ".." aside, up to
 * MANY_ENTRIES; 0 when it cannot be read (fuse_session_mount reports a
 * mount point it cannot use). */
static unsigned entries(const char *path)
{
	DIR *dir = opendir(path);
	struct dirent *e;
	unsigned n = 0;

	if (!dir)
		return 0;
	while (n < MANY_ENTRIES && (e = readdir(dir)))
		n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
	closedir(dir);
	return n;
}

int rs_mountpoint_check(const char *path)
{
	char what[256];
	unsigned n;

	if (is_mounted_at(path, what, sizeof(what))) {
		fprintf(stderr, "reshardfs: %s: already a mount point (%s); unmount it first (fusermount3 -u %s) or choose another directory\n",
			path, what[0] ? what : "mounted", path);
		return -EBUSY;
	}
	n = entries(path);
	if (n == 1)
		fprintf(stderr, "reshardfs: warning: %s is not empty: its 1 entry is hidden under the view until it is unmounted\n",
			path);
	else if (n)
		fprintf(stderr, "reshardfs: warning: %s is not empty: its %u%s entries are hidden under the view until it is unmounted\n",
			path, n, n == MANY_ENTRIES ? " or more" : "");
	return 0;
}
