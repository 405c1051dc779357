/* FUSE passthrough through libfuse 3.14's custom io; see passthrough.h. */
#include "fs/passthrough.h"

#include <errno.h>
#include <linux/capability.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fs/fs.h"
#include "fs/fuse_abi.h"
#include "fs/log.h"

/* Why an open went to the read path. */
typedef enum {
	FB_OFF,                  /* -o passthrough=off */
	FB_UNAVAILABLE,          /* no kernel support or no CAP_SYS_ADMIN */
	FB_TOO_LARGE,            /* over max_size */
	FB_BUDGET,               /* the budget is full of open files' bytes */
	FB_BUILD,                /* the snapshot build failed */
	FB_BACKING,              /* FUSE_DEV_IOC_BACKING_OPEN failed */
	FB_JOINED,               /* the file is open on the read path */
	FB_READ_BEFORE,          /* an earlier open read it on the read path */
	FB_REASONS
} fallback;

static const char *const fallback_names[FB_REASONS] = {
	"off", "unavailable", "too_large", "budget", "build_failed",
	"backing_failed", "open_on_read_path", "read_before",
};

static const char *const kind_names[RS_OPEN_KINDS] = {
	"read", "snapshot", "source",
};

typedef enum {
	NODE_CLOSED,             /* no open file */
	NODE_DECIDING,           /* the first open is being prepared */
	NODE_READ,               /* open on the read path */
	NODE_BACKED,             /* open in passthrough */
} node_mode;

typedef struct {
	node_mode mode;
	uint32_t opens;
	rs_open_kind kind;       /* NODE_BACKED */
	int32_t backing_id;
	rs_snapshot *snap;       /* RS_OPEN_SNAPSHOT */
	bool read_before;        /* an open of it on the read path ended */
} node_state;

struct rs_passthrough {
	bool enabled;
	const rs_vtree *tree;
	rs_sources *sources;
	rs_snapshots *snapshots;
	int devfd;               /* the session's /dev/fuse descriptor */
	/* INIT: the unique of the kernel's request (0: not seen yet), whether
	 * it offered passthrough, whether the reply was patched. */
	_Atomic uint64_t init_unique;
	_Atomic bool offered, init_done;
	_Atomic bool active;
	char why[160];           /* why not active (set before active is) */
	pthread_mutex_t lock;
	pthread_cond_t decided;
	node_state *nodes;
	uint64_t opens[RS_OPEN_KINDS];      /* opens served each way */
	uint64_t open_now[RS_OPEN_KINDS];   /* of them, not yet released */
	uint64_t fallbacks[FB_REASONS];
};

/* The OPEN reply the replying thread is about to send, and how to patch
 * it (rs_passthrough_reply_begin). */
static _Thread_local struct {
	uint64_t fh;
	int32_t backing_id;
} pending;

int rs_passthrough_new(rs_passthrough **out, bool enabled,
		       const rs_vtree *tree, rs_sources *sources,
		       rs_snapshots *snapshots)
{
	rs_passthrough *p = calloc(1, sizeof(*p));

	if (!p)
		return -ENOMEM;
	p->nodes = calloc(tree->count ? tree->count : 1, sizeof(*p->nodes));
	if (!p->nodes) {
		free(p);
		return -ENOMEM;
	}
	p->enabled = enabled;
	p->tree = tree;
	p->sources = sources;
	p->snapshots = snapshots;
	p->devfd = -1;
	snprintf(p->why, sizeof(p->why), "%s",
		 enabled ? "the kernel's INIT not seen yet" : "-o passthrough=off");
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->decided, NULL);
	*out = p;
	return 0;
}

void rs_passthrough_free(rs_passthrough *p)
{
	if (!p)
		return;
	/* Backing ids die with the session's descriptor; snapshots still
	 * held by files the kernel never released go back to the store. */
	for (uint32_t i = 0; i < p->tree->count; i++)
		if (p->nodes[i].snap)
			rs_snapshots_release(p->snapshots, p->nodes[i].snap);
	pthread_cond_destroy(&p->decided);
	pthread_mutex_destroy(&p->lock);
	free(p->nodes);
	free(p);
}

