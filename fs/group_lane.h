/* group_lane: extent payloads over a second channel (NCCL), offered and
 * accepted over the group's transport (fs/group.h).
 *
 * Why a handshake: NCCL's point-to-point operations on one communicator
 * complete in the order they were issued on its stream, so members that
 * each post sends and receives as requests arrive can wait on one another
 * in a cycle (docs/ARCHITECTURE.md spells one out).  Here every member has
 * one slot, and a payload moves on the lane only when both ends have
 * reserved theirs for each other:
 *
 *   owner: the reply's payload is ready, its slot free -> reserve it,
 *          send OFFER(id, len) over the transport; slot busy -> send the
 *          reply over the transport, as without a lane.
 *   asker: OFFER arrives, slot free -> reserve it, post the receive, send
 *          ACCEPT(id); slot busy or lane down -> send DECLINE(id).
 *   owner: ACCEPT -> post the send; DECLINE -> send the reply over the
 *          transport and free the slot.
 *
 * So each lane holds at most one posted operation, matched by the peer's
 * one, and nothing waits on a third member.  An offer unanswered for the
 * group timeout goes over the transport.  A posted operation older than
 * that, or one that fails, ends the lane on this member for good (the
 * channel is aborted; an unsent payload goes over the transport): the
 * member goes on over the transport alone, and whatever reply was lost is
 * covered by the group's own timeout (it reads the extent from storage).  Offers to a member whose lane has ended are
 * declined, so the others go on over the transport with it too.
 *
 * The lane wrapper is itself a rs_group_transport: the group never sees
 * offers, only replies, which arrive through poll whichever way they
 * came.  Small messages (requests, heartbeats, goodbyes, refusals) always
 * go over the transport.
 *
 * Errors: 0 or a negative errno.  Thread safety: as the transport's.
 */
#ifndef RS_GROUP_LANE_H
#define RS_GROUP_LANE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fs/group.h"

/* Replies smaller than this go over the transport: an offer's round trip
 * costs more than the lane saves. */
#define RS_GROUP_LANE_MIN (256u << 10)

/* Tags of the handshake, after the group's own (fs/group.h). */
enum {
	RS_GROUP_TAG_OFFER = 16,
	RS_GROUP_TAG_ACCEPT,
	RS_GROUP_TAG_DECLINE,
};

/* A channel that moves one payload at a time between two members.  Only
 * the lane wrapper calls these, under its lock. */
typedef struct rs_group_lane rs_group_lane;
struct rs_group_lane {
	const char *name;           /* "nccl" */
	size_t max_len;             /* the largest payload it takes */
	/* Posts the send of buf (len bytes; buf stays valid until test
	 * says done) to peer. */
	int (*post_send)(rs_group_lane *l, int peer, const void *buf,
			 size_t len);
	/* Posts the receive of len bytes from peer. */
	int (*post_recv)(rs_group_lane *l, int peer, size_t len);
	/* The posted operation: 1 done (for a receive, *buf is the bytes,
	 * malloc'd, the caller's), 0 not yet, -errno failed. */
	int (*test)(rs_group_lane *l, void **buf);
	/* Gives up what is posted; the lane takes nothing more. */
	void (*abort)(rs_group_lane *l);
	/* Gives up what is posted, and frees the lane. */
	void (*free)(rs_group_lane *l);
};

/* What -o group_nccl= asks (fs/main.c gives a device under auto only
 * to executor=cuda). */
typedef enum {
	RS_GROUP_NCCL_AUTO = 0,     /* where every member can */
	RS_GROUP_NCCL_ON,           /* every member must, or the mount fails */
	RS_GROUP_NCCL_OFF,
} rs_group_nccl_mode;

/* Collective, every member at once, after the executor has started:
 * decides whether the group's payloads go over NCCL, and if so makes the
 * lane and wraps *t in it.  device: this member's CUDA device, or -1 when
 * its executor has none ready.  The lane is used when every member can
 * (a device, and libnccl found at run time) and none said off.  0 with
 * *t wrapped or as it was; -ENODEV with one line in d, the same on every
 * member, when a member asked for on and it cannot be. */
int rs_group_lane_setup(rs_group_transport **t, rs_group_nccl_mode mode,
			int device, unsigned timeout_ms, rs_diag *d);

/* The lane wrapper's counts; zeros and name "" for a bare transport. */
void rs_group_lane_get_stats(rs_group_transport *t, rs_group_lane_stats *out);

/* The NCCL lane (fs/group_nccl.c): collective over t, which bootstraps
 * it (an ncclUniqueId from member 0 through allgather).  -ENOTSUP with a
 * line in d where this build has no NCCL or libnccl does not load.
 * The test build (reshardfs-testhooks) compiles it against tests/nccl_emu:
 * an emulated device 0 and, from RESHARDFS_TEST_NCCL_LIB, a stand-in
 * libnccl with NCCL's stream order, so the lane runs without GPUs. */
int rs_group_lane_nccl(rs_group_lane **out, rs_group_transport *t,
		       int device, unsigned timeout_ms, rs_diag *d);
/* Whether rs_group_lane_nccl can be tried here: built, and libnccl
 * loads.  Not collective. */
bool rs_group_lane_nccl_available(void);

#endif
