/* The lane wrapper: offers, accepts and declines over the transport,
 * payloads over the lane; and the mount-time choice of a lane.  See
 * group_lane.h. */
#include "fs/group_lane.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs/clock.h"
#include "fs/log.h"

#define LANE_MAGIC 0x72736c6eu   /* "rsln" */

typedef struct {
	uint32_t magic, id;
	uint64_t len;
} lane_msg;

enum slot { FREE = 0, OFFERED, SENDING, RECEIVING };

typedef struct {
	rs_group_transport pub;
	rs_group_transport *inner;
	rs_group_lane *lane;
	uint64_t timeout_ns;

	pthread_mutex_t lock;   /* everything below, and every lane call */
	enum slot slot;
	int peer;               /* the other end of the slot */
	uint32_t id, next_id;
	uint64_t since_ns;      /* when the slot took its state */
	void *payload;          /* OFFERED, SENDING: the reply, ours */
	size_t len;
	rs_group_lane_stats st;
} lane_transport;

static int send_ctl(lane_transport *w, int peer, int tag, uint32_t id,
		    uint64_t len)
{
	lane_msg *m = malloc(sizeof(*m));

	if (!m)
		return -ENOMEM;
	*m = (lane_msg){ LANE_MAGIC, id, len };
	return w->inner->send(w->inner, peer, tag, m, sizeof(*m));
}

/* The slot's payload goes over the transport instead.  Under the lock. */
static void send_over_transport(lane_transport *w)
{
	void *p = w->payload;

	w->payload = NULL;
	w->slot = FREE;
	if (p)
		w->inner->send(w->inner, w->peer, RS_GROUP_TAG_REPLY, p, w->len);
}

/* The lane failed or a peer kept it too long: no more lane on this
 * member.  Under the lock. */
static void end_lane(lane_transport *w, const char *why)
{
	if (w->st.ended)
		return;
	w->st.ended = true;
	if (w->slot == SENDING || w->slot == RECEIVING)
		w->lane->abort(w->lane);
	rs_log(RS_LOG_ERROR, "group: the %s lane with member %d %s; extents go over %s from now on",
	       w->lane->name, w->peer, why, w->inner->name);
	if (w->slot == OFFERED || w->slot == SENDING)
		send_over_transport(w);
	w->slot = FREE;
}

static int lane_send(rs_group_transport *t, int peer, int tag, void *buf,
		     size_t len)
{
	lane_transport *w = (lane_transport *)t;
	uint32_t id;
	int err;

	pthread_mutex_lock(&w->lock);
	if (w->st.ended || tag != RS_GROUP_TAG_REPLY || peer == t->rank ||
	    len < RS_GROUP_LANE_MIN || len > w->lane->max_len ||
	    w->slot != FREE) {
		pthread_mutex_unlock(&w->lock);
		return w->inner->send(w->inner, peer, tag, buf, len);
	}
	id = ++w->next_id;
	w->slot = OFFERED;
	w->peer = peer;
	w->id = id;
	w->payload = buf;
	w->len = len;
	w->since_ns = rs_now_ns();
	err = send_ctl(w, peer, RS_GROUP_TAG_OFFER, id, len);
	if (err)
		send_over_transport(w);
	pthread_mutex_unlock(&w->lock);
	return 0;
}

/* Moves the slot along: a posted operation done, failed or too old, an
 * offer unanswered too long.  1 with a payload received (*buf, *len,
 * *peer); else 0.  Under the lock. */
static int advance(lane_transport *w, int *peer, void **buf, size_t *len)
{
	uint64_t age = rs_now_ns() - w->since_ns;
	void *got = NULL;
	int r;

	if (w->slot == OFFERED && age > w->timeout_ns) {
		/* The peer may still post a receive and answer late; it then
		 * times out on its own and ends its lane. */
		send_over_transport(w);
		return 0;
	}
	if (w->slot != SENDING && w->slot != RECEIVING)
		return 0;
	r = w->lane->test(w->lane, &got);
	if (r < 0) {
		end_lane(w, "failed");
		return 0;
	}
	if (r == 0) {
		if (age > w->timeout_ns)
			end_lane(w, "did not complete within the group timeout");
		return 0;
	}
	if (w->slot == SENDING) {
		w->st.sent_bytes += w->len;
		free(w->payload);
		w->payload = NULL;
		w->slot = FREE;
		return 0;
	}
	w->st.received_bytes += w->len;
	w->slot = FREE;
	*peer = w->peer;
	*buf = got;
	*len = w->len;
	return 1;
}