/* --- /dev/fuse hooks --- */

static bool has_sys_admin(void)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];

	memset(d, 0, sizeof(d));
	if (syscall(SYS_capget, &h, d) != 0)
		return false;
	return d[CAP_SYS_ADMIN / 32].effective & (1u << (CAP_SYS_ADMIN % 32));
}

static void set_inactive(rs_passthrough *p, const char *why)
{
	pthread_mutex_lock(&p->lock);
	snprintf(p->why, sizeof(p->why), "%s", why);
	atomic_store(&p->active, false);
	pthread_mutex_unlock(&p->lock);
}

/* The kernel's INIT request: does it offer FUSE_PASSTHROUGH? */
static void saw_init(rs_passthrough *p, const uint8_t *buf, size_t n)
{
	struct rs_fuse_in_header h;
	struct rs_fuse_init_in in = { 0 };

	memcpy(&h, buf, sizeof(h));
	if (h.opcode != RS_FUSE_INIT)
		return;
	memcpy(&in, buf + sizeof(h), n - sizeof(h) < sizeof(in)
					 ? n - sizeof(h) : sizeof(in));
	atomic_store(&p->offered, (in.flags & RS_FUSE_INIT_EXT) &&
		     (in.flags2 & RS_FUSE_PASSTHROUGH_FLAGS2));
	atomic_store(&p->init_unique, h.unique);
}

static ssize_t hook_read(int fd, void *buf, size_t len, void *userdata)
{
	rs_passthrough *p = ((rs_fs *)userdata)->pt;
	ssize_t n = read(fd, buf, len);

	if (n >= (ssize_t)sizeof(struct rs_fuse_in_header) &&
	    !atomic_load_explicit(&p->init_unique, memory_order_relaxed)) {
		int saved = errno;

		saw_init(p, buf, (size_t)n);
		errno = saved;
	}
	return n;
}

/* A reply of a header and one body of `size` bytes, for request `unique`
 * (0: any), succeeding: its body, else NULL. */
static void *reply_body(struct iovec *iov, int count, uint64_t unique,
			size_t size)
{
	struct rs_fuse_out_header h;

	if (count != 2 || iov[0].iov_len != sizeof(h) || iov[1].iov_len < size)
		return NULL;
	memcpy(&h, iov[0].iov_base, sizeof(h));
	if (h.error != 0 || (unique && h.unique != unique))
		return NULL;
	return iov[1].iov_base;
}

/* libfuse's INIT reply: passthrough on, when offered, and the stack depth
 * it needs.  libfuse 3.14 never asks for the writeback cache here (which
 * would rule passthrough out); a reply that does is left alone. */
static void patch_init(rs_passthrough *p, struct iovec *iov, int count,
		       struct iovec *mine, struct rs_fuse_init_out *out)
{
	uint64_t unique = atomic_load(&p->init_unique);
	void *body = reply_body(iov, count, unique, sizeof(*out));

	if (!body)
		return;
	atomic_store(&p->init_done, true);
	memcpy(out, body, sizeof(*out));
	if (!atomic_load(&p->offered)) {
		set_inactive(p, "the kernel does not offer FUSE_PASSTHROUGH (Linux >= 6.9 with CONFIG_FUSE_PASSTHROUGH)");
		return;
	}
	if (!has_sys_admin()) {
		set_inactive(p, "backing files need CAP_SYS_ADMIN");
		return;
	}
	if (!(out->flags & RS_FUSE_INIT_EXT) ||
	    (out->flags & RS_FUSE_WRITEBACK_CACHE)) {
		set_inactive(p, "libfuse's INIT reply rules passthrough out");
		return;
	}
	out->flags2 |= RS_FUSE_PASSTHROUGH_FLAGS2;
	out->max_stack_depth = RS_FUSE_MAX_STACK_DEPTH;
	mine[0] = iov[0];
	mine[1].iov_base = out;
	mine[1].iov_len = sizeof(*out);
	pthread_mutex_lock(&p->lock);
	p->why[0] = 0;
	atomic_store(&p->active, true);
	pthread_mutex_unlock(&p->lock);
}

