/* errfs: a read-only passthrough FUSE server that fails chosen reads, so
 * tests can put an I/O error under reshardfs (tests/mount/test_faults.py).
 *
 *     errfs SOURCE MOUNTPOINT [-f] [-o fail=RELPATH[,fail_off=N][,fail_len=N]]
 *           [-o ctl=FILE] [-o kernel_cache]
 *
 * Shows the directory SOURCE, read-only, as it was when mounted (the tree is
 * listed once; attributes are the files' own, read at each GETATTR, with
 * errfs's inode numbers).  A READ of RELPATH that overlaps the byte range
 * [fail_off, fail_off + fail_len) - by default the whole file - is answered
 * EIO; every other read is a pread of the file.  With ctl=FILE the failure
 * is set by that file instead, re-read whenever it changes (replace it by
 * a rename): one line "RELPATH [OFF [LEN]]", or nothing for no failure.
 *
 * Files are opened direct_io: each read reaches errfs with the reader's own
 * offset and size, so a failure hits exactly the reads that touch the
 * range, and mmap of the files is refused (ENODEV: reshardfs then gathers
 * with pread).  With kernel_cache, reads go through the kernel's page cache
 * and readahead instead, mmap works (a failed page fault raises SIGBUS in
 * the mapper), and a failure hits whole requests of up to 128 KiB.
 *
 * Every failed read prints "errfs: EIO RELPATH OFF+LEN" on stderr.
 */
#define FUSE_USE_VERSION 314
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TIMEOUT 1.0

typedef struct {
	char *rel;              /* path under SOURCE; "." for the root */
	const char *name;       /* last component of rel */
	uint32_t parent;        /* node index */
	bool dir;
	uint32_t *children;
	uint32_t nchildren, cap;
} node;

static struct {
	char *source;
	char *fail;
	unsigned long long fail_off, fail_len;
	char *ctl;
	int kernel_cache;
} cfg = { .fail_len = ~0ull };

static const struct fuse_opt opts[] = {
	{ "fail=%s", offsetof(__typeof__(cfg), fail), 0 },
	{ "fail_off=%llu", offsetof(__typeof__(cfg), fail_off), 0 },
	{ "fail_len=%llu", offsetof(__typeof__(cfg), fail_len), 0 },
	{ "ctl=%s", offsetof(__typeof__(cfg), ctl), 0 },
	{ "kernel_cache", offsetof(__typeof__(cfg), kernel_cache), 1 },
	FUSE_OPT_END
};

static node *nodes;
static uint32_t nnodes, cap_nodes;
static int root_fd = -1;

/* The failure in force: from the options, or from the control file. */
static pthread_mutex_t fail_lock = PTHREAD_MUTEX_INITIALIZER;
static char fail_rel[4096];
static uint64_t fail_off, fail_len;
static struct stat ctl_seen;

static int add_node(const char *rel, uint32_t parent, bool dir, uint32_t *out)
{
	node *n;

	if (nnodes == cap_nodes) {
		uint32_t cap = cap_nodes ? 2 * cap_nodes : 64;
		node *g = realloc(nodes, cap * sizeof(*g));

		if (!g)
			return -ENOMEM;
		nodes = g;
		cap_nodes = cap;
	}
	n = &nodes[nnodes];
	memset(n, 0, sizeof(*n));
	n->rel = strdup(rel);
	if (!n->rel)
		return -ENOMEM;
	n->name = strrchr(n->rel, '/') ? strrchr(n->rel, '/') + 1 : n->rel;
	n->parent = parent;
	n->dir = dir;
	*out = nnodes++;
	if (nnodes > 1) {
		node *p = &nodes[parent];

		if (p->nchildren == p->cap) {
			uint32_t cap = p->cap ? 2 * p->cap : 8;
			uint32_t *g = realloc(p->children, cap * sizeof(*g));

			if (!g)
				return -ENOMEM;
			p->children = g;
			p->cap = cap;
		}
		p->children[p->nchildren++] = *out;
	}
	return 0;
}