/* A handshake message.  Under the lock. */
static void on_ctl(lane_transport *w, int peer, int tag, const lane_msg *m)
{
	if (tag == RS_GROUP_TAG_OFFER) {
		if (w->st.ended || w->slot != FREE || m->len > w->lane->max_len ||
		    m->len < RS_GROUP_LANE_MIN) {
			send_ctl(w, peer, RS_GROUP_TAG_DECLINE, m->id, 0);
			return;
		}
		w->peer = peer;
		w->len = (size_t)m->len;
		if (w->lane->post_recv(w->lane, peer, w->len) != 0) {
			end_lane(w, "failed");
			send_ctl(w, peer, RS_GROUP_TAG_DECLINE, m->id, 0);
			return;
		}
		w->slot = RECEIVING;
		w->id = m->id;
		w->since_ns = rs_now_ns();
		send_ctl(w, peer, RS_GROUP_TAG_ACCEPT, m->id, 0);
		return;
	}
	/* An answer to our offer; a late one (the offer timed out) is
	 * dropped. */
	if (w->slot != OFFERED || w->peer != peer || w->id != m->id)
		return;
	if (tag == RS_GROUP_TAG_DECLINE) {
		w->st.declined++;
		send_over_transport(w);
		return;
	}
	if (w->lane->post_send(w->lane, peer, w->payload, w->len) != 0) {
		end_lane(w, "failed");
		return;
	}
	w->slot = SENDING;
	w->since_ns = rs_now_ns();
}

static int lane_poll(rs_group_transport *t, int *peer, int *tag, void **buf,
		     size_t *len)
{
	lane_transport *w = (lane_transport *)t;

	/* Handshake messages are taken here; a bounded number per call, so
	 * the group's progress thread keeps its beat. */
	for (int i = 0; i < 64; i++) {
		int got;

		pthread_mutex_lock(&w->lock);
		got = advance(w, peer, buf, len);
		pthread_mutex_unlock(&w->lock);
		if (got) {
			*tag = RS_GROUP_TAG_REPLY;
			return 1;
		}
		got = w->inner->poll(w->inner, peer, tag, buf, len);
		if (got != 1)
			return got;
		if (*tag != RS_GROUP_TAG_OFFER && *tag != RS_GROUP_TAG_ACCEPT &&
		    *tag != RS_GROUP_TAG_DECLINE)
			return 1;
		pthread_mutex_lock(&w->lock);
		if (*len == sizeof(lane_msg) &&
		    ((lane_msg *)*buf)->magic == LANE_MAGIC && *peer >= 0 &&
		    *peer < t->size && *peer != t->rank)
			on_ctl(w, *peer, *tag, *buf);
		pthread_mutex_unlock(&w->lock);
		free(*buf);
	}
	return 0;
}

static int lane_allgather(rs_group_transport *t, const void *in, size_t len,
			  void *out)
{
	lane_transport *w = (lane_transport *)t;

	return w->inner->allgather(w->inner, in, len, out);
}

static void lane_finish(rs_group_transport *t, bool clean)
{
	lane_transport *w = (lane_transport *)t;

	pthread_mutex_lock(&w->lock);
	free(w->payload);
	w->lane->free(w->lane);
	pthread_mutex_unlock(&w->lock);
	pthread_mutex_destroy(&w->lock);
	w->inner->finish(w->inner, clean);
	free(w);
}

static int wrap(rs_group_transport **t, rs_group_lane *lane,
		unsigned timeout_ms)
{
	lane_transport *w = calloc(1, sizeof(*w));

	if (!w)
		return -ENOMEM;
	w->inner = *t;
	w->lane = lane;
	w->timeout_ns = (uint64_t)timeout_ms * 1000000ull;
	w->st.name = lane->name;
	pthread_mutex_init(&w->lock, NULL);
	w->pub = (rs_group_transport){ (*t)->name, (*t)->rank, (*t)->size,
				       lane_send, lane_poll, lane_allgather,
				       lane_finish };
	*t = &w->pub;
	return 0;
}

void rs_group_lane_get_stats(rs_group_transport *t, rs_group_lane_stats *out)
{
	lane_transport *w = (lane_transport *)t;

	if (!t || t->send != lane_send) {
		*out = (rs_group_lane_stats){ .name = "" };
		return;
	}
	pthread_mutex_lock(&w->lock);
	*out = w->st;
	pthread_mutex_unlock(&w->lock);
}

