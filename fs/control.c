/* Introspection: the stats file and the user.reshardfs.sources xattr. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs/fs.h"
#include "fs/group.h"
#include "planner/array.h"

/* xattr values are limited to 64 KiB by the kernel. */
#define XATTR_MAX (64u << 10)

/* "executor_stats": what each backend built, and AUTO's current pick
 * per kind of work.  Malloc'd. */
static char *executor_json(rs_fs *fs)
{
	rs_executor_stats es;
	char *out = NULL;

	rs_executor_get_stats(fs->blocks.exec, &es);
	for (char *c = es.cuda_status; *c; c++)
		if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
			*c = '\'';   /* keep the JSON valid */
	if (asprintf(&out,
		     "{\n"
		     "    \"cuda_built\": %s,\n"
		     "    \"cuda_usable\": %s,\n"
		     "    \"cuda_status\": \"%s\",\n"
		     "    \"cpu\": {\"jobs\": %llu, \"bytes\": %llu, \"seconds\": %.6f},\n"
		     "    \"cuda\": {\"jobs\": %llu, \"bytes\": %llu, \"seconds\": %.6f},\n"
		     "    \"cuda_fallbacks\": %llu,\n"
		     "    \"cuda_transfer\": {\"h2d_bytes\": %llu, \"h2d_seconds\": %.6f, \"d2h_bytes\": %llu, \"d2h_seconds\": %.6f},\n"
		     "    \"choice\": {\"runs\": \"%s\", \"strided\": \"%s\", \"cast\": \"%s\"}\n"
		     "  }",
		     es.cuda_built ? "true" : "false",
		     es.cuda_usable ? "true" : "false", es.cuda_status,
		     (unsigned long long)es.cpu.jobs,
		     (unsigned long long)es.cpu.bytes, es.cpu.ns / 1e9,
		     (unsigned long long)es.cuda.jobs,
		     (unsigned long long)es.cuda.bytes, es.cuda.ns / 1e9,
		     (unsigned long long)es.cuda_fallbacks,
		     (unsigned long long)es.h2d_bytes, es.h2d_ns / 1e9,
		     (unsigned long long)es.d2h_bytes, es.d2h_ns / 1e9,
		     es.choice[RS_WORK_RUNS], es.choice[RS_WORK_STRIDED],
		     es.choice[RS_WORK_CAST]) < 0)
		return NULL;
	return out;
}

/* "group": this member's part in the read-once group (fs/group.h), or
 * null without one.  Malloc'd. */
static char *group_json(rs_fs *fs)
{
	rs_group_stats g;
	char *out = NULL;

	if (!fs->group)
		return strdup("null");
	rs_group_get_stats(fs->group, &g);
	if (asprintf(&out,
		     "{\n"
		     "    \"transport\": \"%s\",\n"
		     "    \"member\": %d,\n"
		     "    \"members\": %d,\n"
		     "    \"extent_size\": %llu,\n"
		     "    \"storage_bytes\": %llu,\n"
		     "    \"storage_reads\": %llu,\n"
		     "    \"sent_bytes\": %llu,\n"
		     "    \"received_bytes\": %llu,\n"
		     "    \"requests_served\": %llu,\n"
		     "    \"extents_fetched\": %llu,\n"
		     "    \"extents_prefetched\": %llu,\n"
		     "    \"bypassed\": {\"timeouts\": %llu, \"bad_checksums\": %llu, \"stale_replies\": %llu, \"peer_down\": %llu},\n"
		     "    \"evicted\": %llu,\n"
		     "    \"resident_bytes\": %llu,\n"
		     "    \"budget\": %llu,\n"
		     "    \"peers_down\": %u,\n"
		     "    \"lane\": %s%s%s,\n"
		     "    \"lane_ended\": %s,\n"
		     "    \"lane_sent_bytes\": %llu,\n"
		     "    \"lane_received_bytes\": %llu,\n"
		     "    \"lane_declined\": %llu\n"
		     "  }",
		     g.transport, g.rank, g.size,
		     (unsigned long long)g.extent_size,
		     (unsigned long long)g.storage_bytes,
		     (unsigned long long)g.storage_reads,
		     (unsigned long long)g.sent_bytes,
		     (unsigned long long)g.received_bytes,
		     (unsigned long long)g.served,
		     (unsigned long long)g.fetched,
		     (unsigned long long)g.prefetched,
		     (unsigned long long)g.timeouts,
		     (unsigned long long)g.bad_checksums,
		     (unsigned long long)g.stale_replies,
		     (unsigned long long)g.peer_down,
		     (unsigned long long)g.evicted,
		     (unsigned long long)g.resident_bytes,
		     (unsigned long long)g.budget, g.peers_down,
		     g.lane.name[0] ? "\"" : "",
		     g.lane.name[0] ? g.lane.name : "null",
		     g.lane.name[0] ? "\"" : "", g.lane.ended ? "true" : "false",
		     (unsigned long long)g.lane.sent_bytes,
		     (unsigned long long)g.lane.received_bytes,
		     (unsigned long long)g.lane.declined) < 0)
		return NULL;
	return out;
}