static ssize_t hook_writev(int fd, struct iovec *iov, int count,
			   void *userdata)
{
	rs_passthrough *p = ((rs_fs *)userdata)->pt;
	struct iovec mine[2];
	struct rs_fuse_init_out init;
	struct rs_fuse_open_out open;
	struct rs_fuse_open_out *body;

	if (!atomic_load_explicit(&p->init_done, memory_order_relaxed) &&
	    atomic_load(&p->init_unique)) {
		mine[1].iov_base = NULL;
		patch_init(p, iov, count, mine, &init);
		if (mine[1].iov_base)
			return writev(fd, mine, 2);
	}
	if (pending.fh &&
	    (body = reply_body(iov, count, 0, sizeof(open))) &&
	    iov[1].iov_len == sizeof(open)) {
		memcpy(&open, body, sizeof(open));
		if (open.fh == pending.fh) {
			/* Only the flags the kernel takes with it. */
			open.open_flags = (open.open_flags &
					   RS_FOPEN_PASSTHROUGH_MASK &
					   ~RS_FOPEN_DIRECT_IO) |
					  RS_FOPEN_PASSTHROUGH;
			open.backing_id = pending.backing_id;
			mine[0] = iov[0];
			mine[1].iov_base = &open;
			mine[1].iov_len = sizeof(open);
			return writev(fd, mine, 2);
		}
	}
	return writev(fd, iov, count);
}

int rs_passthrough_attach(rs_passthrough *p, struct fuse_session *se)
{
	static const struct fuse_custom_io io = {
		.read = hook_read,
		.writev = hook_writev,
		/* no splice: every request and reply goes through the hooks
		 * (libfuse then offers the kernel no splice either) */
	};

	if (!p->enabled)
		return 0;
	p->devfd = fuse_session_fd(se);
	return fuse_session_custom_io(se, &io, p->devfd);
}

void rs_passthrough_reply_begin(const rs_pt_open *o, uint64_t fh)
{
	pending.fh = o->kind == RS_OPEN_READ ? 0 : fh;
	pending.backing_id = o->backing_id;
}

void rs_passthrough_reply_end(void)
{
	pending.fh = 0;
}

/* --- choosing the way of an open --- */

static int backing_open(rs_passthrough *p, int fd, int32_t *id)
{
	struct rs_fuse_backing_map map = { .fd = fd };
	int r = ioctl(p->devfd, RS_FUSE_DEV_IOC_BACKING_OPEN, &map);

	if (r <= 0) {
		int err = r < 0 ? -errno : -EIO;
		char why[160];

		rs_log(RS_LOG_ERROR, "FUSE_DEV_IOC_BACKING_OPEN: %s; reading through the daemon",
		       strerror(-err));
		if (err == -EPERM) {
			snprintf(why, sizeof(why), "FUSE_DEV_IOC_BACKING_OPEN: %s",
				 strerror(-err));
			set_inactive(p, why);
		}
		return err;
	}
	*id = r;
	return 0;
}

static void backing_close(rs_passthrough *p, int32_t id)
{
	uint32_t v = (uint32_t)id;

	if (ioctl(p->devfd, RS_FUSE_DEV_IOC_BACKING_CLOSE, &v) != 0)
		rs_log(RS_LOG_ERROR, "FUSE_DEV_IOC_BACKING_CLOSE %d: %s", id,
		       strerror(errno));
}

