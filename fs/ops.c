/* FUSE lowlevel operations over the virtual tree.
 *
 * The tree is immutable while mounted, so lookups and attributes are cached
 * by the kernel for a long time and no op takes a lock.  Every operation
 * that would change anything replies EROFS.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "fs/fs.h"
#include "fs/log.h"

#define RS_XATTR_SOURCES "user.reshardfs.sources"
/* The view never changes while mounted. */
#define RS_TIMEOUT 86400.0

static rs_fs *fs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

/* The tree node of an inode, or NULL for the control inodes. */
static const rs_vnode *node_of(rs_fs *fs, fuse_ino_t ino)
{
	if (ino < 1 || ino > fs->tree.count)
		return NULL;
	return &fs->tree.nodes[ino - 1];
}

static void fill_attr(rs_fs *fs, fuse_ino_t ino, struct stat *st)
{
	const rs_vnode *n = node_of(fs, ino);

	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_uid = getuid();
	st->st_gid = getgid();
	/* The preferred I/O size: Python's buffered files (and so torch.load
	 * through DCP) use it as their buffer, and refill all of it after every
	 * seek, so a large value multiplies small header reads. */
	st->st_blksize = 4096;
	if (n) {
		st->st_mode = n->is_dir ? S_IFDIR | 0555 : S_IFREG | 0444;
		st->st_nlink = n->is_dir ? 2 : 1;
		st->st_size = (off_t)n->size;
		st->st_mtim = st->st_ctim = st->st_atim = n->mtime;
	} else if (ino == fs->ctl_ino) {
		st->st_mode = S_IFDIR | 0555;
		st->st_nlink = 2;
		st->st_mtim = st->st_ctim = st->st_atim = fs->tree.nodes[0].mtime;
	} else {
		/* Size 0: stats are generated per open and read with direct_io. */
		st->st_mode = S_IFREG | 0444;
		st->st_nlink = 1;
		st->st_mtim = st->st_ctim = st->st_atim = fs->tree.nodes[0].mtime;
	}
	st->st_blocks = (st->st_size + 511) / 512;
}

static bool valid_ino(rs_fs *fs, fuse_ino_t ino)
{
	return node_of(fs, ino) || ino == fs->ctl_ino || ino == fs->stats_ino;
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
	/* Replies are written with writev; splice is libfuse's path for a
	 * reply of more buffers than one writev takes (fs/read.c). */
	if (conn->capable & FUSE_CAP_SPLICE_WRITE)
		conn->want |= FUSE_CAP_SPLICE_WRITE;
	if (conn->capable & FUSE_CAP_SPLICE_MOVE)
		conn->want |= FUSE_CAP_SPLICE_MOVE;
	if (conn->capable & FUSE_CAP_ASYNC_READ)
		conn->want |= FUSE_CAP_ASYNC_READ;
	conn->want &= ~(unsigned)FUSE_CAP_ATOMIC_O_TRUNC;
	/* Ask for 1 MiB requests (max_pages = 256). */
	conn->max_readahead = RS_MAX_READ;
	conn->max_write = RS_MAX_READ;
}

static void reply_entry(fuse_req_t req, rs_fs *fs, fuse_ino_t ino)
{
	struct fuse_entry_param e = { 0 };

	e.ino = ino;
	e.generation = 1;
	e.attr_timeout = RS_TIMEOUT;
	e.entry_timeout = RS_TIMEOUT;
	fill_attr(fs, ino, &e.attr);
	fuse_reply_entry(req, &e);
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	rs_fs *fs = fs_of(req);
	const rs_vnode *dir = node_of(fs, parent);
	uint32_t index;

	if (parent == FUSE_ROOT_ID && strcmp(name, ".reshardfs") == 0)
		return reply_entry(req, fs, fs->ctl_ino);
	if (parent == fs->ctl_ino) {
		if (strcmp(name, "stats") == 0)
			return reply_entry(req, fs, fs->stats_ino);
		fuse_reply_err(req, ENOENT);
		return;
	}
	if (!dir || !dir->is_dir) {
		fuse_reply_err(req, dir ? ENOTDIR : ENOENT);
		return;
	}
	if (rs_vtree_lookup(&fs->tree, (uint32_t)(parent - 1), name,
			    &index) != 0) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	reply_entry(req, fs, index + 1);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	rs_fs *fs = fs_of(req);
	struct stat st;

	if (!valid_ino(fs, ino)) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	fill_attr(fs, ino, &st);
	fuse_reply_attr(req, &st, RS_TIMEOUT);
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	rs_fs *fs = fs_of(req);
	const rs_vnode *n = node_of(fs, ino);

	if (ino != fs->ctl_ino && (!n || !n->is_dir)) {
		fuse_reply_err(req, n ? ENOTDIR : ENOENT);
		return;
	}
	fi->cache_readdir = 1;
	fi->keep_cache = 1;
	fuse_reply_open(req, fi);
}

