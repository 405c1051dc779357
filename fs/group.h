/* group: the daemons of one job read each source byte once (-o group=).
 *
 * The members of a group (one daemon per node, started by the job's
 * launcher: mpirun, srun) mount the same SOURCE.  Every source file is
 * cut into extents of RS_GROUP_EXTENT bytes, and extent k of source file
 * f is owned by member (f + k) mod size: a stripe every member computes
 * alike from the source table, which the members agree on at mount
 * (rs_group_agree).  A member that needs an extent it owns reads it from
 * storage, once, and keeps it; for any other extent it asks the owner,
 * which sends the bytes with the file's stamp (size, mtime, ctime) and a
 * checksum.  An owner that serves an extent reads its next owned extent
 * of the file ahead.
 *
 * The extents a member holds live in one memfd per source file, at the
 * file's own offsets: the group is the source table's provider
 * (planner/source.h), so the executors read them as they read sources.
 * Extents in use are pinned; beyond the budget, unpinned ones are
 * dropped (clock order) and fetched again when needed.
 *
 * The guarantee of a single daemon holds: an extent from a peer is used
 * only when its stamp is the one recorded here and its checksum matches;
 * a peer that does not answer within the timeout, is silent for that
 * long, or sends a bad reply is bypassed (the member reads the extent
 * from storage itself, and the stats count it); reads never wait on a
 * peer past the timeout.  Every gather still checks its sources before
 * and after (fs/blocks.h), so a changed source gives -ESTALE on every
 * member.
 *
 * The transport (how members pass messages) is a table of functions:
 * MPI (fs/group_mpi.c) where the build found it, wrapped where GPUs are in
 * a lane that moves the payloads over NCCL (fs/group_lane.h).
 *
 * Errors: 0 or a negative errno.  Thread safety: rs_group_acquire,
 * rs_group_release, rs_group_data_fd and rs_group_get_stats from any
 * thread; the rest from the thread that created the group.
 */
#ifndef RS_GROUP_H
#define RS_GROUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "planner/diag.h"
#include "planner/source.h"

#define RS_GROUP_EXTENT (4ull << 20)
#define RS_GROUP_DEFAULT_TIMEOUT_MS 10000u

/* Message tags. */
enum {
	RS_GROUP_TAG_REQUEST = 1,
	RS_GROUP_TAG_REPLY,
	RS_GROUP_TAG_HEARTBEAT,
	RS_GROUP_TAG_BYE,
};

/* How members pass messages.  Every function may be called from any
 * thread (the transport serialises what it must). */
typedef struct rs_group_transport rs_group_transport;
struct rs_group_transport {
	const char *name;           /* "mpi" */
	int rank, size;
	/* Queues buf (malloc'd, len bytes) for `peer` under `tag`; the
	 * transport frees it once sent.  Never blocks on the peer. */
	int (*send)(rs_group_transport *t, int peer, int tag, void *buf,
		    size_t len);
	/* One message that has arrived: 1 with *buf (malloc'd; the caller
	 * frees it), *len, *peer and *tag; 0 when none has; -errno. */
	int (*poll)(rs_group_transport *t, int *peer, int *tag, void **buf,
		    size_t *len);
	/* Collective, every member at once: each member's `len` bytes,
	 * concatenated in rank order into out (size * len bytes). */
	int (*allgather)(rs_group_transport *t, const void *in, size_t len,
			 void *out);
	/* Ends the transport and frees t.  clean: every peer said goodbye
	 * (MPI_Finalize then; without, sends to silent peers are dropped
	 * and the process exits without waiting on them). */
	void (*finish)(rs_group_transport *t, bool clean);
};

/* Joins the job's group over MPI (MPI_Init_thread).  -ENOTSUP with a line
 * in d when this build has no MPI, saying what to install. */
int rs_group_transport_mpi(rs_group_transport **out, rs_diag *d);

/* Whether this build has the MPI transport. */
bool rs_group_mpi_built(void);

/* The group's NCCL lane (fs/group_lane.h), as the stats file shows it. */
typedef struct {
	const char *name;           /* "nccl", "" without a lane */
	bool ended;                 /* failed or timed out: transport only */
	uint64_t sent_bytes, received_bytes;    /* payloads that went on it */
	uint64_t declined;          /* offers that went over the transport */
} rs_group_lane_stats;

typedef struct {
	const char *transport;
	int rank, size;
	uint64_t extent_size;
	uint64_t storage_bytes, storage_reads;  /* read from SOURCE here */
	uint64_t sent_bytes, received_bytes;    /* extent bytes to / from peers */
	uint64_t served;                        /* requests served for peers */
	uint64_t fetched;                       /* extents received from peers */
	uint64_t prefetched;                    /* owned extents read ahead */
	/* Extents read from storage instead of from their owner: */
	uint64_t timeouts;                      /* no answer in time */
	uint64_t bad_checksums;                 /* the bytes did not match */
	uint64_t stale_replies;                 /* another stamp, or the owner failed */
	uint64_t peer_down;                     /* the owner was silent */
	uint64_t evicted;                       /* extents dropped over budget */
	uint64_t resident_bytes, budget;
	unsigned peers_down;
	rs_group_lane_stats lane;
} rs_group_stats;

typedef struct rs_group rs_group;

/* Makes the group state over transport t (which it then owns) for the
 * sources of one mount, which must all be added: memfds, the stripe, the
 * stats.  budget: the bytes of extents kept (at least a few extents are
 * always allowed); timeout_ms: how long a read waits on a peer.
 * Starts nothing. */
int rs_group_new(rs_group **out, rs_group_transport *t, rs_sources *s,
		 uint64_t budget, unsigned timeout_ms);

/* Collective, before rs_group_new: the members compare their source
 * tables (every file's path, size, mtime and ctime; s NULL: this member
 * could not open its source).  0 when all agree; else -EINVAL with one
 * line in d, the same on every member, naming the first file that
 * differs (under this member's root_path) and which members see it which
 * way, or the members that could not open theirs. */
int rs_group_agree(rs_group_transport *t, rs_sources *s,
		   const char *root_path, rs_diag *d);

/* Starts the group's threads and makes it the provider of its sources. */
int rs_group_start(rs_group *g);

/* After the last read of this member: tells the peers, serves them until
 * each has said the same (or gone silent), then stops and frees
 * everything, the transport included.  Of a group never started: ends
 * the transport and frees it. */
void rs_group_leave(rs_group *g);

/* Frees a group that was never started (a refused mount). */
void rs_group_free(rs_group *g);

void rs_group_get_stats(rs_group *g, rs_group_stats *out);

#endif