/* The source file whose bytes are all of file n, or UINT32_MAX. */
static uint32_t whole_source(rs_passthrough *p, const rs_vnode *n)
{
	const rs_segment *s = &n->segs[0];

	if (n->nsegs != 1 || s->kind != RS_SEG_SOURCE || s->u.source.offset ||
	    s->length != rs_sources_id(p->sources, s->u.source.index)->size)
		return UINT32_MAX;
	return s->u.source.index;
}

/* The first open of a file: how it is served (lock not held). */
static fallback decide(rs_passthrough *p, uint32_t node, bool read_before,
		       node_state *st)
{
	const rs_vnode *n = &p->tree->nodes[node];
	uint32_t src = whole_source(p, n);
	bool reused;
	int fd, err;

	if (!p->enabled)
		return FB_OFF;
	if (!atomic_load(&p->active))
		return FB_UNAVAILABLE;
	/* A provider's sources (the read-once group) are read through it:
	 * the kernel reading the file itself would bypass it. */
	if (src != UINT32_MAX && !rs_sources_has_provider(p->sources) &&
	    rs_sources_immutable(p->sources, src) == 1 &&
	    rs_sources_fd(p->sources, src, &fd) == 0) {
		if (backing_open(p, fd, &st->backing_id) != 0)
			return FB_BACKING;
		st->kind = RS_OPEN_SOURCE;
		return FB_REASONS;
	}
	/* Its pages are in the kernel's cache, unless memory pressure took
	 * them: cheaper read again than built again (passthrough.h). */
	if (read_before)
		return FB_READ_BEFORE;
	err = rs_snapshots_get(p->snapshots, node, &st->snap, &reused);
	if (err)
		return err == -E2BIG ? FB_TOO_LARGE
		     : err == -ENOSPC ? FB_BUDGET : FB_BUILD;
	if (backing_open(p, rs_snapshot_fd(st->snap), &st->backing_id) != 0) {
		rs_snapshots_release(p->snapshots, st->snap);
		st->snap = NULL;
		return FB_BACKING;
	}
	st->kind = RS_OPEN_SNAPSHOT;
	return FB_REASONS;
}

void rs_passthrough_open(rs_passthrough *p, uint32_t node, rs_pt_open *o)
{
	node_state *st = &p->nodes[node];
	node_state fresh = { 0 };
	fallback why;

	pthread_mutex_lock(&p->lock);
	while (st->mode == NODE_DECIDING)
		pthread_cond_wait(&p->decided, &p->lock);
	if (st->opens) {
		st->opens++;
		if (st->mode == NODE_BACKED) {
			o->kind = st->kind;
			o->backing_id = st->backing_id;
		} else {
			o->kind = RS_OPEN_READ;
			p->fallbacks[FB_JOINED]++;
		}
		p->opens[o->kind]++;
		p->open_now[o->kind]++;
		pthread_mutex_unlock(&p->lock);
		return;
	}
	st->mode = NODE_DECIDING;
	st->opens = 1;
	pthread_mutex_unlock(&p->lock);

	why = decide(p, node, st->read_before, &fresh);

	pthread_mutex_lock(&p->lock);
	if (why == FB_REASONS) {
		st->mode = NODE_BACKED;
		st->kind = fresh.kind;
		st->backing_id = fresh.backing_id;
		st->snap = fresh.snap;
		o->kind = fresh.kind;
		o->backing_id = fresh.backing_id;
	} else {
		st->mode = NODE_READ;
		o->kind = RS_OPEN_READ;
		p->fallbacks[why]++;
	}
	p->opens[o->kind]++;
	p->open_now[o->kind]++;
	pthread_cond_broadcast(&p->decided);
	pthread_mutex_unlock(&p->lock);
}

