/* The read-once group: extents, their owners, requests and replies; see
 * group.h.  The transport is fs/group_mpi.c, maybe wrapped in an NCCL lane
 * (fs/group_lane.c). */
#include "fs/group.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fs/clock.h"
#include "fs/checksum.h"
#include "fs/group_lane.h"
#include "fs/log.h"

/* What is on the wire.  Members are the same build on the same kind of
 * machine (one job), so structs go as they are; every field is still
 * checked on arrival. */
#define MAGIC 0x72736770u   /* "rsgp" */

typedef struct {
	uint32_t magic, file;
	uint64_t extent;
	uint32_t seq, pad;
} request_msg;

typedef struct {
	uint32_t magic, file;
	uint64_t extent;
	uint32_t seq;
	int32_t status;         /* 0, or the owner's -errno: no payload */
	uint64_t len;
	uint64_t size;          /* the owner's recorded stamp of the file */
	int64_t mtime_sec, mtime_nsec, ctime_sec, ctime_nsec;
	uint64_t checksum;      /* of the payload that follows */
} reply_msg;

typedef struct {
	uint32_t magic;
} notice_msg;

enum { ABSENT = 0, LOADING, PRESENT };

typedef struct {
	uint8_t state;
	bool ref;               /* used since the clock hand passed */
	uint32_t pins;
	uint32_t seq;           /* the request waiting for a reply, 0: none */
	reply_msg *reply;       /* arrived for it, not yet taken */
	size_t reply_len;
} extent;

typedef struct {
	int memfd;
	uint8_t *map;           /* the memfd, whole (NULL for an empty file) */
	uint64_t size;
	uint64_t nextents;
	extent *ext;
} group_file;

typedef struct {
	int peer;               /* -1: a read-ahead of our own */
	uint32_t file, seq;
	uint64_t extent;
} job;

#define SERVERS 2
#define HEARTBEAT_NS 500000000ull

struct rs_group {
	rs_group_transport *t;
	rs_sources *sources;
	group_file *files;
	uint32_t nfiles;
	uint64_t timeout_ns;
	uint64_t budget, resident;
	uint32_t next_seq;
	uint64_t nextents;      /* of every file together */
	uint32_t hand_file;     /* the eviction clock */
	uint64_t hand_ext;

	pthread_mutex_t lock;   /* extents, peers, the queue */
	pthread_cond_t changed; /* an extent's state or reply, a peer */
	pthread_cond_t queued;
	job *queue;
	size_t qhead, qlen, qcap;

	uint64_t *heard_ns;     /* per peer: when it last sent anything */
	bool *down, *bye;
	bool stopping;
	pthread_t progress, servers[SERVERS];
	bool started;

	struct {
		_Atomic uint64_t storage_bytes, storage_reads, sent_bytes,
			received_bytes, served, fetched, prefetched, timeouts,
			bad_checksums, stale_replies, peer_down, evicted;
	} st;
#ifdef RS_GROUP_TEST_HOOKS
	unsigned corrupt_every; /* RESHARDFS_TEST_CORRUPT_REPLIES */
	_Atomic unsigned replies;
#endif
};