/* Lists the directory of node `index` and everything below it. */
static int scan(uint32_t index)
{
	int fd = openat(root_fd, nodes[index].rel,
			O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *e;
	int err = 0;

	if (!d) {
		if (fd >= 0)
			close(fd);
		return -errno;
	}
	while (!err && (e = readdir(d))) {
		char rel[4096];
		struct stat st;
		uint32_t child;

		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (index == 0)
			snprintf(rel, sizeof(rel), "%s", e->d_name);
		else
			snprintf(rel, sizeof(rel), "%s/%s", nodes[index].rel,
				 e->d_name);
		if (fstatat(root_fd, rel, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
		    !(S_ISDIR(st.st_mode) || S_ISREG(st.st_mode)))
			continue;
		err = add_node(rel, index, S_ISDIR(st.st_mode), &child);
		if (!err && S_ISDIR(st.st_mode))
			err = scan(child);
	}
	closedir(d);
	return err;
}

static node *node_of(fuse_ino_t ino)
{
	return ino >= 1 && ino <= nnodes ? &nodes[ino - 1] : NULL;
}

static int fill(fuse_ino_t ino, struct stat *st)
{
	node *n = node_of(ino);

	if (!n)
		return -ENOENT;
	if (fstatat(root_fd, n->rel, st, AT_SYMLINK_NOFOLLOW) != 0)
		return -errno;
	st->st_ino = ino;
	st->st_mode &= ~(mode_t)0222;
	return 0;
}

/* Re-reads the control file when it changed (fail_lock held). */
static void reload_ctl(void)
{
	struct stat st;
	char line[4200] = "";
	FILE *f;

	if (!cfg.ctl)
		return;
	if (stat(cfg.ctl, &st) != 0)
		memset(&st, 0, sizeof(st));
	if (st.st_ino == ctl_seen.st_ino && st.st_size == ctl_seen.st_size &&
	    st.st_mtim.tv_sec == ctl_seen.st_mtim.tv_sec &&
	    st.st_mtim.tv_nsec == ctl_seen.st_mtim.tv_nsec)
		return;
	ctl_seen = st;
	fail_rel[0] = 0;
	fail_off = 0;
	fail_len = UINT64_MAX;
	f = fopen(cfg.ctl, "r");
	if (!f)
		return;
	if (fgets(line, sizeof(line), f)) {
		char rel[4096];
		unsigned long long off = 0, len = UINT64_MAX;

		if (sscanf(line, "%4095s %llu %llu", rel, &off, &len) >= 1) {
			snprintf(fail_rel, sizeof(fail_rel), "%s", rel);
			fail_off = off;
			fail_len = len;
		}
	}
	fclose(f);
	fprintf(stderr, "errfs: failing %s\n",
		fail_rel[0] ? fail_rel : "nothing");
}

static bool must_fail(const node *n, uint64_t off, uint64_t size)
{
	bool fail;

	pthread_mutex_lock(&fail_lock);
	reload_ctl();
	fail = fail_rel[0] && strcmp(n->rel, fail_rel) == 0 && size &&
	       off < fail_off + (fail_len < UINT64_MAX - fail_off
					 ? fail_len : UINT64_MAX - fail_off) &&
	       fail_off < off + size;
	pthread_mutex_unlock(&fail_lock);
	return fail;
}

static void reply_entry(fuse_req_t req, fuse_ino_t ino)
{
	struct fuse_entry_param e = { 0 };
	int err = fill(ino, &e.attr);

	if (err) {
		fuse_reply_err(req, -err);
		return;
	}
	e.ino = ino;
	e.generation = 1;
	e.attr_timeout = e.entry_timeout = TIMEOUT;
	fuse_reply_entry(req, &e);
}

static void op_init(void *ud, struct fuse_conn_info *conn)
{
	(void)ud;
	conn->want |= conn->capable & FUSE_CAP_ASYNC_READ;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	node *p = node_of(parent);

	if (!p || !p->dir) {
		fuse_reply_err(req, p ? ENOTDIR : ENOENT);
		return;
	}
	for (uint32_t i = 0; i < p->nchildren; i++)
		if (strcmp(nodes[p->children[i]].name, name) == 0) {
			reply_entry(req, p->children[i] + 1);
			return;
		}
	fuse_reply_err(req, ENOENT);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	struct stat st;
	int err = fill(ino, &st);

	(void)fi;
	if (err)
		fuse_reply_err(req, -err);
	else
		fuse_reply_attr(req, &st, TIMEOUT);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size,
		       off_t off, struct fuse_file_info *fi)
{
	node *n = node_of(ino);
	char *buf;
	size_t used = 0;

	(void)fi;
	if (!n || !n->dir) {
		fuse_reply_err(req, n ? ENOTDIR : ENOENT);
		return;
	}
	buf = malloc(size);
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	for (off_t i = off; i < (off_t)n->nchildren + 2; i++) {
		struct stat st = { 0 };
		const char *name;
		size_t len;

		if (i < 2) {
			name = i == 0 ? "." : "..";
			st.st_ino = i == 0 ? ino : n->parent + 1;
			st.st_mode = S_IFDIR;
		} else {
			uint32_t c = n->children[i - 2];

			name = nodes[c].name;
			st.st_ino = c + 1;
			st.st_mode = nodes[c].dir ? S_IFDIR : S_IFREG;
		}
		len = fuse_add_direntry(req, buf + used, size - used, name, &st,
					i + 1);
		if (len > size - used)
			break;
		used += len;
	}
	fuse_reply_buf(req, buf, used);
	free(buf);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	node *n = node_of(ino);
	int fd;

	if (!n || n->dir) {
		fuse_reply_err(req, n ? EISDIR : ENOENT);
		return;
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY) {
		fuse_reply_err(req, EROFS);
		return;
	}
	fd = openat(root_fd, n->rel, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		fuse_reply_err(req, errno);
		return;
	}
	fi->fh = (uint64_t)fd;
	fi->direct_io = !cfg.kernel_cache;
	fi->keep_cache = cfg.kernel_cache;
	if (fuse_reply_open(req, fi) != 0)
		close(fd);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	node *n = node_of(ino);
	char *buf;
	ssize_t got;

	if (!n || n->dir) {
		fuse_reply_err(req, n ? EISDIR : ENOENT);
		return;
	}
	if (must_fail(n, (uint64_t)off, size)) {
		fprintf(stderr, "errfs: EIO %s %lld+%zu\n", n->rel,
			(long long)off, size);
		fuse_reply_err(req, EIO);
		return;
	}
	buf = malloc(size ? size : 1);
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	got = pread((int)fi->fh, buf, size, off);
	if (got < 0)
		fuse_reply_err(req, errno);
	else
		fuse_reply_buf(req, buf, (size_t)got);
	free(buf);
}

static void op_release(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	(void)ino;
	close((int)fi->fh);
	fuse_reply_err(req, 0);
}

static const struct fuse_lowlevel_ops ops = {
	.init = op_init,
	.lookup = op_lookup,
	.getattr = op_getattr,
	.readdir = op_readdir,
	.open = op_open,
	.read = op_read,
	.release = op_release,
};

/* The first argument that is not an option is SOURCE; the second is left
 * for fuse_parse_cmdline as the mount point. */
static int take_source(void *data, const char *arg, int key,
		       struct fuse_args *args)
{
	(void)data;
	(void)args;
	if (key == FUSE_OPT_KEY_NONOPT && !cfg.source) {
		cfg.source = strdup(arg);
		return 0;
	}
	return 1;
}

int main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_cmdline_opts cmd = { 0 };
	struct fuse_session *se = NULL;
	uint32_t root;
	int ret = 1;

	if (fuse_opt_parse(&args, &cfg, opts, take_source) != 0 ||
	    fuse_parse_cmdline(&args, &cmd) != 0)
		goto out;
	if (!cfg.source || !cmd.mountpoint) {
		fprintf(stderr, "usage: errfs SOURCE MOUNTPOINT [-f] [-o fail=RELPATH,fail_off=N,fail_len=N] [-o ctl=FILE] [-o kernel_cache]\n");
		goto out;
	}
	if (cfg.fail) {
		snprintf(fail_rel, sizeof(fail_rel), "%s", cfg.fail);
		fail_off = cfg.fail_off;
		fail_len = cfg.fail_len;
	}
	root_fd = open(cfg.source, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (root_fd < 0 || add_node(".", 0, true, &root) != 0 || scan(root)) {
		fprintf(stderr, "errfs: cannot list %s\n", cfg.source);
		goto out;
	}
	if (fuse_opt_add_arg(&args, "-oro,default_permissions,fsname=errfs"))
		goto out;
	se = fuse_session_new(&args, &ops, sizeof(ops), NULL);
	if (!se || fuse_set_signal_handlers(se) != 0 ||
	    fuse_session_mount(se, cmd.mountpoint) != 0)
		goto out;
	fuse_daemonize(cmd.foreground);
	{
		struct fuse_loop_config *loop = fuse_loop_cfg_create();

		ret = loop ? fuse_session_loop_mt(se, loop) != 0 : 1;
		fuse_loop_cfg_destroy(loop);
	}
	fuse_session_unmount(se);
out:
	if (se) {
		fuse_remove_signal_handlers(se);
		fuse_session_destroy(se);
	}
	for (uint32_t i = 0; i < nnodes; i++) {
		free(nodes[i].rel);
		free(nodes[i].children);
	}
	free(nodes);
	if (root_fd >= 0)
		close(root_fd);
	free(cmd.mountpoint);
	free(cfg.source);
	free(cfg.fail);
	free(cfg.ctl);
	fuse_opt_free_args(&args);
	return ret;
}