void rs_passthrough_close(rs_passthrough *p, uint32_t node, rs_pt_open *o)
{
	node_state *st = &p->nodes[node];
	rs_snapshot *snap = NULL;
	int32_t id = 0;

	pthread_mutex_lock(&p->lock);
	p->open_now[o->kind]--;
	if (st->opens && --st->opens == 0) {
		bool read_before = st->read_before || st->mode == NODE_READ;

		if (st->mode == NODE_BACKED) {
			id = st->backing_id;
			snap = st->snap;
		}
		*st = (node_state){ .read_before = read_before };
	}
	pthread_mutex_unlock(&p->lock);
	/* The kernel sends RELEASE after it let go of the backing file (its
	 * io mode ends first: fs/fuse/file.c fuse_file_put), so the id is no
	 * longer looked up. */
	if (id)
		backing_close(p, id);
	if (snap)
		rs_snapshots_release(p->snapshots, snap);
}

void rs_passthrough_forget(rs_passthrough *p, uint32_t node)
{
	if (p->snapshots)
		rs_snapshots_drop(p->snapshots, node);
}

/* `"name": value` pairs of n counters, comma-separated, into buf (sized
 * for the names: at most 20 digits each). */
static void json_counts(char *buf, size_t size, const char *const *names,
			const uint64_t *v, int n)
{
	size_t at = 0;

	buf[0] = 0;
	for (int k = 0; k < n && at < size; k++)
		at += (size_t)snprintf(buf + at, size - at, "%s\"%s\": %llu",
				       k ? ", " : "", names[k],
				       (unsigned long long)v[k]);
}

char *rs_passthrough_stats_json(rs_passthrough *p)
{
	rs_snapshot_stats ss = { 0 };
	char opens[200], now[200], fb[400], why[200], *out = NULL;

	if (p->snapshots)
		rs_snapshots_get_stats(p->snapshots, &ss);
	pthread_mutex_lock(&p->lock);
	json_counts(opens, sizeof(opens), kind_names, p->opens, RS_OPEN_KINDS);
	json_counts(now, sizeof(now), kind_names, p->open_now, RS_OPEN_KINDS);
	json_counts(fb, sizeof(fb), fallback_names, p->fallbacks, FB_REASONS);
	snprintf(why, sizeof(why), "%s", p->why);
	pthread_mutex_unlock(&p->lock);
	for (char *c = why; *c; c++)
		if (*c == '"' || *c == '\\')
			*c = '\'';
	if (asprintf(&out,
		     "{\n"
		     "    \"mode\": \"%s\",\n"
		     "    \"active\": %s,\n"
		     "    \"inactive_because\": \"%s\",\n"
		     "    \"opens\": {%s},\n"
		     "    \"open_now\": {%s},\n"
		     "    \"fallbacks\": {%s},\n"
		     "    \"snapshots\": {\"files\": %llu, \"bytes\": %llu, \"bytes_peak\": %llu, \"builds\": %llu, \"bytes_built\": %llu, \"build_seconds\": %.6f, \"build_errors\": %llu, \"reuses\": %llu, \"evictions\": %llu, \"parts\": %llu, \"parts_on_threads\": %llu, \"build_threads\": %llu, \"huge_pages\": %s, \"small_pages_because\": \"%s\"}\n"
		     "  }",
		     p->enabled ? "auto" : "off",
		     atomic_load(&p->active) ? "true" : "false", why, opens, now,
		     fb, (unsigned long long)ss.files, (unsigned long long)ss.bytes,
		     (unsigned long long)ss.bytes_peak,
		     (unsigned long long)ss.builds,
		     (unsigned long long)ss.bytes_built, ss.build_ns / 1e9,
		     (unsigned long long)ss.build_errors,
		     (unsigned long long)ss.reuses,
		     (unsigned long long)ss.evictions,
		     (unsigned long long)ss.parts,
		     (unsigned long long)ss.parts_on_threads,
		     (unsigned long long)ss.build_threads,
		     ss.huge_pages ? "true" : "false", ss.small_because) < 0)
		return NULL;
	return out;
}