static void add(_Atomic uint64_t *c, uint64_t v)
{
	atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

static int owner_of(const rs_group *g, uint32_t file, uint64_t k)
{
	return (int)(((uint64_t)file + k) % (uint64_t)g->t->size);
}

static uint64_t extent_len(const group_file *f, uint64_t k)
{
	uint64_t begin = k * RS_GROUP_EXTENT;

	return f->size - begin < RS_GROUP_EXTENT ? f->size - begin
						 : RS_GROUP_EXTENT;
}

/* --- the store --- */

/* Over budget: drop unpinned extents in clock order, giving each that was
 * used since the hand last passed one more round.  Under g->lock. */
static void evict(rs_group *g)
{
	uint64_t visited = 0;

	while (g->resident > g->budget && visited < 2 * g->nextents) {
		group_file *f;
		extent *e;

		if (g->hand_file >= g->nfiles) {
			g->hand_file = 0;
			g->hand_ext = 0;
		}
		f = &g->files[g->hand_file];
		if (g->hand_ext >= f->nextents) {
			g->hand_file++;
			g->hand_ext = 0;
			continue;
		}
		e = &f->ext[g->hand_ext];
		visited++;
		if (e->state == PRESENT && e->pins == 0) {
			if (e->ref) {
				e->ref = false;
			} else {
				uint64_t len = extent_len(f, g->hand_ext);

				fallocate(f->memfd, FALLOC_FL_PUNCH_HOLE |
					  FALLOC_FL_KEEP_SIZE,
					  (off_t)(g->hand_ext * RS_GROUP_EXTENT),
					  (off_t)len);
				e->state = ABSENT;
				g->resident -= len;
				add(&g->st.evicted, 1);
			}
		}
		g->hand_ext++;
	}
}

/* Extent k of file i read from storage into the memfd, between two
 * checks of the file's identity. */
static int load_local(rs_group *g, uint32_t i, uint64_t k)
{
	group_file *f = &g->files[i];
	uint64_t len = extent_len(f, k);
	int fd, err = rs_sources_verify(g->sources, i);

	if (!err)
		err = rs_sources_own_fd(g->sources, i, &fd);
	if (!err)
		err = rs_pread_full(fd, f->map + k * RS_GROUP_EXTENT, len,
				    k * RS_GROUP_EXTENT);
	if (!err)
		err = rs_sources_verify(g->sources, i);
	if (!err) {
		add(&g->st.storage_bytes, len);
		add(&g->st.storage_reads, 1);
	}
	return err;
}

static bool stamp_is(const reply_msg *r, const rs_file_id *id)
{
	return r->size == id->size && r->mtime_sec == id->mtime_sec &&
	       r->mtime_nsec == id->mtime_nsec &&
	       r->ctime_sec == id->ctime_sec &&
	       r->ctime_nsec == id->ctime_nsec;
}

/* Asks the owner for extent k of file i: 0 with its bytes in the memfd,
 * or 1 when the owner must be bypassed (counted). */
static int fetch(rs_group *g, uint32_t i, uint64_t k, int owner)
{
	group_file *f = &g->files[i];
	extent *e = &f->ext[k];
	uint64_t len = extent_len(f, k), deadline;
	request_msg *req = malloc(sizeof(*req));
	reply_msg *r;
	size_t rlen;
	uint32_t seq;

	if (!req)
		return 1;
	pthread_mutex_lock(&g->lock);
	seq = ++g->next_seq ? g->next_seq : ++g->next_seq;
	e->seq = seq;
	pthread_mutex_unlock(&g->lock);
	*req = (request_msg){ MAGIC, i, k, seq, 0 };
	if (g->t->send(g->t, owner, RS_GROUP_TAG_REQUEST, req, sizeof(*req))) {
		pthread_mutex_lock(&g->lock);
		e->seq = 0;
		pthread_mutex_unlock(&g->lock);
		add(&g->st.peer_down, 1);
		return 1;
	}
	deadline = rs_now_ns() + g->timeout_ns;
	pthread_mutex_lock(&g->lock);
	while (!e->reply && !g->down[owner]) {
		struct timespec ts = {
			(time_t)(deadline / 1000000000ull),
			(long)(deadline % 1000000000ull) };

		if (rs_now_ns() >= deadline) {
			/* Bypassed from now on, until it is heard from. */
			g->down[owner] = true;
			add(&g->st.timeouts, 1);
			rs_log(RS_LOG_ERROR, "group: member %d did not answer in %.1f s; reading its extents from storage",
			       owner, g->timeout_ns / 1e9);
			break;
		}
		/* g->changed waits on CLOCK_MONOTONIC, as rs_now_ns reads. */
		pthread_cond_timedwait(&g->changed, &g->lock, &ts);
	}
	if (!e->reply && g->down[owner] && rs_now_ns() < deadline)
		add(&g->st.peer_down, 1);
	r = e->reply;
	rlen = e->reply_len;
	e->reply = NULL;
	e->seq = 0;
	pthread_mutex_unlock(&g->lock);
	if (!r)
		return 1;
	if (r->status != 0 || r->len != len || rlen != sizeof(*r) + len ||
	    !stamp_is(r, rs_sources_id(g->sources, i))) {
		add(&g->st.stale_replies, 1);
		free(r);
		return 1;
	}
	if (rs_checksum64(r + 1, len) != r->checksum) {
		add(&g->st.bad_checksums, 1);
		rs_log(RS_LOG_ERROR, "group: extent %llu of %s from member %d failed its checksum; reading it from storage",
		       (unsigned long long)k, rs_sources_path(g->sources, i),
		       owner);
		free(r);
		return 1;
	}
	memcpy(f->map + k * RS_GROUP_EXTENT, r + 1, len);
	free(r);
	add(&g->st.received_bytes, len);
	add(&g->st.fetched, 1);
	return 0;
}

/* Extent k of file i present and pinned: kept, fetched or read. */
static int ensure(rs_group *g, uint32_t i, uint64_t k)
{
	group_file *f = &g->files[i];
	extent *e = &f->ext[k];
	int owner = owner_of(g, i, k), err;
	bool ask;

	pthread_mutex_lock(&g->lock);
	for (;;) {
		if (e->state == PRESENT) {
			e->pins++;
			e->ref = true;
			pthread_mutex_unlock(&g->lock);
			return 0;
		}
		if (e->state == ABSENT)
			break;
		pthread_cond_wait(&g->changed, &g->lock);
	}
	e->state = LOADING;
	ask = owner != g->t->rank && !g->down[owner];
	if (owner != g->t->rank && !ask)
		add(&g->st.peer_down, 1);
	pthread_mutex_unlock(&g->lock);

	err = ask ? fetch(g, i, k, owner) : 1;
	if (err == 1)
		err = load_local(g, i, k);

	pthread_mutex_lock(&g->lock);
	if (err) {
		e->state = ABSENT;
	} else {
		e->state = PRESENT;
		e->pins = 1;
		e->ref = true;
		g->resident += extent_len(f, k);
		evict(g);
	}
	pthread_cond_broadcast(&g->changed);
	pthread_mutex_unlock(&g->lock);
	return err;
}

static void unpin(rs_group *g, uint32_t i, uint64_t k)
{
	pthread_mutex_lock(&g->lock);
	if (g->files[i].ext[k].pins)
		g->files[i].ext[k].pins--;
	if (g->resident > g->budget)
		evict(g);
	pthread_mutex_unlock(&g->lock);
}

/* --- the provider --- */

static int acquire(void *arg, uint32_t i, uint64_t off, uint64_t len)
{
	rs_group *g = arg;
	group_file *f;
	uint64_t first, last;

	if (i >= g->nfiles)
		return -EIO;
	f = &g->files[i];
	if (off > f->size || len > f->size - off)
		return -EIO;   /* past the recorded end: never zeros */
	first = off / RS_GROUP_EXTENT;
	last = (off + len - 1) / RS_GROUP_EXTENT;
	for (uint64_t k = first; k <= last; k++) {
		int err = ensure(g, i, k);

		if (err) {
			while (k-- > first)
				unpin(g, i, k);
			return err;
		}
	}
	return 0;
}

static void release(void *arg, uint32_t i, uint64_t off, uint64_t len)
{
	rs_group *g = arg;

	for (uint64_t k = off / RS_GROUP_EXTENT;
	     k <= (off + len - 1) / RS_GROUP_EXTENT; k++)
		unpin(g, i, k);
}

static int data_fd(void *arg, uint32_t i)
{
	rs_group *g = arg;

	return i < g->nfiles ? g->files[i].memfd : -EIO;
}

static const rs_source_provider provider = { acquire, release, data_fd };

/* --- serving peers --- */

static void push(rs_group *g, job j)
{
	if (g->qlen == g->qcap) {
		size_t cap = g->qcap ? 2 * g->qcap : 64;
		job *q = malloc(cap * sizeof(*q));

		if (!q)
			return;   /* the peer times out and reads itself */
		for (size_t n = 0; n < g->qlen; n++)
			q[n] = g->queue[(g->qhead + n) % g->qcap];
		free(g->queue);
		g->queue = q;
		g->qcap = cap;
		g->qhead = 0;
	}
	g->queue[(g->qhead + g->qlen++) % g->qcap] = j;
	pthread_cond_signal(&g->queued);
}

static void send_reply(rs_group *g, const job *j)
{
	group_file *f = &g->files[j->file];
	uint64_t len = extent_len(f, j->extent);
	int err = ensure(g, j->file, j->extent);
	const rs_file_id *id = rs_sources_id(g->sources, j->file);
	reply_msg *r = malloc(sizeof(*r) + (err ? 0 : len));

	if (!r) {
		if (!err)
			unpin(g, j->file, j->extent);
		return;
	}
	*r = (reply_msg){ .magic = MAGIC, .file = j->file,
			  .extent = j->extent, .seq = j->seq,
			  .status = err, .len = err ? 0 : len,
			  .size = id->size, .mtime_sec = id->mtime_sec,
			  .mtime_nsec = id->mtime_nsec,
			  .ctime_sec = id->ctime_sec,
			  .ctime_nsec = id->ctime_nsec };
	if (!err) {
		memcpy(r + 1, f->map + j->extent * RS_GROUP_EXTENT, len);
		unpin(g, j->file, j->extent);
		r->checksum = rs_checksum64(r + 1, len);
#ifdef RS_GROUP_TEST_HOOKS
		if (g->corrupt_every &&
		    (atomic_fetch_add(&g->replies, 1) + 1) % g->corrupt_every == 0)
			((uint8_t *)(r + 1))[len / 2] ^= 0x40;
#endif
	}
	/* r is the transport's once sent: its length is read before. */
	len = r->len;
	if (g->t->send(g->t, j->peer, RS_GROUP_TAG_REPLY, r,
		       sizeof(*r) + len) == 0) {
		add(&g->st.served, 1);
		add(&g->st.sent_bytes, len);
	}
}

/* After serving extent k of a file: the next extent of it this member
 * owns, read ahead unless it is here or on its way. */
static void read_ahead(rs_group *g, const job *j)
{
	group_file *f = &g->files[j->file];
	uint64_t next = j->extent + (uint64_t)g->t->size;

	if (next >= f->nextents || f->ext[next].state != ABSENT ||
	    g->qlen > 2 * SERVERS ||
	    g->resident + RS_GROUP_EXTENT > g->budget)
		return;
	push(g, (job){ -1, j->file, 0, next });
}

static void *server(void *arg)
{
	rs_group *g = arg;

	pthread_mutex_lock(&g->lock);
	for (;;) {
		job j;

		while (!g->qlen && !g->stopping)
			pthread_cond_wait(&g->queued, &g->lock);
		if (g->stopping)
			break;
		j = g->queue[g->qhead];
		g->qhead = (g->qhead + 1) % g->qcap;
		g->qlen--;
		pthread_mutex_unlock(&g->lock);
		if (j.peer < 0) {
			if (ensure(g, j.file, j.extent) == 0) {
				unpin(g, j.file, j.extent);
				add(&g->st.prefetched, 1);
			}
		} else {
			send_reply(g, &j);
		}
		pthread_mutex_lock(&g->lock);
		if (j.peer >= 0)
			read_ahead(g, &j);
	}
	pthread_mutex_unlock(&g->lock);
	return NULL;
}

/* --- the progress thread: every message that arrives --- */

static void on_message(rs_group *g, int peer, int tag, void *buf, size_t len)
{
	pthread_mutex_lock(&g->lock);
	g->heard_ns[peer] = rs_now_ns();
	if (g->down[peer] && tag != RS_GROUP_TAG_BYE)
		rs_log(RS_LOG_INFO, "group: member %d answers again", peer);
	g->down[peer] = false;
	if (tag == RS_GROUP_TAG_REQUEST && len == sizeof(request_msg)) {
		const request_msg *q = buf;

		if (q->magic == MAGIC && q->file < g->nfiles &&
		    q->extent < g->files[q->file].nextents &&
		    owner_of(g, q->file, q->extent) == g->t->rank)
			push(g, (job){ peer, q->file, q->seq, q->extent });
	} else if (tag == RS_GROUP_TAG_REPLY && len >= sizeof(reply_msg)) {
		reply_msg *r = buf;

		if (r->magic == MAGIC && r->file < g->nfiles &&
		    r->extent < g->files[r->file].nextents) {
			extent *e = &g->files[r->file].ext[r->extent];

			/* Only the reply awaited; a late one is dropped. */
			if (e->state == LOADING && e->seq == r->seq &&
			    !e->reply) {
				e->reply = r;
				e->reply_len = len;
				buf = NULL;
			}
		}
	} else if (tag == RS_GROUP_TAG_BYE) {
		g->bye[peer] = true;
	}
	pthread_cond_broadcast(&g->changed);
	pthread_mutex_unlock(&g->lock);
	free(buf);
}

/* Peers silent for longer than the timeout are down; every live peer
 * hears from us at least every HEARTBEAT_NS. */
static void heartbeat(rs_group *g, uint64_t now)
{
	int rank = g->t->rank;

	for (int p = 0; p < g->t->size; p++) {
		notice_msg *m;

		bool gone;

		if (p == rank)
			continue;
		pthread_mutex_lock(&g->lock);
		gone = g->bye[p];
		if (!g->down[p] && !g->bye[p] &&
		    now - g->heard_ns[p] > g->timeout_ns) {
			g->down[p] = true;
			rs_log(RS_LOG_ERROR, "group: member %d silent for %.1f s; reading its extents from storage",
			       p, g->timeout_ns / 1e9);
			pthread_cond_broadcast(&g->changed);
		}
		pthread_mutex_unlock(&g->lock);
		m = gone ? NULL : malloc(sizeof(*m));
		if (m) {
			m->magic = MAGIC;
			g->t->send(g->t, p, RS_GROUP_TAG_HEARTBEAT, m,
				   sizeof(*m));
		}
	}
}

static void *progress(void *arg)
{
	rs_group *g = arg;
	uint64_t last_beat = 0;
	unsigned idle = 0;

	for (;;) {
		int peer, tag, got;
		void *buf;
		size_t len;
		uint64_t now;

		pthread_mutex_lock(&g->lock);
		if (g->stopping) {
			pthread_mutex_unlock(&g->lock);
			break;
		}
		pthread_mutex_unlock(&g->lock);
		got = g->t->poll(g->t, &peer, &tag, &buf, &len);
		if (got == 1 && peer >= 0 && peer < g->t->size &&
		    peer != g->t->rank) {
			on_message(g, peer, tag, buf, len);
			idle = 0;
		} else {
			if (got == 1)
				free(buf);
			/* Idle: back off to 200 us between polls. */
			usleep(idle < 100 ? 20 : 200);
			idle++;
		}
		now = rs_now_ns();
		if (now - last_beat >= HEARTBEAT_NS) {
			heartbeat(g, now);
			last_beat = now;
		}
	}
	return NULL;
}

/* --- life --- */

int rs_group_new(rs_group **out, rs_group_transport *t, rs_sources *s,
		 uint64_t budget, unsigned timeout_ms)
{
	rs_group *g = calloc(1, sizeof(*g));
	pthread_condattr_t ca;
	int err = -ENOMEM;

	if (!g)
		return -ENOMEM;
	g->t = t;
	g->sources = s;
	g->timeout_ns = (uint64_t)timeout_ms * 1000000ull;
	/* At least an extent per thread that may pin one at a time. */
	g->budget = budget > 64 * RS_GROUP_EXTENT ? budget
						  : 64 * RS_GROUP_EXTENT;
	pthread_mutex_init(&g->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&g->changed, &ca);
	pthread_condattr_destroy(&ca);
	pthread_cond_init(&g->queued, NULL);
	g->nfiles = rs_sources_count(s);
	g->files = calloc(g->nfiles ? g->nfiles : 1, sizeof(*g->files));
	g->heard_ns = calloc((size_t)t->size, sizeof(*g->heard_ns));
	g->down = calloc((size_t)t->size, sizeof(*g->down));
	g->bye = calloc((size_t)t->size, sizeof(*g->bye));
	if (!g->files || !g->heard_ns || !g->down || !g->bye)
		goto fail;
	for (uint32_t i = 0; i < g->nfiles; i++)
		g->files[i].memfd = -1;
	for (uint32_t i = 0; i < g->nfiles; i++) {
		group_file *f = &g->files[i];

		f->size = rs_sources_id(s, i)->size;
		f->nextents = (f->size + RS_GROUP_EXTENT - 1) / RS_GROUP_EXTENT;
		g->nextents += f->nextents;
		f->memfd = memfd_create("reshardfs-group", MFD_CLOEXEC);
		if (f->memfd < 0 || ftruncate(f->memfd, (off_t)f->size) != 0) {
			err = -errno;
			goto fail;
		}
		if (f->size) {
			f->map = mmap(NULL, f->size, PROT_READ | PROT_WRITE,
				      MAP_SHARED, f->memfd, 0);
			if (f->map == MAP_FAILED) {
				f->map = NULL;
				err = -errno;
				goto fail;
			}
		}
		f->ext = calloc(f->nextents ? f->nextents : 1,
				sizeof(*f->ext));
		if (!f->ext)
			goto fail;
	}
#ifdef RS_GROUP_TEST_HOOKS
	{
		const char *c = getenv("RESHARDFS_TEST_CORRUPT_REPLIES");

		g->corrupt_every = c ? (unsigned)strtoul(c, NULL, 10) : 0;
	}
#endif
	*out = g;
	return 0;
fail:
	g->t = NULL;   /* the caller keeps it on failure */
	rs_group_free(g);
	return err;
}

int rs_group_start(rs_group *g)
{
	uint64_t now = rs_now_ns();

	for (int p = 0; p < g->t->size; p++)
		g->heard_ns[p] = now;
	if (pthread_create(&g->progress, NULL, progress, g) != 0)
		return -EAGAIN;
	for (int i = 0; i < SERVERS; i++)
		if (pthread_create(&g->servers[i], NULL, server, g) != 0) {
			pthread_mutex_lock(&g->lock);
			g->stopping = true;
			pthread_cond_broadcast(&g->queued);
			pthread_mutex_unlock(&g->lock);
			while (i-- > 0)
				pthread_join(g->servers[i], NULL);
			pthread_join(g->progress, NULL);
			return -EAGAIN;
		}
	g->started = true;
	rs_sources_set_provider(g->sources, &provider, g);
	return 0;
}

void rs_group_leave(rs_group *g)
{
	bool clean = true;

	if (!g->started) {
		g->t->finish(g->t, false);
		g->t = NULL;
		rs_group_free(g);
		return;
	}
	for (int p = 0; p < g->t->size; p++) {
		notice_msg *m = malloc(sizeof(*m));

		if (p != g->t->rank && m) {
			m->magic = MAGIC;
			g->t->send(g->t, p, RS_GROUP_TAG_BYE, m, sizeof(*m));
		} else {
			free(m);
		}
	}
	/* Serve until every peer is done with us, or silent. */
	pthread_mutex_lock(&g->lock);
	for (;;) {
		bool waiting = false;

		for (int p = 0; p < g->t->size; p++)
			if (p != g->t->rank && !g->bye[p] && !g->down[p])
				waiting = true;
		if (!waiting)
			break;
		pthread_cond_wait(&g->changed, &g->lock);
	}
	for (int p = 0; p < g->t->size; p++)
		if (p != g->t->rank && !g->bye[p])
			clean = false;
	g->stopping = true;
	pthread_cond_broadcast(&g->queued);
	pthread_mutex_unlock(&g->lock);
	for (int i = 0; i < SERVERS; i++)
		pthread_join(g->servers[i], NULL);
	pthread_join(g->progress, NULL);
	g->started = false;
	rs_sources_set_provider(g->sources, NULL, NULL);
	g->t->finish(g->t, clean);
	g->t = NULL;
	rs_group_free(g);
}

void rs_group_free(rs_group *g)
{
	if (!g)
		return;
	for (uint32_t i = 0; g->files && i < g->nfiles; i++) {
		group_file *f = &g->files[i];

		if (f->map)
			munmap(f->map, f->size);
		if (f->memfd >= 0)
			close(f->memfd);
		for (uint64_t k = 0; f->ext && k < f->nextents; k++)
			free(f->ext[k].reply);
		free(f->ext);
	}
	free(g->files);
	free(g->queue);
	free(g->heard_ns);
	free(g->down);
	free(g->bye);
	pthread_cond_destroy(&g->queued);
	pthread_cond_destroy(&g->changed);
	pthread_mutex_destroy(&g->lock);
	free(g);
}

void rs_group_get_stats(rs_group *g, rs_group_stats *out)
{
	*out = (rs_group_stats){
		.transport = g->t ? g->t->name : "",
		.rank = g->t ? g->t->rank : 0,
		.size = g->t ? g->t->size : 0,
		.extent_size = RS_GROUP_EXTENT,
		.storage_bytes = atomic_load(&g->st.storage_bytes),
		.storage_reads = atomic_load(&g->st.storage_reads),
		.sent_bytes = atomic_load(&g->st.sent_bytes),
		.received_bytes = atomic_load(&g->st.received_bytes),
		.served = atomic_load(&g->st.served),
		.fetched = atomic_load(&g->st.fetched),
		.prefetched = atomic_load(&g->st.prefetched),
		.timeouts = atomic_load(&g->st.timeouts),
		.bad_checksums = atomic_load(&g->st.bad_checksums),
		.stale_replies = atomic_load(&g->st.stale_replies),
		.peer_down = atomic_load(&g->st.peer_down),
		.evicted = atomic_load(&g->st.evicted),
		.budget = g->budget,
	};
	rs_group_lane_get_stats(g->t, &out->lane);
	pthread_mutex_lock(&g->lock);
	out->resident_bytes = g->resident;
	for (int p = 0; g->t && p < g->t->size; p++)
		out->peers_down += g->down[p];
	pthread_mutex_unlock(&g->lock);
}

/* --- agreeing on the sources at mount --- */

/* A file's path and stamp, hashed: what members compare. */
static uint64_t file_digest(const rs_sources *s, uint32_t i)
{
	const rs_file_id *id = rs_sources_id(s, i);
	const char *path = rs_sources_path(s, i);
	int64_t stamp[5] = { (int64_t)id->size, id->mtime_sec, id->mtime_nsec,
			     id->ctime_sec, id->ctime_nsec };

	return rs_checksum64(path, strlen(path)) ^
	       (rs_checksum64(stamp, sizeof(stamp)) * 0x9E3779B97F4A7C15ull);
}

typedef struct {
	uint32_t ok, nfiles;
	uint64_t digest;
} summary;

/* "0,2,5": the members whose value equals want's. */
static void members_where(char *out, size_t cap, const uint64_t *v, int n,
			  uint64_t want)
{
	size_t used = 0;

	out[0] = 0;
	for (int p = 0; p < n && used + 12 < cap; p++)
		if (v[p] == want)
			used += (size_t)snprintf(out + used, cap - used, "%s%d",
						 used ? "," : "", p);
}

int rs_group_agree(rs_group_transport *t, rs_sources *s,
		   const char *root_path, rs_diag *d)
{
	int n = t->size, err;
	summary me = { s != NULL, s ? rs_sources_count(s) : 0, 0 };
	summary *all = calloc((size_t)n, sizeof(*all));
	uint64_t *v = calloc((size_t)n, sizeof(*v)), *digests = NULL;
	char a[256], b[256];
	int first = -1;

	if (!all || !v) {
		err = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < me.nfiles; i++)
		me.digest = me.digest * 31 + file_digest(s, i);
	err = t->allgather(t, &me, sizeof(me), all);
	if (err)
		goto out;
	for (int p = 0; p < n; p++)
		v[p] = all[p].ok;
	members_where(a, sizeof(a), v, n, 0);
	if (a[0]) {
		rs_diag_add(d, "-o group: member(s) %s could not open the source (their own messages say why); no member mounts", a);
		err = -EINVAL;
		goto out;
	}
	for (int p = 0; p < n; p++)
		v[p] = all[p].nfiles;
	for (int p = 1; p < n; p++)
		if (all[p].nfiles != all[0].nfiles) {
			members_where(a, sizeof(a), v, n, all[0].nfiles);
			members_where(b, sizeof(b), v, n, all[p].nfiles);
			rs_diag_add(d, "-o group: the members see different sources: %u files on member(s) %s, %u on %s; every member must mount the same SOURCE",
				    all[0].nfiles, a, all[p].nfiles, b);
			err = -EINVAL;
			goto out;
		}
	for (int p = 1; p < n && first < 0; p++)
		if (all[p].digest != all[0].digest)
			first = p;
	if (first < 0)
		goto out;
	/* Which file: every member's digest of each, then the first that
	 * differs. */
	digests = calloc((size_t)n * (me.nfiles + 1), sizeof(*digests));
	if (!digests) {
		err = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < me.nfiles; i++)
		digests[(size_t)t->rank * (me.nfiles + 1) + i] =
			file_digest(s, i);
	err = t->allgather(t, digests + (size_t)t->rank * (me.nfiles + 1),
			   (me.nfiles + 1) * sizeof(*digests), digests);
	if (err)
		goto out;
	for (uint32_t i = 0; i < me.nfiles; i++) {
		int other = -1;

		for (int p = 0; p < n; p++) {
			v[p] = digests[(size_t)p * (me.nfiles + 1) + i];
			if (v[p] != v[0] && other < 0)
				other = p;
		}
		if (other < 0)
			continue;
		members_where(a, sizeof(a), v, n, v[0]);
		members_where(b, sizeof(b), v, n, v[other]);
		rs_diag_add(d, "-o group: %s/%s is not the same file on every member (its name, size, mtime or ctime differ): member(s) %s see one, %s another; every member must mount the same SOURCE, unchanged",
			    root_path, rs_sources_path(s, i), a, b);
		err = -EINVAL;
		goto out;
	}
out:
	free(digests);
	free(v);
	free(all);
	return err;
}