/* --- the mount-time choice --- */

typedef struct {
	int32_t mode, able;
} lane_vote;

/* "member 1" or "members 1, 3": those whose vote `bad` picks, into buf;
 * returns how many. */
static int list_members(const lane_vote *v, int n, bool (*bad)(lane_vote),
			char *buf, size_t cap)
{
	size_t at = 0;
	int count = 0;

	for (int i = 0; i < n; i++)
		count += bad(v[i]);
	at += (size_t)snprintf(buf, cap, "member%s", count == 1 ? "" : "s");
	for (int i = 0, k = 0; i < n && at < cap; i++)
		if (bad(v[i]))
			at += (size_t)snprintf(buf + at, cap - at, "%s %d",
					       k++ ? "," : "", i);
	return count;
}

static bool vote_unable(lane_vote v)
{
	return !v.able;
}

static bool vote_off(lane_vote v)
{
	return v.mode == RS_GROUP_NCCL_OFF;
}

/* The test build's emulated GPU (tests/nccl_emu) stands in for a CUDA
 * device wherever its stand-in libnccl is given. */
static int lane_device(int device)
{
#ifdef RS_GROUP_TEST_HOOKS
	if (device < 0 && getenv("RESHARDFS_TEST_NCCL_LIB"))
		return 0;
#endif
	return device;
}

int rs_group_lane_setup(rs_group_transport **t, rs_group_nccl_mode mode,
			int device, unsigned timeout_ms, rs_diag *d)
{
	rs_group_transport *tr = *t;
	lane_vote mine, *all;
	rs_group_lane *lane = NULL;
	rs_diag *why;
	bool any_on = false, use = true;
	int32_t made, *made_all = NULL;
	char who[256];
	int err, n;

	device = lane_device(device);
	mine = (lane_vote){ (int32_t)mode,
			    device >= 0 && rs_group_lane_nccl_available() };
	all = calloc((size_t)tr->size, sizeof(*all));
	if (!all)
		return -ENOMEM;
	err = tr->allgather(tr, &mine, sizeof(mine), all);
	if (err)
		goto out;
	for (int i = 0; i < tr->size; i++) {
		any_on |= all[i].mode == RS_GROUP_NCCL_ON;
		use &= all[i].able && all[i].mode != RS_GROUP_NCCL_OFF;
	}
	if (!use) {
		if (!any_on)
			goto out;
		if (list_members(all, tr->size, vote_off, who, sizeof(who))) {
			rs_diag_add(d, "-o group_nccl=on: %s said group_nccl=off", who);
		} else {
			n = list_members(all, tr->size, vote_unable, who,
					 sizeof(who));
			rs_diag_add(d, "-o group_nccl=on: %s %s no CUDA device in use, or no libnccl.so.2 (reshardfs --version says whether this build has the NCCL lane)",
				    who, n == 1 ? "has" : "have");
		}
		err = -ENODEV;
		goto out;
	}
	/* Every member makes its lane, then all learn whether every one
	 * did. */
	why = rs_diag_new();
	made = why && rs_group_lane_nccl(&lane, tr, device, timeout_ms,
					 why) == 0;
	if (!made)
		rs_log(RS_LOG_ERROR, "%s", why && rs_diag_line(why, 0)
			       ? rs_diag_line(why, 0) : "group: cannot make the NCCL lane");
	rs_diag_free(why);
	made_all = calloc((size_t)tr->size, sizeof(*made_all));
	err = made_all ? tr->allgather(tr, &made, sizeof(made), made_all)
		       : -ENOMEM;
	if (err)
		goto out_lane;
	for (int i = 0; i < tr->size; i++)
		if (!made_all[i]) {
			rs_log(RS_LOG_ERROR, "group: member %d could not start its NCCL lane; extents go over %s",
			       i, tr->name);
			if (any_on) {
				rs_diag_add(d, "-o group_nccl=on: member %d could not start NCCL (its log says why)", i);
				err = -ENODEV;
			}
			goto out_lane;
		}
	err = wrap(t, lane, timeout_ms);
	if (err)
		goto out_lane;
	rs_log(RS_LOG_INFO, "group: extent payloads over %s (device %d)",
	       lane->name, device);
	goto out;
out_lane:
	if (lane)
		lane->free(lane);
out:
	free(made_all);
	free(all);
	return err;
}