/* Entry `i` of a directory: 0 is ".", 1 is "..", then the children. */
static bool dir_entry(rs_fs *fs, fuse_ino_t ino, off_t i, const char **name,
		      fuse_ino_t *child)
{
	const rs_vnode *n = node_of(fs, ino);

	if (i == 0) {
		*name = ".";
		*child = ino;
		return true;
	}
	if (i == 1) {
		*name = "..";
		*child = n ? n->parent + 1 : FUSE_ROOT_ID;
		return true;
	}
	if (ino == fs->ctl_ino) {
		if (i != 2)
			return false;
		*name = "stats";
		*child = fs->stats_ino;
		return true;
	}
	if ((uint64_t)(i - 2) >= n->nchildren)
		return false;
	*child = n->children[i - 2] + 1;
	*name = fs->tree.nodes[n->children[i - 2]].name;
	return true;
}

/* readdir and readdirplus.  With `plus`, entries carry their attributes,
 * so `ls -l` and `find -size` of a fresh mount need no LOOKUP per file;
 * "." and ".." go without (ino 0), as libfuse asks, so they add no lookup
 * count. */
static void list_dir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		     bool plus)
{
	rs_fs *fs = fs_of(req);
	char *buf = malloc(size);
	size_t used = 0;
	const char *name;
	fuse_ino_t child;

	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	for (off_t i = off; dir_entry(fs, ino, i, &name, &child); i++) {
		struct fuse_entry_param e = { 0 };
		const rs_vnode *c = node_of(fs, child);
		size_t n;

		e.attr.st_ino = child;
		e.attr.st_mode = (child == fs->stats_ino || (c && !c->is_dir))
					 ? S_IFREG : S_IFDIR;
		if (plus && i >= 2) {
			e.ino = child;
			e.generation = 1;
			e.attr_timeout = RS_TIMEOUT;
			e.entry_timeout = RS_TIMEOUT;
			fill_attr(fs, child, &e.attr);
		}
		n = plus ? fuse_add_direntry_plus(req, buf + used, size - used,
						  name, &e, i + 1)
			 : fuse_add_direntry(req, buf + used, size - used, name,
					     &e.attr, i + 1);
		if (n > size - used)
			break;
		used += n;
	}
	fuse_reply_buf(req, buf, used);
	free(buf);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size,
		       off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	list_dir(req, ino, size, off, false);
}

static void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size,
			   off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	list_dir(req, ino, size, off, true);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	rs_fs *fs = fs_of(req);
	const rs_vnode *n = node_of(fs, ino);

	if ((fi->flags & O_ACCMODE) != O_RDONLY ||
	    (fi->flags & (O_TRUNC | O_CREAT | O_APPEND))) {
		fuse_reply_err(req, EROFS);
		return;
	}
	if (ino == fs->stats_ino) {
		size_t len;
		rs_open_file *of = rs_open_file_new(fs, UINT32_MAX);

		if (of)
			of->text = rs_fs_stats_json(fs, &len);
		if (!of || !of->text) {
			if (of)
				rs_open_file_release(fs, of);
			fuse_reply_err(req, ENOMEM);
			return;
		}
		fi->fh = (uint64_t)(uintptr_t)of;
		fi->direct_io = 1;
		fi->nonseekable = 0;
		if (fuse_reply_open(req, fi) != 0)
			rs_open_file_release(fs, of);
		return;
	}
	if (!n || n->is_dir) {
		fuse_reply_err(req, n ? EISDIR : ENOENT);
		return;
	}
	/* A changed source: fail now rather than serve cached pages of it
	 * (or a snapshot of it). */
	if (rs_fs_check_sources(fs, n) != 0) {
		rs_passthrough_forget(fs->pt, (uint32_t)(ino - 1));
		fuse_reply_err(req, EIO);
		return;
	}
	rs_open_file *of = rs_open_file_new(fs, (uint32_t)(ino - 1));

	if (!of) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	fi->fh = (uint64_t)(uintptr_t)of;
	/* Passthrough (fs/passthrough.h), or the read path, whose pages the
	 * kernel keeps across opens (the kernel refuses keep_cache with
	 * passthrough). */
	rs_passthrough_open(fs->pt, of->node, &of->pt);
	fi->keep_cache = of->pt.kind == RS_OPEN_READ;
	rs_passthrough_reply_begin(&of->pt, fi->fh);
	int err = fuse_reply_open(req, fi);

	rs_passthrough_reply_end();
	if (err != 0) {   /* interrupted: no release follows */
		rs_passthrough_close(fs->pt, of->node, &of->pt);
		rs_open_file_release(fs, of);
	}
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	rs_fs *fs = fs_of(req);
	const rs_vnode *n = node_of(fs, ino);

	if (ino == fs->stats_ino) {
		const char *json = ((rs_open_file *)(uintptr_t)fi->fh)->text;
		size_t len = strlen(json);

		char *copy;

		if (off < 0 || (size_t)off >= len) {
			fuse_reply_buf(req, NULL, 0);
			return;
		}
		/* The reply is sent from a copy of this read's own: once the
		 * kernel has the reply, a RELEASE on another thread may free
		 * the text while libfuse (and a thread checker's writev hook)
		 * still looks at the buffer it sent. */
		len = len - (size_t)off < size ? len - (size_t)off : size;
		copy = malloc(len);
		if (!copy) {
			fuse_reply_err(req, ENOMEM);
			return;
		}
		memcpy(copy, json + off, len);
		fuse_reply_buf(req, copy, len);
		free(copy);
		return;
	}
	if (!n || n->is_dir) {
		fuse_reply_err(req, EISDIR);
		return;
	}
	rs_fs_read(fs, req, n, (rs_open_file *)(uintptr_t)fi->fh, size, off);
}

