#include "fs/option_names.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "fs/options.h"

#define OWN(kind, name, field, arg, help) { name, arg, RS_OPT_OWN },
#define FUSE(name, arg) { name, arg, RS_OPT_FUSE },
#define MOUNT(name, arg) { name, arg, RS_OPT_MOUNT },

/* The -o options: reshardfs's, then the ones libfuse 3 takes from it.
 * libfuse refuses any other (fuse_session_new), so reshardfs refuses them
 * first, with the closest name, in a mount and a dry run alike.  Left out
 * of libfuse's: max_read (libfuse then wants init to set the same, which
 * reshardfs does not), blkdev and blksize (for block-device filesystems):
 * each fails the mount.  mount(8) and fstab lines pass the MOUNT ones
 * through mount.fuse3, which adds dev and suid and drops _netdev, nofail,
 * auto, noauto, user, users and nouser itself. */
static const rs_option_name o_names[] = {
	RS_OPTIONS(OWN)
	FUSE("allow_other", NULL) FUSE("allow_root", NULL)
	FUSE("auto_unmount", NULL)
	FUSE("debug", NULL) FUSE("clone_fd", NULL)
	FUSE("max_threads", "N") FUSE("max_idle_threads", "N")
	MOUNT("ro", NULL) MOUNT("rw", NULL) MOUNT("dev", NULL)
	MOUNT("nodev", NULL) MOUNT("suid", NULL) MOUNT("nosuid", NULL)
	MOUNT("exec", NULL) MOUNT("noexec", NULL) MOUNT("async", NULL)
	MOUNT("sync", NULL) MOUNT("dirsync", NULL) MOUNT("atime", NULL)
	MOUNT("noatime", NULL) MOUNT("default_permissions", NULL)
	MOUNT("fsname", "NAME") MOUNT("subtype", "TYPE") MOUNT("user", "NAME")
	MOUNT("context", "CONTEXT") MOUNT("fscontext", "CONTEXT")
	MOUNT("defcontext", "CONTEXT") MOUNT("rootcontext", "CONTEXT")
	{ NULL, NULL, RS_OPT_OWN }
};

/* The command-line flags: reshardfs's (its fuse_opt table in
 * fs/options.c), then libfuse's. */
static const rs_option_name dash_names[] = {
	{ "-h", NULL, RS_OPT_OWN }, { "--help", NULL, RS_OPT_OWN },
	{ "-V", NULL, RS_OPT_OWN }, { "--version", NULL, RS_OPT_OWN },
	{ "--dry-run", NULL, RS_OPT_OWN }, { "-v", NULL, RS_OPT_OWN },
	{ "--verbose", NULL, RS_OPT_OWN },
	FUSE("-d", NULL) FUSE("--debug", NULL) FUSE("-f", NULL)
	FUSE("-s", NULL) MOUNT("-n", NULL) MOUNT("-r", NULL)
	{ NULL, NULL, RS_OPT_OWN }
};

bool rs_option_is_own(const char *name, size_t len)
{
	for (const rs_option_name *k = o_names; k->from == RS_OPT_OWN; k++)
		if (strlen(k->name) == len && strncmp(k->name, name, len) == 0)
			return true;
	return false;
}

bool rs_option_is_libfuse(const char *arg)
{
	for (const rs_option_name *k = arg[0] == '-' ? dash_names : o_names;
	     k->name; k++) {
		size_t n = strlen(k->name);

		if (k->from != RS_OPT_OWN && strncmp(arg, k->name, n) == 0 &&
		    (k->arg ? arg[n] == '=' : arg[n] == 0))
			return true;
	}
	return false;
}

/* Longer than any option name by far: a longer one is close to none. */
#define MAX_NAME 64

/* Optimal string alignment distance between a (n bytes) and b, case
 * aside: insertions, deletions, substitutions and swaps of neighbours. */
static unsigned distance(const char *a, size_t n, const char *b)
{
	unsigned char d[MAX_NAME + 1][MAX_NAME + 1];
	size_t m = strlen(b);

	if (n > MAX_NAME || m > MAX_NAME)
		return MAX_NAME;
	for (size_t i = 0; i <= n; i++)
		d[i][0] = (unsigned char)i;
	for (size_t j = 0; j <= m; j++)
		d[0][j] = (unsigned char)j;
	for (size_t i = 1; i <= n; i++) {
		for (size_t j = 1; j <= m; j++) {
			int ca = tolower((unsigned char)a[i - 1]);
			int cb = tolower((unsigned char)b[j - 1]);
			unsigned v = d[i - 1][j - 1] + (ca != cb);

			if (d[i - 1][j] + 1u < v)
				v = d[i - 1][j] + 1u;
			if (d[i][j - 1] + 1u < v)
				v = d[i][j - 1] + 1u;
			if (i > 1 && j > 1 &&
			    ca == tolower((unsigned char)b[j - 2]) &&
			    cb == tolower((unsigned char)a[i - 2]) &&
			    d[i - 2][j - 2] + 1u < v)
				v = d[i - 2][j - 2] + 1u;
			d[i][j] = (unsigned char)v;
		}
	}
	return d[n][m];
}

const rs_option_name *rs_option_closest(const char *name, size_t len,
					bool dash)
{
	const rs_option_name *best = NULL;
	size_t dashes = 0;
	unsigned best_d = MAX_NAME;

	if (len > MAX_NAME)
		return NULL;
	while (dashes < len && name[dashes] == '-')
		dashes++;
	for (const rs_option_name *k = dash ? dash_names : o_names; k->name;
	     k++) {
		unsigned d = distance(name, len, k->name);

		/* one edit in three characters: "tpp" is tp, "ep" is not */
		if (d < best_d && d * 3 <= len - dashes) {
			best = k;
			best_d = d;
		}
	}
	return best;
}

/* Lines of --help's mount options end before this column. */
#define HELP_WIDTH 76

/* The MOUNT names of one table, comma-separated, wrapped under the
 * first; col is where the line stands. */
static void help_list(const rs_option_name *k, int col)
{
	const char *sep = " ";

	for (; k->name; k++) {
		char one[64];
		int n;

		if (k->from != RS_OPT_MOUNT)
			continue;
		n = snprintf(one, sizeof(one), "%s%s%s", k->name,
			     k->arg ? "=" : "", k->arg ? k->arg : "");
		if (col + (int)strlen(sep) + n + 1 >= HELP_WIDTH) {
			col = printf(",\n%7s", "");
			sep = "";
		}
		col += printf("%s%s", sep, one);
		sep = ", ";
	}
}

void rs_option_names_help(void)
{
	printf("mount options, as mount(8) and fstab lines pass them (reshardfs sets ro,\n"
	       "default_permissions, fsname=SOURCE and subtype=reshardfs after them):\n");
	help_list(o_names, printf("    -o"));
	printf("\n");
	help_list(dash_names, printf("   "));
	printf("   (mount(8)'s: no /etc/mtab entry; read-only)\n");
}
