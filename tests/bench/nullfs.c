/* nullfs: the FUSE ceiling of this machine, for scripts/bench.
 *
 *     nullfs [none] MOUNTPOINT -f -o files=N,size=BYTES
 *
 * (A first argument "none" stands for the source a mount command passes.)
 * A read-only lowlevel FUSE server, multi-threaded like reshardfs and with
 * the same connection settings (1 MiB requests, splice writes, async reads,
 * kernel page cache kept), that serves N files of BYTES bytes each straight
 * from one static buffer: no source, no planning, no copy of its own.
 * Reading its files measures what FUSE itself costs on this machine; the
 * benchmark quotes the reshardfs view against it.
 */
#define FUSE_USE_VERSION 314
#include <errno.h>
#include <fuse_lowlevel.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_READ (1u << 20)

static struct {
	unsigned nfiles;
	unsigned long long fsize;
} cfg = { 16, 64ull << 20 };
static char payload[MAX_READ];

static const struct fuse_opt opts[] = {
	{ "files=%u", offsetof(__typeof__(cfg), nfiles), 0 },
	{ "size=%llu", offsetof(__typeof__(cfg), fsize), 0 },
	FUSE_OPT_END
};

/* Inode 1 is the root; files are 2 .. cfg.nfiles+1, named f0, f1, ... */
static int fill(fuse_ino_t ino, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	if (ino == FUSE_ROOT_ID) {
		st->st_mode = S_IFDIR | 0555;
		st->st_nlink = 2;
		return 0;
	}
	if (ino < 2 || ino > (fuse_ino_t)cfg.nfiles + 1)
		return -ENOENT;
	st->st_mode = S_IFREG | 0444;
	st->st_nlink = 1;
	st->st_size = (off_t)cfg.fsize;
	return 0;
}

static void op_init(void *ud, struct fuse_conn_info *conn)
{
	(void)ud;
	conn->want |= conn->capable & (FUSE_CAP_SPLICE_WRITE |
				       FUSE_CAP_SPLICE_MOVE |
				       FUSE_CAP_ASYNC_READ);
	conn->max_readahead = MAX_READ;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e = { 0 };
	unsigned i;

	if (parent != FUSE_ROOT_ID || sscanf(name, "f%u", &i) != 1 ||
	    i >= cfg.nfiles) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	e.ino = i + 2;
	e.attr_timeout = e.entry_timeout = 86400;
	fill(e.ino, &e.attr);
	fuse_reply_entry(req, &e);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	struct stat st;

	(void)fi;
	if (fill(ino, &st) != 0)
		fuse_reply_err(req, ENOENT);
	else
		fuse_reply_attr(req, &st, 86400);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size,
		       off_t off, struct fuse_file_info *fi)
{
	char *buf = malloc(size), name[32];
	size_t used = 0;

	(void)fi;
	if (ino != FUSE_ROOT_ID || !buf) {
		free(buf);
		fuse_reply_err(req, ino != FUSE_ROOT_ID ? ENOTDIR : ENOMEM);
		return;
	}
	for (off_t i = off; i < (off_t)cfg.nfiles + 2; i++) {
		struct stat st = { 0 };
		size_t n;

		st.st_ino = i < 2 ? FUSE_ROOT_ID : (fuse_ino_t)i;
		st.st_mode = i < 2 ? S_IFDIR : S_IFREG;
		snprintf(name, sizeof(name), i == 0 ? "." : i == 1 ? ".." : "f%lld",
			 (long long)(i - 2));
		n = fuse_add_direntry(req, buf + used, size - used, name, &st,
				      i + 1);
		if (n > size - used)
			break;
		used += n;
	}
	fuse_reply_buf(req, buf, used);
	free(buf);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	if ((fi->flags & O_ACCMODE) != O_RDONLY) {
		fuse_reply_err(req, EROFS);
		return;
	}
	fi->keep_cache = 1;
	fuse_reply_open(req, fi);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	if (off < 0 || (unsigned long long)off >= cfg.fsize) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	if (size > cfg.fsize - (unsigned long long)off)
		size = cfg.fsize - (unsigned long long)off;
	if (size > sizeof(payload))
		size = sizeof(payload);
	fuse_reply_buf(req, payload, size);
}

static const struct fuse_lowlevel_ops ops = {
	.init = op_init,
	.lookup = op_lookup,
	.getattr = op_getattr,
	.readdir = op_readdir,
	.open = op_open,
	.read = op_read,
};

int main(int argc, char **argv)
{
	struct fuse_args args;
	struct fuse_cmdline_opts cmd;
	struct fuse_session *se = NULL;
	int ret = 1;

	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], "none") == 0 && strcmp(argv[i - 1], "-o")) {
			memmove(&argv[i], &argv[i + 1],
				(size_t)(argc - i) * sizeof(*argv));
			argc--;
			break;
		}
	args = (struct fuse_args)FUSE_ARGS_INIT(argc, argv);
	if (fuse_parse_cmdline(&args, &cmd) != 0 || !cmd.mountpoint) {
		fprintf(stderr, "usage: nullfs MOUNTPOINT -f -o files=N,size=BYTES\n");
		return 1;
	}
	if (fuse_opt_parse(&args, &cfg, opts, NULL) != 0)
		goto out;
	fuse_opt_add_arg(&args, "-oro,default_permissions,fsname=nullfs");
	for (size_t i = 0; i < sizeof(payload); i++)
		payload[i] = (char)(i * 131u >> 3);
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
	free(cmd.mountpoint);
	fuse_opt_free_args(&args);
	return ret;
}