static void op_release(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	rs_fs *fs = fs_of(req);
	rs_open_file *of = (rs_open_file *)(uintptr_t)fi->fh;

	if (ino != fs->stats_ino)
		rs_passthrough_close(fs->pt, of->node, &of->pt);
	rs_open_file_release(fs, of);
	fuse_reply_err(req, 0);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	rs_fs *fs = fs_of(req);
	struct statvfs sv = { 0 };
	uint64_t bytes = 0;

	for (uint32_t i = 0; i < fs->tree.count; i++)
		bytes += fs->tree.nodes[i].size;
	sv.f_bsize = RS_MAX_READ;
	sv.f_frsize = 4096;
	sv.f_blocks = bytes / 4096 + 1;
	sv.f_files = fs->tree.count + 2;
	sv.f_namemax = 255;
	sv.f_flag = ST_RDONLY;
	fuse_reply_statfs(req, &sv);
}

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			size_t size)
{
	rs_fs *fs = fs_of(req);
	const rs_vnode *n = node_of(fs, ino);
	char *value;
	size_t len;
	int err;

	if (!valid_ino(fs, ino)) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	/* Only user.* names exist here.  EOPNOTSUPP (not ENODATA) for
	 * security.* and system.* tells ls -l, which asks for
	 * security.selinux and system.posix_acl_access of every file, that
	 * the filesystem has none: it stops asking for the whole device. */
	if (strncmp(name, "user.", 5) != 0) {
		fuse_reply_err(req, EOPNOTSUPP);
		return;
	}
	if (!n || n->is_dir || strcmp(name, RS_XATTR_SOURCES) != 0) {
		fuse_reply_err(req, ENODATA);
		return;
	}
	err = rs_fs_sources_xattr(fs, n, &value, &len);
	if (err) {
		fuse_reply_err(req, -err);
		return;
	}
	if (size == 0)
		fuse_reply_xattr(req, len);
	else if (size < len)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, value, len);
	free(value);
}

/* user.reshardfs.sources is read by name and never listed: copy tools
 * (cp -a, rsync -X, Python's shutil.copy2) copy every listed xattr, and a
 * value of many KiB fails on ext4 and most other destinations with ENOSPC,
 * which would make copying the view fail. */
static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	if (size == 0)
		fuse_reply_xattr(req, 0);
	else
		fuse_reply_buf(req, NULL, 0);
}

/* --- everything that would write: EROFS --- */

static void erofs(fuse_req_t req)
{
	fuse_reply_err(req, EROFS);
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
		       int to_set, struct fuse_file_info *fi) { erofs(req); }
static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
		     mode_t mode, dev_t rdev) { erofs(req); }
static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
		     mode_t mode) { erofs(req); }
static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{ erofs(req); }
static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{ erofs(req); }
static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent,
		       const char *name) { erofs(req); }
static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
		      fuse_ino_t newparent, const char *newname,
		      unsigned int flags) { erofs(req); }
static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent,
		    const char *newname) { erofs(req); }
static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
		     size_t size, off_t off, struct fuse_file_info *fi)
{ erofs(req); }
static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name,
		      mode_t mode, struct fuse_file_info *fi) { erofs(req); }
static void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			const char *value, size_t size, int flags)
{ erofs(req); }
static void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{ erofs(req); }
static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode,
			 off_t offset, off_t length, struct fuse_file_info *fi)
{ erofs(req); }

const struct fuse_lowlevel_ops rs_fs_ops = {
	.init = op_init,
	.lookup = op_lookup,
	.getattr = op_getattr,
	.opendir = op_opendir,
	.readdir = op_readdir,
	.readdirplus = op_readdirplus,
	.open = op_open,
	.read = op_read,
	.release = op_release,
	.statfs = op_statfs,
	.getxattr = op_getxattr,
	.listxattr = op_listxattr,
	.setattr = op_setattr,
	.mknod = op_mknod,
	.mkdir = op_mkdir,
	.unlink = op_unlink,
	.rmdir = op_rmdir,
	.symlink = op_symlink,
	.rename = op_rename,
	.link = op_link,
	.write = op_write,
	.create = op_create,
	.setxattr = op_setxattr,
	.removexattr = op_removexattr,
	.fallocate = op_fallocate,
};