char *rs_fs_stats_json(rs_fs *fs, size_t *len)
{
	rs_cache_stats cs;
	char *out = NULL, *exec = executor_json(fs);
	char *pt = rs_passthrough_stats_json(fs->pt);
	char *group = group_json(fs);
	int n;

	if (!exec || !pt || !group) {
		free(exec);
		free(pt);
		free(group);
		return NULL;
	}
	rs_cache_get_stats(fs->blocks.cache, &cs);
	n = asprintf(&out,
		     "{\n"
		     "  \"bytes_served\": %llu,\n"
		     "  \"source_bytes_read\": %llu,\n"
		     "  \"reads\": %llu,\n"
		     "  \"read_errors\": %llu,\n"
		     "  \"cache_hits\": %llu,\n"
		     "  \"cache_misses\": %llu,\n"
		     "  \"cache_bytes\": %llu,\n"
		     "  \"cache_budget\": %llu,\n"
		     "  \"cache_charged\": %llu,\n"
		     "  \"cache_blocks\": %llu,\n"
		     "  \"cache_cold_blocks\": %llu,\n"
		     "  \"cache_evictions\": %llu,\n"
		     "  \"prefetch_blocks\": %llu,\n"
		     "  \"executor\": \"%s\",\n"
		     "  \"executor_stats\": %s,\n"
		     "  \"passthrough\": %s,\n"
		     "  \"group\": %s,\n"
		     "  \"dtype\": \"%s\",\n"
		     "  \"format\": \"%s\",\n"
		     "  \"view_format\": \"%s\",\n"
		     "  \"source_tp\": %u,\n"
		     "  \"tp\": %u,\n"
		     "  \"pp\": %u,\n"
		     "  \"files\": %u,\n"
		     "  \"source_files\": %u\n"
		     "}\n",
		     (unsigned long long)atomic_load(&fs->bytes_served),
		     (unsigned long long)rs_sources_bytes_read(fs->ck.sources),
		     (unsigned long long)atomic_load(&fs->reads),
		     (unsigned long long)atomic_load(&fs->read_errors),
		     (unsigned long long)cs.hits, (unsigned long long)cs.misses,
		     (unsigned long long)cs.bytes, (unsigned long long)cs.budget,
		     (unsigned long long)cs.charged,
		     (unsigned long long)cs.blocks,
		     (unsigned long long)cs.cold_blocks,
		     (unsigned long long)cs.evictions,
		     (unsigned long long)rs_prefetch_blocks(fs->prefetch),
		     rs_executor_name(fs->blocks.exec), exec, pt, group,
		     fs->layout.dtype ? rs_dtype_name(fs->layout.dtype) : "stored",
		     fs->ck.format->name,
		     fs->view_format->name,
		     fs->layout.src_tp, fs->layout.tp, fs->layout.pp,
		     fs->tree.count, rs_sources_count(fs->ck.sources));
	free(exec);
	free(pt);
	free(group);
	if (n < 0)
		return NULL;
	*len = (size_t)n;
	return out;
}

typedef struct {
	char *buf;
	size_t len, cap;
	bool overflow;
} text;

static void put_line(text *t, const char *path, uint64_t off, uint64_t len,
		     uint64_t count, uint64_t stride)
{
	char line[4200];
	int n;

	if (count > 1)
		n = snprintf(line, sizeof(line), "%s %llu %llu x%llu stride %llu\n",
			     path, (unsigned long long)off,
			     (unsigned long long)len, (unsigned long long)count,
			     (unsigned long long)stride);
	else
		n = snprintf(line, sizeof(line), "%s %llu %llu\n", path,
			     (unsigned long long)off, (unsigned long long)len);
	if (n < 0 || (size_t)n >= sizeof(line) || t->len + (size_t)n > XATTR_MAX) {
		t->overflow = true;
		return;
	}
	if (rs_array_reserve(&t->buf, &t->cap, t->len + (size_t)n, 1)) {
		t->overflow = true;
		return;
	}
	memcpy(t->buf + t->len, line, (size_t)n);
	t->len += (size_t)n;
}

/* One line per source byte range: "path offset length", with
 * " xCOUNT stride S" for strided rows. */
int rs_fs_sources_xattr(rs_fs *fs, const rs_vnode *n, char **out,
			size_t *len)
{
	text t = { 0 };

	for (uint32_t i = 0; i < n->nsegs && !t.overflow; i++) {
		const rs_segment *s = &n->segs[i];

		if (s->kind == RS_SEG_SOURCE) {
			put_line(&t, rs_sources_path(fs->ck.sources, s->u.source.index),
				 s->u.source.offset, s->length, 1, 0);
		} else if (s->kind == RS_SEG_TENSOR) {
			const rs_plan *p = &s->u.tensor.chunk->plan;

			for (size_t k = 0; k < p->count && !t.overflow; k++)
				put_line(&t, rs_sources_path(fs->ck.sources, p->ops[k].source),
					 p->ops[k].src_off, p->ops[k].len,
					 p->ops[k].count, p->ops[k].src_stride);
		}
	}
	if (t.overflow) {
		free(t.buf);
		return -E2BIG;
	}
	*out = t.buf;
	*len = t.len;
	return 0;
}
